"""A reference pipeline at FSDP2 degree 1 from the one at the plan's sharded degree
(:class:`flopscope.plan.screen.Screen`; docs/plan.md, "Screening").

A layout whose tensor-parallel and pipeline degrees use every device has no data parallelism:
its stages are screened from a reference pipeline at FSDP2 degree 1, while the plan's other
pipeline layouts of the same tensor-parallel degree use one at ``gpus / (2 tp)``. With mixed
precision FSDP2 is applied at degree 1 too (:func:`flopscope.distributed.layout.apply_layout`:
over a group of one it casts without a collective), so the two pipelines run the same model
code on the same gathered (compute-dtype) parameters: they differ in

- the parameter shards (whole at degree 1): a constant of every call point;
- FSDP2's own handling of the parameters and gradients (the casts, copies into and out of the
  gathered buffers, the gradients' division, the all-gather and reduce-scatter): operators on
  parameter-sized tensors, the same whatever the micro-batch;
- the data-parallel collectives, which a stage at degree 1 leaves out
  (:func:`flopscope.plan.screen.screened` drops them).

So one pair of pipelines at a *base* micro-batch (the first of the family a plan asks for),
degree 1 and the sharded degree, gives the difference, and the pipeline at degree 1 at another
micro-batch is the sharded one there moved by it (:func:`whole_from`):

- every operator's row per phase moved by the base pair's difference (:func:`delta`: FSDP2's
  operators are on parameter-sized tensors, the rest are the same calls);
- every call point: the base pair's calls aligned by (module, phase, operator)
  (:class:`difflib.SequenceMatcher`; degree 1 makes per microbatch casts and copies where the
  sharded pipeline gathers once a step, and keeps the gradients whole); a call both make is the
  sharded run's same call moved by the base pair's difference there (the gathered buffers, the
  whole gradients, the parameters), a call of degree 1 only is the call before it moved by
  what it adds in the base run, a call the sharded run makes at its micro-batch and not at the
  base's (above 1, the loss copies its labels) is moved as the call before it; the peak is the
  largest of them (:func:`~flopscope.plan.microbatches.peak_of`).

What this assumes, and cannot check at run time without simulating what it replaces: that the
difference between the degrees is the same at every micro-batch. It refuses (the degree-1
pipeline is then simulated) where a run's parameters change from call to call, where the
sharded runs at the two micro-batches differ by more than added calls, or where a category would
go below zero; without mixed precision (degree 1 has no FSDP2 at all) it is not used. Held out,
it is exact: on the test model (``tests/plan/test_whole.py``: every call point, the peak, every
phase's FLOPs and seconds) and on every reference pipeline at degree 1 of the 70B plan of
docs/plan.md's "Speed" (``python -m benchmarks.plan_screen --whole-check``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from flopscope.distributed.repeat import NotRepeating
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate import Estimate
from flopscope.estimate.bound import Row
from flopscope.plan.layers import Small
from flopscope.plan.microbatches import peak_of
from flopscope.plan.reference import lin

__all__ = ["Base", "Delta", "base_pair", "delta", "whole_from"]

#: phase -> operator -> the degree-1 run's row less the sharded run's
Delta = dict[str, dict[str, Row]]


def _params(run: Small) -> int:
    """The run's parameter bytes at its call points, refused unless the same at every one."""
    seen = {live.get("parameters", 0) for _, _, _, live in run.points}
    if len(seen) != 1:
        raise NotRepeating("the parameters' bytes change within the run")
    return seen.pop()


def _calls(points: Sequence[Point]) -> list[tuple[str, str, str]]:
    return [(m, p, o) for m, p, o, _ in points]


def _move(live: Mapping[str, int], to: Mapping[str, int], since: Mapping[str, int]
          ) -> dict[str, int]:
    """``live`` moved by ``to - since``, per category (in ``to``'s order)."""
    out = {c: live.get(c, 0) + to.get(c, 0) - since.get(c, 0)
           for c in [*to, *(c for c in live if c not in to)]}
    if any(v < 0 for v in out.values()):
        raise NotRepeating("a category moved below zero")
    return out


@dataclass(frozen=True)
class Base:
    """A base pair (the same run at FSDP2 degree 1 and at the sharded degree, at one
    micro-batch) and what :func:`whole_from` reads of it, worked out once.

    Attributes:
        whole: the run at degree 1.
        sharded: the run at the sharded degree.
        matched: ``whole``'s call index -> ``sharded``'s, for the calls both make (aligned by
            module, phase and operator: :class:`difflib.SequenceMatcher`).
        diff: :func:`delta` of the pair.
    """

    whole: Small
    sharded: Small
    matched: dict[int, int]
    diff: Delta


def base_pair(whole: Small, sharded: Small) -> Base:
    """The base pair, aligned (:class:`Base`).

    Args:
        whole: the run at degree 1.
        sharded: the same run at the sharded degree.

    Returns:
        The :class:`Base`.

    Raises:
        NotRepeating: a run's parameter bytes change from call to call.
    """
    _params(whole)
    _params(sharded)
    pairs = SequenceMatcher(None, _calls(sharded.points), _calls(whole.points), autojunk=False)
    matched = {j: i for tag, i1, i2, j1, j2 in pairs.get_opcodes() if tag == "equal"
               for i, j in zip(range(i1, i2), range(j1, j2), strict=True)}
    return Base(whole, sharded, matched, delta(whole, sharded))


