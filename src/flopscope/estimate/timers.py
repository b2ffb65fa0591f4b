"""How a calibration times and counts one call: the clock (:func:`clock`), a call timed in a loop
of itself (:func:`time_per_call`, :func:`per_call`) or in rotation with others as a model calls
its layers (:func:`time_in_rotation`), and what flopscope counts for it (:func:`counted_call`).
Each batch or call timed is a :class:`Sample` that knows whether another process preempted it
(:func:`switches`); :func:`robust_median` leaves those out where enough others are left (a
shared machine: the other process evicts the caches, the timed calls pay for refilling them).
The microbenchmarks (:mod:`flopscope.estimate.calibrate`), the host probes
(:mod:`flopscope.estimate.host_probes`) and the chains (:mod:`flopscope.estimate.chains`) all
time through these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from flopscope.estimate.workloads import Fn

__all__ = ["Counted", "Sample", "batch_samples", "clock", "counted_call", "op_base", "per_call",
           "robust_median", "rotation_samples", "switches", "time_in_rotation", "time_per_call"]


def clock(device: str) -> tuple[str, Callable[[], float]]:
    """The clock of the calibration's timings on ``device``: on a CPU running torch on one
    intra-op thread, the calling thread's CPU time (``time.thread_time``: what the core spent
    on the calls, equal to the wall time on an idle machine and not inflated by other
    processes sharing the cores); otherwise the wall clock (several threads' CPU times add up
    to more than the wall time; on CUDA the host's issuing time is wall time).

    Args:
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        (its name, the clock).
    """
    if not device.startswith("cuda") and torch.get_num_threads() == 1:
        return "thread CPU time", time.thread_time
    return "wall", time.perf_counter


class Sample(NamedTuple):
    """One timed batch (or call): seconds per call, and whether another process preempted it
    (an involuntary context switch inside it: the other process evicted the caches, which the
    timed calls then refilled; on the wall clock the wait is inside too)."""

    seconds: float
    preempted: bool


def switches() -> int:
    """Involuntary context switches of this process so far (``getrusage``; 0 where the platform
    has none: nothing is then taken for preempted)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def robust_median(samples: Sequence[Sample]) -> float:
    """The median of the samples no other process preempted, where at least
    ``min(3, len(samples))`` are; else the median of all (a loaded machine preempting most of
    a long call's samples).

    Args:
        samples: at least one.

    Returns:
        Seconds.
    """
    clean = [s.seconds for s in samples if not s.preempted]
    return statistics.median(clean if len(clean) >= min(3, len(samples))
                             else [s.seconds for s in samples])


def batch_samples(fn: Fn, device: str, *, budget_s: float = 0.02, batches: int = 3,
                  once: float | None = None, warm: bool = True) -> tuple[list[Sample], float]:
    """``batches`` batches of calls of ``fn`` of about ``budget_s`` each, after one warm-up
    call (CUDA events on ``"cuda"``; on the CPU by :func:`clock`).

    Args:
        fn: the call.
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one batch.
        batches: how many batches.
        once: seconds of one call, to size the batches (``None``: one call timed here).
        warm: make the warm-up call (``False``: ``fn`` ran before, and a call is long enough
            for a first call's cold caches not to matter).

    Returns:
        (the batches' samples, the seconds of one call used to size them).
    """
    cuda = device.startswith("cuda")
    now = clock(device)[1]

    def batch(n: int) -> Sample:
        switched = switches()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return Sample(float(start.elapsed_time(end)) / 1e3 / n, switches() != switched)
        begin = now()
        for _ in range(n):
            fn()
        seconds = (now() - begin) / n
        return Sample(seconds, switches() != switched)

    if warm or once is None:
        fn()
    if once is None:
        once = max(batch(1).seconds, 1e-7)
    n = int(min(2000, max(1, budget_s / once)))
    return [batch(n) for _ in range(batches)], once


def time_per_call(fn: Fn, device: str, *, budget_s: float = 0.02, batches: int = 3) -> float:
    """Seconds per call of ``fn``: one warm-up call, then ``batches`` batches of calls of about
    ``budget_s`` each (:func:`batch_samples`); their :func:`robust_median`.

    Args:
        fn: the call.
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one batch.
        batches: how many batches.

    Returns:
        Seconds.
    """
    return robust_median(batch_samples(fn, device, budget_s=budget_s, batches=batches)[0])


class Counted(NamedTuple):
    """What flopscope counts for one microbenchmark call (:func:`counted_call`)."""

    family: str
    flops: int
    bytes: int
    function: str
    inplace: bool
    op: str
    calls: int
    reduction: float
    fresh: int = 0


def counted_call(fn: Fn) -> Counted:
    """What flopscope counts for ``fn()``: the call of the most work names the family, the
    operator (its base name, ``"add_"``) and the reduction length
    (:func:`flopscope.estimate.families.reduction_length`); the others' (e.g. a ``t`` view)
    FLOPs and bytes are summed in."""
    from flopscope.core.counter import Counter
    from flopscope.estimate.families import family, reduction_length
    from flopscope.estimate.roofline import CallLog

    log = CallLog()
    with Counter(warn=False, observers=[log]):
        fn()
    if not log.records:
        return Counted("view", 0, 0, "", False, "", 0, 0.0, 0)
    main = max(log.records, key=lambda r: (r.flops, r.bytes))
    function = main.special[0] if main.special is not None else ""
    return Counted(family(main), sum(r.flops for r in log.records),
                   sum(r.bytes for r in log.records), function, main.fresh_bytes == 0,
                   op_base(main.op), len(log.records), reduction_length(main),
                   main.fresh_bytes or 0)


def op_base(op: str) -> str:
    """The base name of a report operator name: ``"aten.add_.Tensor"`` -> ``"add_"``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op
def per_call(fn: Fn, calls: int, device: str) -> float:
    """Seconds per call of ``fn``: the median of five batches of ``calls`` calls (after 20),
    by :func:`clock`."""
    now = clock(device)[1]
    for _ in range(20):
        fn()
    batches = []
    for _ in range(5):
        start = now()
        for _ in range(calls):
            fn()
        batches.append((now() - start) / calls)
    return statistics.median(batches)


def rotation_samples(fns: Sequence[Fn], device: str, *, budget_s: float = 0.01,
                     rounds: tuple[int, int] = (5, 200)) -> list[list[Sample]]:
    """Each of ``fns`` called in turn, as a model calls its layers: rounds of one call of each,
    every call timed alone by :func:`clock` (less the clock's own cost), after one warm-up
    round; enough rounds for about three ``budget_s`` per call, within ``rounds`` (least,
    most).

    Args:
        fns: the calls.
        device: ``"cpu"``, or ``"cuda"`` for the host's time issuing each call.
        budget_s: about a third of the time spent on each call.
        rounds: the least and the most rounds.

    Returns:
        Per call (in the order of ``fns``), its samples, one per round.
    """
    now = clock(device)[1]
    overhead = statistics.median(-now() + now() for _ in range(101))
    begin = time.perf_counter()
    for fn in fns:  # the warm-up round
        fn()
    round_s = max(time.perf_counter() - begin, 1e-7)
    count = int(min(rounds[1], max(rounds[0], 3 * budget_s * len(fns) / round_s)))
    times: list[list[Sample]] = [[] for _ in fns]
    for _ in range(count):
        for i, fn in enumerate(fns):
            switched = switches()
            start = now()
            fn()
            end = now()
            times[i].append(Sample(end - start - overhead, switches() != switched))
    return times


def time_in_rotation(fns: list[Fn], device: str, *, budget_s: float = 0.01) -> list[float]:
    """Seconds per call of each of ``fns`` called in turn, as a model calls its layers: the
    :func:`robust_median` of :func:`rotation_samples` (a warm-up round, then 5-200 rounds). A
    call timed in a loop of itself finds its code, its kernel library's descriptors and its
    weights in the caches; in a model, and in a rotation, the calls between evict them (a 1x1
    convolution takes 1.6x, a depthwise one up to 2x its time in a loop here).

    Args:
        fns: the calls.
        device: ``"cpu"``, or ``"cuda"`` for the host's time issuing each call (tiny calls,
            the device keeping up; a device's time needs :func:`time_per_call`).
        budget_s: about a third of the time spent on each call.

    Returns:
        Seconds per call, in the order of ``fns``.
    """
    return [max(robust_median(t), 1e-9)
            for t in rotation_samples(fns, device, budget_s=budget_s)]
