"""A role's small runs at one FSDP2 degree from the same runs at two others.

What a rank's simulated step depends on its FSDP2 degree ``W`` for (measured on a Llama, TP 2 x
FSDP 2, 3, 4 and 8: ``benchmarks/plan_degrees.py``, ``benchmarks/results/plan_degrees.json``):
the same operator calls, collectives and memory events in the same order at every degree, only
FSDP2's own figures change, each a closed form of the parameter shards. FSDP2 pads a parameter's
dimension 0 to a multiple of ``W`` (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``), so a
group's shard is ``A(W) = sum ceil(d0 / W) x rest`` elements and its gathered (padded) size
``W x A(W)``; the all-gather's copy-in, its output buffer, the reduce-scatter's input and output,
the parameter and gradient shards in memory, the collectives' payloads (``W x A``) and bus bytes
(``(W - 1) x A``) are sums of these with the dtypes' sizes as coefficients. Without padding
(every sharded dimension 0 a multiple of ``W``) ``W x A(W)`` is the group's size whatever the
degree and ``A(W)`` is that over ``W``: every figure of the run, each record's cost, each
collective's bytes, the live bytes of every category at every call, the parameter shards, the
roofline estimate's sums, is ``c + a / W``. The collectives' group size is the degree itself.

So a run at degree ``W`` is ``x0 r(W0) + x1 r(W1)`` of the same run (the same role with another
FSDP2 degree) at two degrees, ``x0 + x1 = 1`` and ``x0 / W0 + x1 / W1 = 1 / W``, every integer
exact (a figure that is not an integer there is refused), with the collectives of group size
``W0`` and ``W1`` given ``W``. :class:`Degrees` keeps the small runs of
:mod:`flopscope.plan.roles` (three small layer counts, three small pipelines) by their role
without the degree, at its first two degrees above 1 without padding; a role at another degree
(no padding, above 1) has its first small run simulated
as the check (it must equal the derived one: the report record for record, the live bytes at every
call, the peak, the parameter shards, the estimate's integers exactly and its seconds to 1e-9 of
their value) and the other two derived; otherwise, or where the check fails, they are simulated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any, TypeVar

from torch import nn

from flopscope.distributed.repeat import NotRepeating
from flopscope.estimate import Estimate, Hardware, MemoryProfile
from flopscope.estimate.call_record import CallRecord
from flopscope.plan.layers import Small, unit_module

__all__ = ["Degrees", "Dims", "clear_degrees", "derive", "dims_of", "hardware_key", "pads",
           "same_run", "shared_degrees", "sharing_degrees"]

#: what tells a role's small runs apart (layers per stage, stages of a small pipeline)
C = TypeVar("C", bound=Hashable)

#: each parameter's (dimension 0, ranks sharding it but FSDP2's), or ``None`` where unknown
Dims = tuple[tuple[int, int], ...] | None


def hardware_key(hw: Hardware) -> str:
    """What the plan's caches of simulated runs key a profile by: its name, and where its
    calibration is from (a shipped profile's datasheet copy, ``PROFILES[NAME]``, and the same
    profile with its reference calibration predict differently under one name)."""
    return hw.name if hw.calibration is None else f"{hw.name} ({hw.calibration.source()})"


def dims_of(model: nn.Module, degree: int) -> Dims:
    """How the parameters of a sharded model split their dimension 0: per parameter its size
    and the ranks sharding it besides FSDP2's ``degree`` (a tensor-parallel ``Shard(0)``).

    Args:
        model: the rank's model after ``fully_shard`` (its parameters DTensors).
        degree: FSDP2's degree.

    Returns:
        The dims, or ``None`` when a parameter is not a DTensor sharded on dimension 0.
    """
    from torch.distributed.tensor import DTensor

    out = []
    for p in model.parameters():
        if not isinstance(p, DTensor) or p.dim() == 0:
            return None
        # Shard(0) and FSDP2's _StridedShard(0) over a tensor-parallel Shard(0) both split it
        ranks = math.prod(p.device_mesh.size(i) for i, pl in enumerate(p.placements)
                          if getattr(pl, "dim", None) == 0)
        if ranks % degree:
            return None
        out.append((p.shape[0], ranks // degree))
    return tuple(out)


def pads(dims: Dims, degree: int) -> bool:
    """Whether FSDP2 pads any parameter at ``degree`` (``True`` where ``dims`` is unknown)."""
    return dims is None or any(d % (degree * r) for d, r in dims)


def _mix(values: Sequence[Any], weights: Sequence[Fraction], degrees: Sequence[int],
         to: int) -> Any:
    """``sum weights x values`` of one figure across runs (see the module's docstring)."""
    first = values[0]
    if all(v == first for v in values[1:]) and all(type(v) is type(first) for v in values):
        return first
    if isinstance(first, (bool, str, Enum)) or first is None:
        raise NotRepeating(f"{first!r}: differs between degrees")
    if isinstance(first, int):
        if list(values) == list(degrees):
            return to
        x = sum((w * v for w, v in zip(weights, values, strict=True)), Fraction(0))
        if x.denominator != 1 or x < 0:
            raise NotRepeating(f"{values}: not c + a / degree")
        return int(x)
    if isinstance(first, float):
        return math.fsum(float(w) * v for w, v in zip(weights, values, strict=True))
    if isinstance(first, (tuple, list)):
        if any(len(v) != len(first) for v in values):
            raise NotRepeating("a different number of items between degrees")
        return type(first)(_mix(col, weights, degrees, to) for col in zip(*values, strict=True))
    if isinstance(first, Mapping):
        if any(list(v) != list(first) for v in values):
            raise NotRepeating("different keys between degrees")
        return {k: _mix([v[k] for v in values], weights, degrees, to) for k in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{
            f.name: _mix([getattr(v, f.name) for v in values], weights, degrees, to)
            for f in dataclasses.fields(first) if f.init})
    raise NotRepeating(f"{type(first).__name__}: not derived between degrees")


def _peak(points: Sequence[tuple[str, str, str, Mapping[str, int]]]
          ) -> tuple[int, str, str, str, dict[str, int]]:
    """The first call with the most live bytes: (total, module, phase, op, live); a small
    pipeline's module paths without their microbatch (:func:`~flopscope.plan.layers.unit_module`,
    as its memory profile names the peak)."""
    best: tuple[int, str, str, str, dict[str, int]] = (-1, "", "", "", {})
    for module, phase, op, live in points:
        total = sum(live.values())
        if total > best[0]:
            best = (total, unit_module(module), phase, op, {c: v for c, v in live.items() if v})
    return best


def _memory(run: Small, points: Sequence[tuple[str, str, str, Mapping[str, int]]],
            end: int) -> MemoryProfile:
    total, module, phase, op, live = _peak(points)
    return MemoryProfile(total, module, phase, op, live, end, train=run.memory.train,
                         note=run.memory.note)


def derive(runs: Sequence[tuple[int, Small]], to: int, world_size: int, rank: int) -> Small:
    """The run at FSDP2 degree ``to`` from the same run at two other degrees.

    Args:
        runs: ``(degree, run)`` at two degrees (neither ``to``; no padding at any).
        to: the degree.
        world_size: the job's ranks at ``to``.
        rank: the simulated rank at ``to``.

    Returns:
        The run at ``to``: its report, live bytes at every call, peak (from those), estimate
        (total and phases), parameter shards.

    Raises:
        NotRepeating: the runs are not alike but for FSDP2's figures, a figure is not an integer
            at ``to``, or a run's own peak is not the first of its most live bytes.
    """
    (w0, r0), (w1, r1) = runs
    if len({w0, w1, to}) < 3 or r0.frame != r1.frame:
        raise NotRepeating("two other degrees of the same run are needed")
    x1 = (Fraction(1, to) - Fraction(1, w0)) / (Fraction(1, w1) - Fraction(1, w0))
    weights, degrees = (1 - x1, x1), (w0, w1)
    for _, r in runs:
        m = r.memory
        if _peak(r.points) != (m.peak_bytes, m.peak_module, m.peak_phase, m.peak_op,
                               dict(m.at_peak)):
            raise NotRepeating("a run's peak is not the first of its most live bytes")
    reports = [dataclasses.replace(r.report, world_size=world_size, rank=rank) for _, r in runs]
    report = _mix(reports, weights, degrees, to)
    points = [(*_mix([p[:3] for p in col], weights, degrees, to),
               _mix([p[3] for p in col], weights, degrees, to))
              for col in _columns([r0.points, r1.points])]
    e0, e1 = r0.estimate, r1.estimate
    calls: list[CallRecord] = []
    if e1.calibrated:  # a prediction is not c + a / W; its calls' records are: predict them
        if not r0.calls or not r1.calls:
            raise NotRepeating("a calibrated profile's runs need their call records")
        calls = [_record(col, weights, degrees, to) for col in _columns([r0.calls, r1.calls])]
        estimate = Estimate.from_records(calls, e1.hardware, tf32=e1.tf32,
                                         tf32_convolution=e1.tf32_convolution)
    else:
        estimate = Estimate(e1.hardware, e1.tf32,
                            _mix([e0.total, e1.total], weights, degrees, to),
                            _mix([e0.by_phase, e1.by_phase], weights, degrees, to),
                            tf32_convolution=e1.tf32_convolution)
    end = _mix([r0.memory.end_bytes, r1.memory.end_bytes], weights, degrees, to)
    held = (r1.parameter_tensors, r1.parameters_dtensor, r1.partial_tensors)
    if (r0.parameter_tensors, r0.parameters_dtensor, r0.partial_tensors) != held:
        raise NotRepeating("the runs hold different parameter shards")  # one each, any degree
    return Small(r1.frame, report, points, _memory(r1, points, end), estimate,
                 _mix([r0.parameter_bytes, r1.parameter_bytes], weights, degrees, to), calls,
                 *held, _mix([r0.partial_elements, r1.partial_elements], weights, degrees, to))


#: what a call record holds (:class:`~flopscope.estimate.call_record.CallRecord`'s slots)
_RECORD = CallRecord.__slots__


def _record(col: Sequence[CallRecord], weights: Sequence[Fraction], degrees: Sequence[int],
            to: int) -> CallRecord:
    """One call's record at degree ``to`` from the same call's at two others: its work,
    bytes, the cache model's reuse distances and sizes, ``c + a / W`` as every figure of the
    run (:func:`_mix`; the call itself, its module, phase, operator and dtype, the same)."""
    first = col[0]
    out = CallRecord(first.path, first.phase, first.op, 0, 0, 0, first.dtype)
    for name in _RECORD:
        setattr(out, name, _mix([getattr(r, name) for r in col], weights, degrees, to))
    return out


def _columns(lists: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    if len({len(x) for x in lists}) != 1:
        raise NotRepeating("a different number of calls between degrees")
    return list(zip(*lists, strict=True))


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x) is type(y) and all(
            _close(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        return list(x) == list(y) and all(_close(x[k], y[k]) for k in x)
    return bool(x == y)


def same_run(x: Small, y: Small) -> bool:
    """Whether a derived run is the simulated one: the report record for record, the live
    bytes at every call, the peak with where it is reached and what is live then and at the end,
    the parameter shards, the estimate's total and phases (integers exactly, seconds to 1e-9).

    Args:
        x: one run.
        y: the other.

    Returns:
        ``True`` when they agree.
    """
    def memory(m: MemoryProfile) -> tuple[Any, ...]:
        return (m.peak_bytes, m.peak_module, m.peak_phase, m.peak_op, dict(m.at_peak),
                m.end_bytes)

    return (x.frame == y.frame and x.report == y.report
            and [(*p[:3], dict(p[3])) for p in x.points] == [(*p[:3], dict(p[3]))
                                                             for p in y.points]
            and memory(x.memory) == memory(y.memory) and x.parameter_bytes == y.parameter_bytes
            and x.parameter_tensors == y.parameter_tensors
            and x.parameters_dtensor == y.parameters_dtensor
            and (x.partial_tensors, x.partial_elements) == (y.partial_tensors,
                                                            y.partial_elements)
            and _close(x.estimate.total, y.estimate.total)
            and _close(x.estimate.by_phase, y.estimate.by_phase))


@dataclass(frozen=True)
class _Kept:
    degree: int
    run: Small
    dims: Dims


#: the first two simulated small runs of every role at a degree above 1 without padding, in
#: this process, by (model identity, hardware name, the role without its degree, the small
#: run) -> degree -> run
_RUNS: dict[tuple[Hashable, str, Hashable, Hashable], dict[int, _Kept]] = {}


def clear_degrees() -> None:
    """Forget every kept small run."""
    _RUNS.clear()


_SHARING = [0]  # open shared_degrees() blocks


@contextmanager
def shared_degrees() -> Iterator[None]:
    """Plans made inside share their roles' small runs across FSDP2 degrees (what
    :func:`flopscope.plan.sweep` does over its device counts): one plan has each role at one
    degree only, so it keeps none (about 0.4 MB per small run of a 16-layer Llama of width
    256 here, more for a 70B rank) unless a later plan of the same process can use them.

    Yields:
        Nothing.
    """
    _SHARING[0] += 1
    try:
        yield
    finally:
        _SHARING[0] -= 1


def sharing_degrees() -> bool:
    """Whether plans made now share small runs across degrees (:func:`shared_degrees`)."""
    return _SHARING[0] > 0


class Degrees:
    """The small runs of roles, kept by their role without the FSDP2 degree, and derived at a
    new degree from two earlier ones where that is exact (see the module's docstring).

    Args:
        identity: the model's identity (as :class:`~flopscope.plan.roles.Roles` has it).
        hardware: the hardware profile's name.

    Attributes:
        derived: roles whose small runs (all but the check) were derived from other degrees.
        refused: roles at a third degree or later that were simulated instead (padding, or the
            check failed).
    """

    def __init__(self, identity: Hashable, hardware: str) -> None:
        self._identity = identity
        self._hardware = hardware
        self.derived = 0
        self.refused = 0

    def runs(self, block: Hashable, degree: int, counts: Sequence[C],
             run: Callable[[C], tuple[Small, Dims]], world_size: int, rank: int
             ) -> list[Small]:
        """The role's small runs at ``degree``: derived from two earlier degrees of the same
        ``block`` (the first simulated as the check), else simulated; kept either way.

        Args:
            block: the role without its degree.
            degree: FSDP2's degree.
            counts: what tells the small runs apart (layers per stage; stages of a small
                pipeline).
            run: simulates one (one of ``counts``) -> (run, :func:`dims_of` its model).
            world_size: the job's ranks.
            rank: the simulated rank.

        Returns:
            One run per count.
        """
        kept = [_RUNS.setdefault((self._identity, self._hardware, block, n), {})
                for n in counts]
        first, dims = run(counts[0])
        refs = [k for k in kept[0].values() if k.degree != degree]
        if len(refs) >= 2 and degree > 1 and not pads(dims, degree) and dims == refs[0].dims:
            pair = refs[:2]
            try:
                derived = [derive([(k.degree, ks[k.degree].run) for k in pair], degree,
                                  world_size, rank) for ks in kept]
            except NotRepeating:
                derived = []
            if derived and same_run(derived[0], first):
                self.derived += 1
                return [first, *derived[1:]]
            self.refused += 1
        elif len(refs) >= 2:
            self.refused += 1
        out = [first, *(run(n)[0] for n in counts[1:])]
        # kept as references: two degrees above 1 without padding per role (about 1 MB of
        # records and call points per small run of a 70B rank)
        if degree > 1 and not pads(dims, degree) and len(kept[0]) < 2:
            for ks, small in zip(kept, out, strict=True):
                ks[degree] = _Kept(degree, small, dims)
        return out