def _points(sharded: Sequence[Point], base: Base) -> list[Point]:
    """The base's degree-1 call points at ``sharded``'s micro-batch: each call of the base's
    degree-1 run that its sharded run makes too is ``sharded``'s same call moved by the base
    pair's difference there; a call of degree 1 only (FSDP2's handling there) is the point
    before it moved by what that call adds in the base run; a call ``sharded`` makes and the
    base's sharded run does not (its micro-batch's own: the loss's copy of the labels above 1)
    is moved as the point before it."""
    base_whole, base_sharded = base.whole.points, base.sharded.points
    at: dict[int, int] = {}  # base_sharded index -> sharded index
    extra: dict[int, list[int]] = {}  # sharded's own calls, after base_sharded's index
    if _calls(base_sharded) == _calls(sharded):
        at = {i: i for i in range(len(sharded))}
    else:
        to_base = SequenceMatcher(None, _calls(base_sharded), _calls(sharded), autojunk=False)
        for tag, i1, i2, j1, j2 in to_base.get_opcodes():
            if tag == "equal":
                at.update(zip(range(i1, i2), range(j1, j2), strict=True))
            elif tag == "insert":
                extra.setdefault(i1 - 1, []).extend(range(j1, j2))
            else:
                raise NotRepeating("the sharded runs differ in more than added calls")
    out: list[Point] = []
    last: tuple[Mapping[str, int], Mapping[str, int]] | None = None  # (derived, base_whole)
    for j, (module, phase, op, live) in enumerate(base_whole):
        i = base.matched.get(j)
        if i is not None and i in at:
            moved = _move(sharded[at[i]][3], live, base_sharded[i][3])
        elif last is not None:
            moved = _move(last[0], live, last[1])
        else:
            raise NotRepeating("the first call is not the sharded run's")
        out.append((module, phase, op, moved))
        last = (moved, live)
        if i is None:
            continue
        for k in extra.pop(i, []):
            m2, p2, o2, own = sharded[k]
            moved = _move(own, live, base_sharded[i][3])
            out.append((m2, p2, o2, moved))
            last = (moved, live)
    if extra:
        raise NotRepeating("a call of the sharded run has no place in the derived one")
    return out


def delta(whole: Small, sharded: Small) -> Delta:
    """Per phase and operator, ``whole``'s row less ``sharded``'s (the same run at degree 1
    and at a sharded degree).

    Args:
        whole: the run at FSDP2 degree 1.
        sharded: the same run at the sharded degree.

    Returns:
        The difference (only where it is not zero).
    """
    out: Delta = {}
    for phase in {*whole.estimate.by_phase_op, *sharded.estimate.by_phase_op}:
        a = whole.estimate.by_phase_op.get(phase, {})
        b = sharded.estimate.by_phase_op.get(phase, {})
        for op in {*a, *b}:
            d = lin([(1, a.get(op, Row())), (-1, b.get(op, Row()))])
            if d != Row():
                out.setdefault(phase, {})[op] = d
    return out


def whole_from(sharded: Small, base: Base) -> Small:
    """A run at FSDP2 degree 1 from the same run at the sharded degree and a base pair of
    them (another micro-batch; see the module docstring).

    Args:
        sharded: the run at the sharded degree, at the micro-batch wanted.
        base: the base pair (:func:`base_pair`).

    Returns:
        The run at degree 1: its call points and peak (see the module docstring), the
        sharded run's report without its data-parallel collectives (a group of one has
        none), its estimate with every operator's row per phase moved by the base pair's
        difference, the base's parameter bytes; no call records (it is not carried further).

    Raises:
        NotRepeating: a run's parameter bytes change from call to call, or the sharded runs'
            parameters differ.
    """
    base_whole, base_sharded = base.whole, base.sharded
    if _params(sharded) != _params(base_sharded) or (
            sharded.parameter_bytes != base_sharded.parameter_bytes):
        raise NotRepeating("the sharded runs' parameters differ")
    points = _points(sharded.points, base)
    end = (sharded.memory.end_bytes + base_whole.memory.end_bytes
           - base_sharded.memory.end_bytes)
    memory = peak_of(points, end, base_whole.memory)
    diff = base.diff
    est = sharded.estimate
    by_phase_op: dict[str, dict[str, Row]] = {}
    by_phase: dict[str, Row] = {}
    for phase in {*est.by_phase, *diff}:
        ops = dict(est.by_phase_op.get(phase, {}))
        moved = diff.get(phase, {})
        for op, d in moved.items():
            ops[op] = lin([(1, ops.get(op, Row())), (1, d)])
        by_phase_op[phase] = ops
        by_phase[phase] = lin([(1, est.by_phase.get(phase, Row())),
                               *((1, d) for d in moved.values())])
    estimate = Estimate(est.hardware, est.tf32, lin((1, r) for r in by_phase.values()),
                        by_phase, tf32_convolution=est.tf32_convolution,
                        by_phase_op=by_phase_op)
    report = dataclasses.replace(sharded.report, communication=tuple(
        r for r in sharded.report.communication if r.group != "dp"))
    return dataclasses.replace(sharded, report=report, points=points, memory=memory,
                               estimate=estimate, parameter_bytes=base_whole.parameter_bytes,
                               parameter_tensors=base_whole.parameter_tensors,
                               parameters_dtensor=base_whole.parameters_dtensor,
                               partial_tensors=base_whole.partial_tensors,
                               partial_elements=base_whole.partial_elements,
                               calls=[])
