"""How a calibration times and counts one call: the clock (:func:`clock`), a call timed in a loop
of itself (:func:`time_per_call`, :func:`per_call`) or in rotation with others as a model calls
its layers (:func:`time_in_rotation`), and what flopscope counts for it (:func:`counted_call`).
The microbenchmarks (:mod:`flopscope.estimate.calibrate`), the host probes
(:mod:`flopscope.estimate.host_probes`) and the chains (:mod:`flopscope.estimate.chains`) all
time through these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from flopscope.estimate.workloads import Fn

__all__ = ["Counted", "clock", "counted_call", "op_base", "per_call", "time_in_rotation",
           "time_per_call"]


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


def time_per_call(fn: Fn, device: str, *, budget_s: float = 0.02, batches: int = 3) -> float:
    """Seconds per call of ``fn``: one warm-up call, then ``batches`` batches of calls of about
    ``budget_s`` each; the median batch's time per call (CUDA events on ``"cuda"``; on the CPU
    by :func:`clock`).

    Args:
        fn: the call.
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one batch.
        batches: how many batches.

    Returns:
        Seconds.
    """
    cuda = device.startswith("cuda")
    now = clock(device)[1]

    def batch(n: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / n
        begin = now()
        for _ in range(n):
            fn()
        return (now() - begin) / n

    fn()
    once = max(batch(1), 1e-7)
    n = int(min(2000, max(1, budget_s / once)))
    return statistics.median(batch(n) for _ in range(batches))


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


def time_in_rotation(fns: list[Fn], device: str, *, budget_s: float = 0.01) -> list[float]:
    """Seconds per call of each of ``fns`` called in turn, as a model calls its layers: rounds
    of one call of each, every call timed alone by :func:`clock` (less the clock's own cost),
    the median over the rounds (one warm-up round, then enough for about three ``budget_s``
    per call, 5-200 rounds). A call timed in a loop of itself finds its code, its kernel
    library's descriptors and its weights in the caches; in a model, and in a rotation, the
    calls between evict them (a 1x1 convolution takes 1.6x, a depthwise one up to 2x its time
    in a loop here).

    Args:
        fns: the calls.
        device: ``"cpu"``, or ``"cuda"`` for the host's time issuing each call (tiny calls,
            the device keeping up; a device's time needs :func:`time_per_call`).
        budget_s: about a third of the time spent on each call.

    Returns:
        Seconds per call, in the order of ``fns``.
    """
    now = clock(device)[1]
    overhead = statistics.median(-now() + now() for _ in range(101))
    begin = time.perf_counter()
    for fn in fns:  # the warm-up round
        fn()
    round_s = max(time.perf_counter() - begin, 1e-7)
    rounds = int(min(200, max(5, 3 * budget_s * len(fns) / round_s)))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = now()
            fn()
            times[i].append(now() - start - overhead)
    return [max(statistics.median(t), 1e-9) for t in times]
