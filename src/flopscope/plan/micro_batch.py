"""A small run's memory at a larger micro-batch from its runs at two smaller ones.

A screened plan's reference pipelines (:class:`flopscope.plan.screen.Reference`) are read for
their memory and the hidden states they send only (their time comes from the references
without stages). Run at micro-batch ``b`` of 2 or more, a pipeline makes the same calls in the
same order at every ``b`` (the same modules, operators and phases: the batch is a tensor
dimension, not a count of calls; at 1 a causal LM's loss makes one call fewer, its shifted
labels being contiguous without a copy), and what is live at each call is, category by
category, a sum of tensors whose bytes are either fixed (parameters, FSDP2's gathered buffers
and gradients, the rotary tables) or proportional to the sequences in flight (activations,
inputs, the logits): affine in ``b``. So each call point's live bytes at ``b`` are on the
line through its live bytes at two micro-batches ``p < q`` (:data:`flopscope.plan.screen.
CARRY_FROM`: 2 and 4), and so are the bytes sent (one microbatch's hidden states per send).

That is a claim about the runs, so it is checked where it can be at run time and against
simulations in tests: :func:`at_micro_batch` refuses (:class:`NotRepeating`) when the two runs'
calls differ in any module, phase or operator, when their collectives differ in anything but
their bytes, when a run's tracked peak is not the largest of its call points (the peak is then
not read from them), or when a count falls below zero; ``tests/plan/test_micro_batch.py``
checks the result equal to the simulation at micro-batch 8 (and 6) to the byte, every call
point, the peak with where it is reached and what is live then, the sends, and that the run at
micro-batch 1 is not on the line (it makes one call fewer).
"""

from __future__ import annotations

import dataclasses

from flopscope.distributed.repeat import NotRepeating
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate import Estimate
from flopscope.estimate.bound import Row
from flopscope.plan.layers import Small
from flopscope.plan.microbatches import peak_of
from flopscope.report.records import CommRecord

__all__ = ["at_micro_batch"]


def _at(one: int, two: int, at: tuple[int, int], micro_batch: int) -> int:
    """The line through ``one`` (micro-batch ``at[0]``) and ``two`` (``at[1]``) at
    ``micro_batch``."""
    p, q = at
    step, rest = divmod((micro_batch - p) * (two - one), q - p)
    out = one + step
    if rest or out < 0:
        raise NotRepeating("a count falls below zero along its line in the micro-batch")
    return out


def _points(one: list[Point], two: list[Point], at: tuple[int, int], micro_batch: int
            ) -> list[Point]:
    if [p[:3] for p in one] != [p[:3] for p in two]:
        raise NotRepeating("the runs at the two micro-batches make different calls")
    return [(m, ph, op, {c: _at(a.get(c, 0), b.get(c, 0), at, micro_batch) for c in {*a, *b}})
            for (m, ph, op, a), (_, _, _, b) in zip(one, two, strict=True)]


def _communication(one: tuple[CommRecord, ...], two: tuple[CommRecord, ...],
                   at: tuple[int, int], micro_batch: int) -> tuple[CommRecord, ...]:
    def same(r: CommRecord) -> CommRecord:
        return dataclasses.replace(r, payload_bytes=0, bus_bytes=0)

    if len(one) != len(two) or any(same(a) != same(b) for a, b in zip(one, two, strict=True)):
        raise NotRepeating("the runs at the two micro-batches make different collectives")
    return tuple(dataclasses.replace(b, payload_bytes=_at(a.payload_bytes, b.payload_bytes, at,
                                                          micro_batch),
                                     bus_bytes=_at(a.bus_bytes, b.bus_bytes, at, micro_batch))
                 for a, b in zip(one, two, strict=True))


def _peak_at_points(run: Small) -> None:
    """Refuse a run whose tracked peak is not its call points' largest (then a peak carried
    along the points would not be the run's)."""
    found = peak_of(run.points, run.memory.end_bytes, run.memory)
    if (found.peak_bytes, found.at_peak) != (run.memory.peak_bytes,
                                             {c: v for c, v in run.memory.at_peak.items() if v}):
        raise NotRepeating("the tracked peak is not the largest call point")


def at_micro_batch(one: Small, two: Small, at: tuple[int, int], micro_batch: int) -> Small:
    """A run's call points, peak memory and collectives at ``micro_batch`` from the same run
    at two smaller micro-batches (see the module docstring).

    Args:
        one: the run at micro-batch ``at[0]`` (2 or more).
        two: the same run at micro-batch ``at[1]``.
        at: the two runs' micro-batches.
        micro_batch: the micro-batch (above ``at[1]``).

    Returns:
        The run at ``micro_batch``: its points, its memory profile (peak, where, what is live;
        no per-module marks), its report with the collectives carried (the operator records
        are ``two``'s); its estimate is **empty** (a roofline time is not affine in the
        batch: a call's bytes of weights do not grow with it), so read it for memory and
        collectives only.

    Raises:
        NotRepeating: the runs are not the same calls, or a count is off its line (see the
            module docstring).
    """
    for run in (one, two):
        _peak_at_points(run)
    points = _points(one.points, two.points, at, micro_batch)
    end = _at(one.memory.end_bytes, two.memory.end_bytes, at, micro_batch)
    memory = peak_of(points, end, two.memory)
    report = dataclasses.replace(two.report, communication=_communication(
        one.report.communication, two.report.communication, at, micro_batch))
    est = two.estimate
    empty = Estimate(est.hardware, est.tf32, Row(), {}, tf32_convolution=est.tf32_convolution)
    return dataclasses.replace(two, report=report, points=points, memory=memory,
                               estimate=empty)
