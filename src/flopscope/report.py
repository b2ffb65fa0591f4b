"""The result of a count: an immutable :class:`Report` of integers, with queries and a versioned
dict/JSON form. Rendering lives in :mod:`flopscope.render`."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flopscope.cost import Cost, Phase
from flopscope.errors import UsageError
from flopscope.params import ParamStats

__all__ = [
    "SCHEMA", "CommRecord", "CommStats", "ModuleStats", "OpRecord", "OpStats", "Report", "RuleRecord",
    "SourceInfo",
]

SCHEMA = "flopscope.report/1"


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


@dataclass(frozen=True, slots=True)
class CommRecord:
    """Calls of one kind of collective over one group size, issued by one module in one phase,
    and what they sent per rank together (conventions: :mod:`flopscope.rules.collectives`).

    Attributes:
        module: module path that issued the calls.
        phase: the phase they ran in.
        kind: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``,
            ``reduce``, ``gather``, ``scatter``, ``send``, ``recv`` or ``barrier``.
        group_size: ranks in the process group.
        calls: number of calls.
        payload_bytes: bytes per rank, summed over the calls (NCCL tests' "size").
        bus_bytes: ring-algorithm bytes per rank, summed over the calls.
    """

    module: str
    phase: Phase
    kind: str
    group_size: int
    calls: int
    payload_bytes: int
    bus_bytes: int


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


@dataclass(frozen=True)
class SourceInfo(Mapping[str, Any]):
    """Where a counted model came from, as the command line's model loader knows it.

    Typed fields; also readable as a mapping of the fields that are set (the JSON ``"meta"``
    object), so ``report.meta["inputs"]`` and ``report.meta.inputs`` both work.

    Attributes:
        source: the SOURCE string (``torchvision:resnet50``, ``hf:llama``, ``file.py:factory``).
        inputs: the forward inputs, described (``"1x3x224x224"``).
        reference_gmacs: the publisher's figure for this model and input size, in GMAC
            (torchvision's ``_ops``), when there is one.
        model_type: a transformers model type (``hf:`` sources).
        config: configuration overrides given on the command line (``hf:`` sources).
    """

    source: str | None = None
    inputs: tuple[str, ...] = ()
    reference_gmacs: float | None = None
    model_type: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, JSON-ready (``inputs`` as a list)."""
        out: dict[str, Any] = {}
        if self.reference_gmacs is not None:
            out["reference_gmacs"] = self.reference_gmacs
        if self.model_type is not None:
            out["model_type"] = self.model_type
        if self.config:
            out["config"] = dict(self.config)
        if self.inputs:
            out["inputs"] = list(self.inputs)
        if self.source is not None:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceInfo:
        """Read :meth:`to_dict` output back (unknown keys are ignored)."""
        gmacs = data.get("reference_gmacs")
        return cls(
            source=data.get("source"),
            inputs=tuple(str(i) for i in data.get("inputs", ())),
            reference_gmacs=float(gmacs) if gmacs is not None else None,
            model_type=data.get("model_type"),
            config=dict(data.get("config", {})),
        )

    def merged(self, other: SourceInfo) -> SourceInfo:
        """These facts, with every field that ``other`` sets taken from ``other``."""
        return SourceInfo.from_dict({**self.to_dict(), **other.to_dict()})

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


def _sum(costs: Iterable[Cost]) -> Cost:
    total = Cost()
    for c in costs:
        total = total + c
    return total


def _phase(phase: Phase | str | None) -> Phase | None:
    if phase is None or isinstance(phase, Phase):
        return phase
    try:
        return Phase(phase)
    except ValueError:
        raise UsageError(
            f"unknown phase {phase!r}: use one of {[p.value for p in Phase]} or None for all"
        ) from None


def is_within(path: str, ancestor: str) -> bool:
    """True when module ``path`` is ``ancestor`` or lies below it (the root ``""`` holds all)."""
    return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")


@dataclass(frozen=True)
class Report:
    """What a model (or any code run under a :class:`~flopscope.Counter`) cost.

    Build one with :func:`flopscope.count` or :class:`flopscope.Counter`; all numbers are integers.

    Attributes:
        model: class name of the counted model (``""`` when none was given).
        modules: module path -> (class name, forward calls), in model order.
        module_params: module path -> :class:`ParamStats`.
        records: every (module, operator, phase) with its calls and cost.
        rules: modules costed by a module rule, with the shadowed operator-level cost.
        opaque: paths of modules whose outputs came from allocations only (possibly a kernel
            that bypasses the dispatcher: give it a module rule).
        shape_only: whether the count ran on fake tensors.
        communication: collectives issued, per module, phase, kind and group size (empty when
            none ran); see :meth:`communication_by_kind`.
        logical: under DTensor, the records of the logical (global, unsharded) computation: each
            operator on DTensors costed once at its global shapes, in place of the work on the
            local shards it ran as; operators on plain tensors as in ``records``. Empty when no
            DTensor operator ran (the logical work is then ``records``); see
            :meth:`logical_total`.
        replicated: under DTensor, the records of this rank's work on DTensors replicated on
            every mesh dimension (every rank does the same work); part of ``records``.
        rank: the rank that made the report (``None`` outside ``torch.distributed``).
        world_size: ranks in the job (``None`` outside ``torch.distributed``).
    """

    model: str
    modules: Mapping[str, tuple[str, int]]
    module_params: Mapping[str, ParamStats]
    records: tuple[OpRecord, ...]
    rules: tuple[RuleRecord, ...] = ()
    opaque: tuple[str, ...] = ()
    shape_only: bool = False
    meta: SourceInfo = field(default_factory=SourceInfo)
    communication: tuple[CommRecord, ...] = ()
    logical: tuple[OpRecord, ...] = ()
    replicated: tuple[OpRecord, ...] = ()
    rank: int | None = None
    world_size: int | None = None

    # -- totals -------------------------------------------------------------------------------
    def _records(self, phase: Phase | str | None, module: str | None) -> Iterator[OpRecord]:
        """The records of one phase (or all) within one module's subtree (or the whole model)."""
        ph = _phase(phase)
        if module is not None and module not in self.modules:
            close = difflib.get_close_matches(module, [p for p in self.modules if p], n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise UsageError(f"the report has no module {module!r}{hint} (the root is '')")
        for r in self.records:
            if (ph is None or r.phase == ph) and (module is None or is_within(r.module, module)):
                yield r

    def total(self, phase: Phase | str | None = None, *, module: str | None = None) -> Cost:
        """Total cost, of one phase or of all (``None``), of the whole report or of one module
        (inclusive: the module and everything below it).

        Raises:
            UsageError: unknown phase or module path.
        """
        return _sum(r.cost for r in self._records(phase, module))

    @property
    def macs(self) -> int:
        """Total multiply-accumulates (all phases)."""
        return self.total().macs

    @property
    def flops(self) -> int:
        """Total floating-point operations, including ``2 * macs`` (all phases)."""
        return self.total().flops

    @property
    def model_flops(self) -> int:
        """FLOPs the model needs: every phase except recomputation by activation checkpointing
        (the numerator of MFU)."""
        return self.flops - self.total(Phase.RECOMPUTE).flops

    @property
    def hardware_flops(self) -> int:
        """FLOPs executed, recomputation included (the numerator of HFU); equals :attr:`flops`."""
        return self.flops

    @property
    def bytes_read(self) -> int:
        """Total bytes read by operators (all phases)."""
        return self.total().bytes_read

    @property
    def bytes_written(self) -> int:
        """Total bytes written by operators (all phases)."""
        return self.total().bytes_written

    # -- sharded models: logical work and communication ---------------------------------------
    def logical_total(self, phase: Phase | str | None = None, *, module: str | None = None) -> Cost:
        """The logical (global, unsharded) cost of the computation this rank took part in: every
        operator on DTensors at its global shapes, plain operators as they ran. Equal to
        :meth:`total` when no DTensor operator ran.

        Raises:
            UsageError: unknown phase or module path.
        """
        if not self.logical:
            return self.total(phase, module=module)
        self._records(phase, module)  # validates phase and module
        ph = _phase(phase)
        return _sum(r.cost for r in self.logical
                    if (ph is None or r.phase == ph) and (module is None or is_within(r.module, module)))

    def replicated_total(self, phase: Phase | str | None = None) -> Cost:
        """This rank's work on fully replicated DTensors (see ``replicated``): redundant work that
        every rank of the mesh does in full.

        Raises:
            UsageError: unknown phase.
        """
        ph = _phase(phase)
        return _sum(r.cost for r in self.replicated if ph is None or r.phase == ph)

    def communication_by_kind(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[str, CommStats]:
        """Calls, payload bytes and bus bytes per collective kind (sorted by name), of one phase
        or all, of one module's subtree or the whole report.

        Raises:
            UsageError: unknown phase or module path.
        """
        self._records(phase, module)  # validates phase and module
        ph = _phase(phase)
        out: dict[str, CommStats] = {}
        for r in self.communication:
            if (ph is None or r.phase == ph) and (module is None or is_within(r.module, module)):
                out[r.kind] = out.get(r.kind, CommStats()) + CommStats(
                    r.calls, r.payload_bytes, r.bus_bytes)
        return dict(sorted(out.items()))

    def communication_total(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> CommStats:
        """Every collective's calls, payload bytes and bus bytes together (see
        :meth:`communication_by_kind`).

        Raises:
            UsageError: unknown phase or module path.
        """
        total = CommStats()
        for stats in self.communication_by_kind(phase, module=module).values():
            total = total + stats
        return total

    @property
    def params(self) -> int:
        """Distinct parameter elements of the model (tied weights once)."""
        root = self.module_params.get("")
        return root.inclusive if root else 0

    @property
    def trainable_params(self) -> int:
        """Distinct parameter elements with ``requires_grad=True``."""
        root = self.module_params.get("")
        return root.trainable if root else 0

    @property
    def frozen_params(self) -> int:
        """Distinct parameter elements with ``requires_grad=False``."""
        root = self.module_params.get("")
        return root.frozen if root else 0

    @property
    def buffers(self) -> int:
        """Distinct buffer elements of the model."""
        root = self.module_params.get("")
        return root.buffers if root else 0

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases that ran, in order."""
        seen = {r.phase for r in self.records}
        return tuple(p for p in Phase if p in seen)

    # -- breakdowns ---------------------------------------------------------------------------
    @property
    def uncounted(self) -> dict[str, int]:
        """Operators that ran with no rule (counted as 0 FLOPs), with their call counts."""
        return self.uncounted_in()

    def uncounted_in(self, module: str | None = None) -> dict[str, int]:
        """Operators with no rule that ran in ``module`` or below it (``None``: anywhere).

        Raises:
            UsageError: unknown module path.
        """
        out: dict[str, int] = {}
        for r in self._records(None, module):
            if not r.counted:
                out[r.op] = out.get(r.op, 0) + r.calls
        return dict(sorted(out.items()))

    @property
    def decomposed(self) -> dict[str, int]:
        """Operators with no rule of their own, counted as the sum of their decomposition's pieces
        (see :mod:`flopscope.decompose`), with their call counts."""
        out: dict[str, int] = {}
        for r in self.records:
            if r.decomposed:
                out[r.op] = out.get(r.op, 0) + r.calls
        return dict(sorted(out.items()))

    @property
    def shadowed(self) -> dict[str, Cost]:
        """Per ruled module: the operator-level cost its rule replaced."""
        return {r.module: r.shadowed for r in self.rules}

    def rule_mismatches(self) -> tuple[RuleRecord, ...]:
        """Ruled modules whose rule disagrees with the shadowed operator-level count."""
        return tuple(r for r in self.rules if r.differs)

    def by_op(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[str, OpStats]:
        """Calls and cost per operator, most FLOPs first; of one module's subtree if given.

        Raises:
            UsageError: unknown phase or module path.
        """
        acc: dict[str, tuple[int, Cost]] = {}
        for r in self._records(phase, module):
            calls, cost = acc.get(r.op, (0, Cost()))
            acc[r.op] = (calls + r.calls, cost + r.cost)
        items = sorted(acc.items(), key=lambda kv: (-kv[1][1].flops, kv[0]))
        return {op: OpStats(calls, cost) for op, (calls, cost) in items}

    def by_module_and_op(self, phase: Phase | str | None = None) -> dict[tuple[str, str], OpStats]:
        """Calls and cost per (module path, operator), in model order."""
        ph = _phase(phase)
        acc: dict[tuple[str, str], tuple[int, Cost]] = {}
        for r in self.records:
            if ph is None or r.phase == ph:
                calls, cost = acc.get((r.module, r.op), (0, Cost()))
                acc[(r.module, r.op)] = (calls + r.calls, cost + r.cost)
        order = {p: i for i, p in enumerate(self.modules)}
        keys = sorted(acc, key=lambda k: (order.get(k[0], len(order)), k[0], -acc[k][1].flops, k[1]))
        return {k: OpStats(*acc[k]) for k in keys}

    def by_module(self, phase: Phase | str | None = None) -> dict[str, ModuleStats]:
        """Per module path: calls, parameters, self and inclusive cost, in model order.

        Inclusive cost is the module's own cost plus that of every module below it, so the root's
        inclusive cost is the report's total.
        """
        ph = _phase(phase)
        own: dict[str, Cost] = {}
        for r in self.records:
            if ph is None or r.phase == ph:
                own[r.module] = own.get(r.module, Cost()) + r.cost
        inclusive: dict[str, Cost] = {p: Cost() for p in self.modules}
        for path, cost in own.items():
            parts = path.split(".") if path else []
            for i in range(len(parts) + 1):
                anc = ".".join(parts[:i])
                inclusive[anc] = inclusive.get(anc, Cost()) + cost
        out: dict[str, ModuleStats] = {}
        for path in list(self.modules) + [p for p in inclusive if p not in self.modules]:
            type_name, calls = self.modules.get(path, ("", 0))
            out[path] = ModuleStats(
                path=path,
                type=type_name,
                calls=calls,
                params=self.module_params.get(path, ParamStats()),
                self_cost=own.get(path, Cost()),
                inclusive=inclusive.get(path, Cost()),
            )
        return out

    # -- serialization ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a ``schema`` version; :meth:`from_dict` reads it back."""
        return {
            "schema": SCHEMA,
            "model": self.model,
            "shape_only": self.shape_only,
            "meta": self.meta.to_dict(),
            "totals": {
                "params": self.params,
                **self.total().to_dict(),
                **{f"{p.value}": self.total(p).to_dict() for p in self.phases},
            },
            "modules": [
                {"path": p, "type": t, "calls": c, "params": self.module_params.get(p, ParamStats()).to_dict()}
                for p, (t, c) in self.modules.items()
            ],
            "records": [
                {"module": r.module, "op": r.op, "phase": r.phase.value, "calls": r.calls,
                 "counted": r.counted, **({"decomposed": True} if r.decomposed else {}),
                 **r.cost.to_dict()}
                for r in self.records
            ],
            "rules": [
                {"module": r.module, "rule": r.rule, "calls": r.calls, "cost": r.cost.to_dict(),
                 "shadowed": r.shadowed.to_dict(), "macs_only": r.macs_only}
                for r in self.rules
            ],
            "opaque": list(self.opaque),
            "uncounted": self.uncounted,
            **self._distributed_dict(),
        }

    def _distributed_dict(self) -> dict[str, Any]:
        """The keys of a report made under ``torch.distributed`` (absent otherwise)."""
        out: dict[str, Any] = {}
        if self.rank is not None:
            out["rank"] = self.rank
            out["world_size"] = self.world_size
        if self.communication:
            out["communication"] = {
                "kinds": {k: s.to_dict() for k, s in self.communication_by_kind().items()},
                "total": self.communication_total().to_dict(),
                "records": [
                    {"module": r.module, "phase": r.phase.value, "kind": r.kind,
                     "group_size": r.group_size, "calls": r.calls,
                     "payload_bytes": r.payload_bytes, "bus_bytes": r.bus_bytes}
                    for r in self.communication
                ],
            }
        if self.logical:
            out["logical"] = {
                "totals": self.logical_total().to_dict(),
                "replicated": self.replicated_total().to_dict(),
                "records": [
                    {"module": r.module, "op": r.op, "phase": r.phase.value, "calls": r.calls,
                     "counted": r.counted, **r.cost.to_dict()}
                    for r in self.logical
                ],
                "replicated_records": [
                    {"module": r.module, "op": r.op, "phase": r.phase.value, "calls": r.calls,
                     "counted": r.counted, **r.cost.to_dict()}
                    for r in self.replicated
                ],
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Rebuild a report from :meth:`to_dict` output.

        Raises:
            UsageError: the data is not a flopscope report of a known schema version.
        """
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise UsageError(f"not a flopscope report: expected schema {SCHEMA!r}, found {found!r}")
        try:
            def cost(d: Mapping[str, Any]) -> Cost:
                return Cost(int(d["macs"]), int(d["flops"]), int(d["bytes_read"]), int(d["bytes_written"]))

            return cls(
                model=str(data["model"]),
                modules={m["path"]: (m["type"], int(m["calls"])) for m in data["modules"]},
                module_params={m["path"]: ParamStats(**m["params"]) for m in data["modules"]},
                records=tuple(
                    OpRecord(r["module"], r["op"], Phase(r["phase"]), int(r["calls"]), cost(r),
                             bool(r["counted"]), bool(r.get("decomposed", False)))
                    for r in data["records"]
                ),
                rules=tuple(
                    RuleRecord(r["module"], r["rule"], int(r["calls"]), cost(r["cost"]), cost(r["shadowed"]),
                               bool(r.get("macs_only", False)))
                    for r in data["rules"]
                ),
                opaque=tuple(data["opaque"]),
                shape_only=bool(data["shape_only"]),
                meta=SourceInfo.from_dict(data.get("meta", {})),
                communication=tuple(
                    CommRecord(r["module"], Phase(r["phase"]), r["kind"], int(r["group_size"]),
                               int(r["calls"]), int(r["payload_bytes"]), int(r["bus_bytes"]))
                    for r in data.get("communication", {}).get("records", ())
                ),
                logical=tuple(
                    OpRecord(r["module"], r["op"], Phase(r["phase"]), int(r["calls"]), cost(r),
                             bool(r["counted"]))
                    for r in data.get("logical", {}).get("records", ())
                ),
                replicated=tuple(
                    OpRecord(r["module"], r["op"], Phase(r["phase"]), int(r["calls"]), cost(r),
                             bool(r["counted"]))
                    for r in data.get("logical", {}).get("replicated_records", ())
                ),
                rank=int(data["rank"]) if data.get("rank") is not None else None,
                world_size=int(data["world_size"]) if data.get("world_size") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"malformed flopscope report ({type(e).__name__}: {e})") from None

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Report:
        """Rebuild a report from :meth:`to_json` output.

        Raises:
            UsageError: the text is not JSON or not a flopscope report.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"not a flopscope report: invalid JSON ({e})") from None
        return cls.from_dict(data)

    # -- tabular export -------------------------------------------------------------------------
    def table_rows(self, by: str = "module") -> list[dict[str, Any]]:
        """The report as flat rows of plain integers and strings (for CSV and pandas).

        Args:
            by: ``"module"`` -- one row per module path (every module, with its ``depth``;
                inclusive ``macs``/``flops``/bytes and the module's own ``self_macs``/``self_flops``);
                or ``"op"`` -- one row per operator (``counted`` is False for operators with no rule).

        Returns:
            A list of dicts with the same keys in every row.

        Raises:
            UsageError: ``by`` is neither ``"module"`` nor ``"op"``.
        """
        if by == "module":
            return [
                {
                    "module": path,
                    "type": s.type,
                    "depth": 0 if path == "" else path.count(".") + 1,
                    "calls": s.calls,
                    "params": s.params.inclusive,
                    "params_own": s.params.own,
                    "macs": s.inclusive.macs,
                    "flops": s.inclusive.flops,
                    "bytes_read": s.inclusive.bytes_read,
                    "bytes_written": s.inclusive.bytes_written,
                    "self_macs": s.self_cost.macs,
                    "self_flops": s.self_cost.flops,
                }
                for path, s in self.by_module().items()
            ]
        if by == "op":
            uncounted = self.uncounted
            return [
                {
                    "op": op,
                    "calls": s.calls,
                    "macs": s.cost.macs,
                    "flops": s.cost.flops,
                    "bytes_read": s.cost.bytes_read,
                    "bytes_written": s.cost.bytes_written,
                    "counted": op not in uncounted,
                }
                for op, s in self.by_op().items()
            ]
        raise UsageError(f"unknown breakdown {by!r}: use 'module' or 'op'")

    def to_pandas(self, by: str = "module") -> Any:
        """The report as a ``pandas.DataFrame`` (see :meth:`table_rows` for the columns).

        Args:
            by: ``"module"`` or ``"op"``.

        Returns:
            A DataFrame, one row per module or operator, integer columns.

        Raises:
            ImportError: pandas is not installed.
            UsageError: ``by`` is neither ``"module"`` nor ``"op"``.
        """
        try:
            import pandas as pd  # type: ignore[import-untyped]
        except ImportError:
            raise ImportError(
                "Report.to_pandas() needs pandas, which is not installed: pip install pandas"
            ) from None
        rows = self.table_rows(by)
        return pd.DataFrame(rows, columns=list(rows[0]) if rows else None)

    # -- display (made by flopscope.render, which registers itself; see set_display) ---------
    def table(self, depth: int = 2) -> str:
        """The module tree as a plain-text table, down to ``depth`` levels below the root."""
        return _display.text(self, depth)

    def __str__(self) -> str:
        return self.table()

    def __rich__(self) -> Any:
        return _display.rich(self)

    def __repr__(self) -> str:
        return (
            f"Report(model={self.model!r}, params={self.params}, macs={self.macs}, "
            f"flops={self.flops}, uncounted={len(self.uncounted)})"
        )


class _Display:
    """How a report shows itself: set by :mod:`flopscope.render` when it is imported (the
    package imports it), so the data path runs one way and the report never imports a renderer."""

    def __init__(self) -> None:
        self.text: Callable[[Report, int], str] = _no_renderer
        self.rich: Callable[[Report], Any] = _no_renderer


def _no_renderer(report: Report, *_: Any) -> Any:
    return repr(report)


_display = _Display()


def set_display(text: Callable[[Report, int], str], rich: Callable[[Report], Any]) -> None:
    """Register the functions that draw a report as text (``str(report)``, ``report.table()``)
    and for rich (``rich.print(report)``)."""
    _display.text = text
    _display.rich = rich
