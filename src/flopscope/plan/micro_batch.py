"""A small run at a larger micro-batch from the same run at two smaller ones.

A screened plan's references (:class:`flopscope.plan.reference.Reference`) are small runs at
the role's micro-batch: a role without stages' own runs at 3 and 4 layers, and a pipeline
stage's two-stage pipelines (each read for its time, collectives, call points and
parameters). Run at micro-batch ``b`` of 2 or more, a run makes the same calls in the same order
at every ``b`` (the same modules, operators, phases and dtypes: the batch is a tensor
dimension, not a count of calls; at 1 a causal LM's loss makes one call fewer, its shifted
labels being contiguous without a copy), and every count the screen reads is a sum of terms
either fixed (parameters, FSDP2's gathered buffers and gradients, the rotary tables, a matrix
product's weight bytes) or proportional to the sequences in flight (activations, inputs, the
logits; a call's FLOPs, its activations' bytes): affine in ``b``. So each is on the line
through its values at two micro-batches ``p < q`` (:data:`flopscope.plan.screen.CARRY_FROM`:
2 and 4): every call point's live bytes by category, the bytes each collective sends, and
every operator call's roofline record (its FLOPs, bytes read and written, the cache model's
reuse distances and sizes, which are sums of bytes). The roofline time is **not** affine (a
call's time is the larger of its compute and its memory time), so it is not carried: it is
summed again from the carried records (:meth:`~flopscope.estimate.Estimate.from_records`), as
the run itself would.

That is a claim about the runs, so it is checked where it can be at run time and against
simulations in tests: :func:`at_micro_batch` refuses (:class:`NotRepeating`) when the two runs'
calls differ in any module, phase, operator or dtype, when their collectives differ in anything
but their bytes, when a run's tracked peak is not the largest of its call points (the peak is
then not read from them), or when a count falls below zero or off the integers;
``tests/plan/test_micro_batch.py`` checks the result equal to the simulation at micro-batch 8
(and 6): every call point, the peak with where it is reached and what is live then, the
collectives, the estimate's integers exactly and its seconds to 1e-9 of their value; and that
the run at micro-batch 1 is not on the line (it makes one call fewer).
"""

from __future__ import annotations

import dataclasses

from flopscope.distributed.repeat import NotRepeating
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate import Estimate
from flopscope.estimate.bound import Row
from flopscope.estimate.call_record import CallRecord
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


#: a call record's fields that are the same at every micro-batch (the call itself), and those
#: on a line in it (bytes and their sums: the cache model's clocks and reuse distances, work)
_SAME = ("path", "phase", "op", "dtype", "convolution", "modules")
_LINE = ("macs", "flops", "bytes", "fused_bytes", "bytes_read", "bytes_written", "before")


def _calls(one: list[CallRecord], two: list[CallRecord], at: tuple[int, int],
           micro_batch: int) -> list[CallRecord]:
    """Every operator call's record (what the roofline reads) carried along its line: the
    same call at both micro-batches, its work and bytes, its inputs' reuse distances and
    sizes, its outputs' sizes, its special function's evaluations."""
    if len(one) != len(two):
        raise NotRepeating("the runs at the two micro-batches make different calls")
    out = []
    for a, b in zip(one, two, strict=True):
        if (any(getattr(a, f) != getattr(b, f) for f in _SAME) or len(a.reuse) != len(b.reuse)
                or (a.special is None) != (b.special is None)
                or (a.special and b.special and a.special[0] != b.special[0])
                or (a.out_bytes is None) != (b.out_bytes is None)
                or (a.fresh_bytes is None) != (b.fresh_bytes is None)):
            raise NotRepeating("the runs at the two micro-batches make different calls")
        rec = CallRecord(b.path, b.phase, b.op, 0, 0, 0, b.dtype)
        for f in _LINE:
            setattr(rec, f, _at(getattr(a, f), getattr(b, f), at, micro_batch))
        rec.convolution, rec.modules, rec.after = b.convolution, b.modules, b.after
        rec.reuse = tuple((_at(n, m, at, micro_batch), _at(d, e, at, micro_batch))
                          for (n, d), (m, e) in zip(a.reuse, b.reuse, strict=True))
        if a.out_bytes is not None and b.out_bytes is not None:
            rec.out_bytes = _at(a.out_bytes, b.out_bytes, at, micro_batch)
        if a.fresh_bytes is not None and b.fresh_bytes is not None:
            rec.fresh_bytes = _at(a.fresh_bytes, b.fresh_bytes, at, micro_batch)
        if a.special and b.special:
            rec.special = (b.special[0], _at(a.special[1], b.special[1], at, micro_batch))
        out.append(rec)
    return out


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
        are ``two``'s), its calls' records and the estimate summed from them; where the runs
        kept no call records (:attr:`~flopscope.plan.layers.Small.calls`) an **empty**
        estimate: read it for memory and collectives only.

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
    if one.calls and two.calls:
        calls = _calls(one.calls, two.calls, at, micro_batch)
        estimate = Estimate.from_records(calls, est.hardware, tf32=est.tf32,
                                         tf32_convolution=est.tf32_convolution)
    else:
        calls = []
        estimate = Estimate(est.hardware, est.tf32, Row(), {},
                            tf32_convolution=est.tf32_convolution)
    return dataclasses.replace(two, report=report, points=points, memory=memory,
                               estimate=estimate, calls=calls)
