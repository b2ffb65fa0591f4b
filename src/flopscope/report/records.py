"""What a :class:`~flopscope.report.report.Report` is made of, and what its queries return: one
record per (module, operator, phase), per collective kind and per ruled module, and the sums the
breakdowns hand back. Plain frozen values; :mod:`flopscope.report.report` re-exports every name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Protocol, cast

from flopscope.core.params import ParamStats
from flopscope.cost import Cost, Phase
from flopscope.errors import UsageError

__all__ = ["CommRecord", "CommStats", "Located", "ModuleStats", "OpRecord", "OpStats",
           "RuleRecord", "as_phase", "is_within", "op_record", "sum_costs"]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """Calls of one operator in one module in one phase, and what they cost together."""

    module: str
    op: str
    phase: Phase
    calls: int
    cost: Cost
    counted: bool = True
    decomposed: bool = False  # counted as the sum of its decomposition's pieces


# A report makes one record per (module, operator, phase). The frozen dataclass's __init__ sets
# each field through object.__setattr__ (a generic attribute lookup per field); op_record instead
# fills a twin class with the same slots in the same order (plain slot stores, which the
# interpreter does inline) and then makes the object an OpRecord (``__class__`` assignment, which
# CPython allows between classes of the same layout): the same record, about 0.3 us instead of
# 0.55 us (1.1 us through OpRecord(...)).
_OP_FIELDS = ("module", "op", "phase", "calls", "cost", "counted", "decomposed")
assert tuple(f.name for f in fields(OpRecord)) == _OP_FIELDS  # op_record sets each


class _OpRecordTwin:
    """OpRecord's slots, writable: filled, then turned into an :class:`OpRecord`."""

    __slots__ = _OP_FIELDS

    def __init__(self, module: str, op: str, phase: Phase, calls: int, cost: Cost,
                 counted: bool, decomposed: bool) -> None:
        self.module = module
        self.op = op
        self.phase = phase
        self.calls = calls
        self.cost = cost
        self.counted = counted
        self.decomposed = decomposed
        self.__class__ = OpRecord  # type: ignore[assignment]


#: ``op_record(module, op, phase, calls, cost, counted, decomposed)``: ``OpRecord(...)`` with every
#: field given, made faster (the twin itself: no call in between)
op_record = cast("Callable[[str, str, Phase, int, Cost, bool, bool], OpRecord]", _OpRecordTwin)


@dataclass(frozen=True, slots=True)
class CommRecord:
    """Calls of one kind of collective over one process group, issued by one module in one
    phase, and what they sent per rank together (conventions: :mod:`flopscope.rules.collectives`).

    Attributes:
        module: module path that issued the calls.
        phase: the phase they ran in.
        kind: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``,
            ``reduce``, ``gather``, ``scatter``, ``send``, ``recv`` or ``barrier``.
        group_size: ranks in the process group.
        calls: number of calls.
        payload_bytes: bytes per rank, summed over the calls (NCCL tests' "size").
        bus_bytes: ring-algorithm bytes per rank, summed over the calls.
        group: which process group: the device-mesh dimension it is (``tp``, ``dp``, ``pp``,
            ``ep`` ...: a mesh's group is described ``mesh_<name>``), ``world`` for the default
            group, the group's own description otherwise; ``""`` where not recorded (a report
            read from an older JSON).
    """

    module: str
    phase: Phase
    kind: str
    group_size: int
    calls: int
    payload_bytes: int
    bus_bytes: int
    group: str = ""

    @property
    def group_key(self) -> tuple[int, str]:
        """``(group_size, group)``: what tells two records' groups apart."""
        return self.group_size, self.group


@dataclass(frozen=True, slots=True)
class CommStats:
    """Calls, payload bytes and bus bytes of one collective kind (or all of them)."""

    calls: int = 0
    payload_bytes: int = 0
    bus_bytes: int = 0

    def __add__(self, other: CommStats) -> CommStats:
        return CommStats(self.calls + other.calls, self.payload_bytes + other.payload_bytes,
                         self.bus_bytes + other.bus_bytes)

    def to_dict(self) -> dict[str, int]:
        """The three integers by name."""
        return {"calls": self.calls, "payload_bytes": self.payload_bytes,
                "bus_bytes": self.bus_bytes}


@dataclass(frozen=True, slots=True)
class RuleRecord:
    """A module costed as a whole by a module rule, beside what its operators measured."""

    module: str
    rule: str
    calls: int
    cost: Cost
    shadowed: Cost
    macs_only: bool = False

    @property
    def differs(self) -> bool:
        """True when the rule disagrees with the shadowed operator-level count.

        A rule that returned a plain number of MACs (``macs_only``) is compared on MACs alone;
        one that returned a :class:`Cost` is compared on MACs and FLOPs. Bytes are never compared
        (rules rarely state them).
        """
        if self.macs_only:
            return self.cost.macs != self.shadowed.macs
        return (self.cost.macs, self.cost.flops) != (self.shadowed.macs, self.shadowed.flops)


@dataclass(frozen=True, slots=True)
class OpStats:
    """Calls and total cost of one operator (or one operator within one module)."""

    calls: int
    cost: Cost


@dataclass(frozen=True, slots=True)
class ModuleStats:
    """One module of the report.

    Attributes:
        path: module path (``""`` is the root).
        type: the module's class name.
        calls: forward calls.
        params: parameter counts (own / inclusive / trainable / frozen / buffers).
        self_cost: cost of operators attributed directly to this module.
        inclusive: ``self_cost`` plus the inclusive cost of every descendant.
    """

    path: str
    type: str
    calls: int
    params: ParamStats
    self_cost: Cost
    inclusive: Cost


def sum_costs(costs: Iterable[Cost]) -> Cost:
    """The sum of some costs (a zero cost for none)."""
    total = Cost()
    for c in costs:
        total = total + c
    return total


def as_phase(phase: Phase | str | None) -> Phase | None:
    """A phase given as a :class:`Phase`, its name or ``None`` (all phases).

    Raises:
        UsageError: an unknown phase name.
    """
    if phase is None or isinstance(phase, Phase):
        return phase
    try:
        return Phase(phase)
    except ValueError:
        raise UsageError(
            f"unknown phase {phase!r}: use one of {[p.value for p in Phase]} or None for all"
        ) from None


class Located(Protocol):
    """A record that ran in one module in one phase (:class:`OpRecord`, :class:`CommRecord`)."""

    @property
    def module(self) -> str: ...

    @property
    def phase(self) -> Phase: ...


def is_within(path: str, ancestor: str) -> bool:
    """True when module ``path`` is ``ancestor`` or lies below it (the root ``""`` holds all)."""
    return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")
