"""The host's costs beside the operators' own time, each measured by a probe on the machine the
calibration runs on: per eager call of a tiny operator per family (:func:`host_times`) and per
operator (:func:`op_host_times`), after the caches were evicted (:func:`evicted_host_times`),
per page-faulting allocation (:func:`fault_cost`) and per ``nn.Module`` call
(:func:`module_call_time`). Stored in the profile's calibration by
:func:`flopscope.estimate.calibrate.calibrate`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from flopscope.estimate.timers import clock, counted_call, per_call
from flopscope.estimate.workloads import Fn, host_calls

__all__ = ["EVICTIONS", "MMAP_BYTES", "after_host_times", "evicted_host_times", "fault_cost", "host_times",
           "median_rows", "median_table", "module_call_time", "op_host_times"]


def median_table(tables: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per key, the median of its values over the tables holding it: a probe run in each pass
    of a calibration (:func:`flopscope.estimate.calibrate.calibrate`), each run a few seconds
    apart, so a moment of contention moves one run, not the probe.

    Args:
        tables: the runs' tables.

    Returns:
        Key -> the median.
    """
    keys = dict.fromkeys(k for t in tables for k in t)
    return {k: statistics.median(t[k] for t in tables if k in t) for k in keys}


def median_rows(tables: Sequence[Mapping[str, tuple[float, ...]]]) -> dict[str, tuple[float, ...]]:
    """Per key, the median at each position over the tables holding it (as
    :func:`median_table`; a key's rows are of one length, :data:`EVICTIONS`'s).

    Args:
        tables: the runs' tables.

    Returns:
        Key -> the medians.
    """
    keys = dict.fromkeys(k for t in tables for k in t)
    return {k: tuple(statistics.median(col) for col in zip(*(t[k] for t in tables if k in t),
                                                            strict=True))
            for k in keys}


def host_times(device: str, *, calls: int = 400) -> dict[str, float]:
    """Seconds per eager call of a tiny operator (8 x 8 inputs) of each family: the median of
    five batches of ``calls`` calls, by :func:`clock` (on CUDA: what the host spends issuing
    them, without waiting for the device).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        calls: calls per batch.

    Returns:
        Family -> seconds.
    """
    x = torch.randn(8, 8, device=device)
    img = torch.randn(1, 4, 8, 8, device=device)
    w = torch.randn(4, 4, 3, 3, device=device)
    q = torch.randn(1, 1, 8, 8, device=device)
    tiny: dict[str, Fn] = {
        "elementwise": lambda: torch.add(x, x), "matmul": lambda: torch.mm(x, x),
        "conv": lambda: F.conv2d(img, w), "attention": lambda: F.scaled_dot_product_attention(
            q, q, q), "reduction": lambda: x.sum(-1), "normalization": lambda: F.layer_norm(
            x, (8,)), "special": lambda: torch.exp(x), "view": lambda: x.view(64),
        "pooling": lambda: F.max_pool2d(img, 2),
    }
    with torch.no_grad():
        out = {fam: per_call(fn, calls, device) for fam, fn in tiny.items()}
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return out


def op_host_times(device: str, *, calls: int = 400) -> dict[str, float]:
    """Seconds per eager call of each operator of the microbenchmarks at its tiniest
    (:func:`flopscope.estimate.workloads.host_calls`), keyed by the ATen operator's base name
    (``"addmm"``, ``"add_"``): the median of five batches of ``calls`` calls. Where the tiny call
    runs several operators (``F.batch_norm``'s ``empty``), the time is its main operator's less
    a view's per other call; where two tiny calls share an operator, the faster.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        calls: calls per batch.

    Returns:
        Operator -> seconds.
    """
    out: dict[str, float] = {}
    with torch.no_grad():
        tiny = host_calls(device)
        view = per_call(tiny["view"], calls, device)
        for fn in tiny.values():
            c = counted_call(fn)
            op, n = c.op, c.calls
            if not op:
                continue
            seconds = max(per_call(fn, calls, device) - (n - 1) * view, view)
            out[op] = min(seconds, out.get(op, seconds))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return out


EVICTIONS = (1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)
"""Bytes moved just before a timed tiny call by :func:`evicted_host_times` (256 KiB to 64 MiB:
past the L2 caches to past the last-level cache of this class of machine)."""


def evicted_host_times(device: str, *, samples: int = 9) -> dict[str, tuple[float, ...]]:
    """Host time per call of each operator's tiny call (:func:`op_host_times`) when the call
    before it moved :data:`EVICTIONS` bytes: an in-place add over a buffer of half that many
    bytes (read and written), then the tiny call, timed alone; the median of ``samples``.

    In a model every call follows another that moved its activations through the caches, and
    evicted part of what the interpreter, the dispatcher and the kernel library keep there: a
    view costs 1.5 us in a loop here, 4.6 us after 1 MiB moved, 40 us after 64 MiB. Empty on
    CUDA (the device's memory is not the host's caches).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        samples: timed calls per operator and size.

    Returns:
        Operator -> seconds at each of :data:`EVICTIONS`.
    """
    if device.startswith("cuda"):
        return {}
    now = clock(device)[1]
    buffers = [torch.zeros(n // 8) for n in EVICTIONS]  # fp32: n / 2 bytes, read and written
    out: dict[str, tuple[float, ...]] = {}
    with torch.no_grad():
        for fn in host_calls(device).values():
            op = counted_call(fn).op
            if not op or op in out:
                continue
            row = []
            for buf in buffers:
                times = []
                for _ in range(samples):
                    buf.add_(0.0)
                    start = now()
                    fn()
                    times.append(now() - start)
                row.append(statistics.median(times))
            out[op] = tuple(row)
    return out


def after_host_times(device: str, *, samples: int = 3) -> dict[str, float]:
    """How much longer a tiny call takes right after a convolution or a matrix product than
    right after an in-place add that moved the same bytes (the call before
    :func:`evicted_host_times`'s): per family of the call before (``"conv"``, ``"matmul"``),
    the median over the loop-timed operators' tiny calls (:func:`op_host_times`'s) of the
    difference of their medians over ``samples`` calls after each, by :func:`clock`.

    The producers are generic (a 3 x 3 convolution of 128 channels over 14 x 14 pixels, an
    ``mm`` of 512 x 512 by 512 x 64; no model's layer). A kernel library's call (oneDNN's
    convolution, MKL's product: their code, descriptors and packing buffers) evicts more of what
    the interpreter and the dispatcher keep in the caches than a streaming add of its bytes:
    here a ReLU of 1 x 440 x 7 x 7 took 7.3 us after a 690 KB add and 18.4 after a 1 x 1
    convolution at 2 threads, 6.3 and 8.7 at 1 (``benchmarks/call_before.py``, docs/prediction.md
    round 9). Empty on CUDA.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        samples: timed calls per operator after each producer.

    Returns:
        Family of the call before -> seconds (may be negative: not clamped here).
    """
    from flopscope.estimate.families import ROTATED_FAMILIES

    if device.startswith("cuda"):
        return {}
    now = clock(device)[1]
    img, w = torch.randn(1, 128, 14, 14), torch.randn(128, 128, 3, 3)
    a, b = torch.randn(512, 512), torch.randn(512, 64)
    producers: dict[str, Fn] = {"conv": lambda: F.conv2d(img, w, padding=1),
                                "matmul": lambda: torch.mm(a, b)}
    # the reference: an in-place add over half each producer's bytes (read and written)
    adds = {k: torch.zeros(max(counted_call(fn).bytes // 8, 1)) for k, fn in producers.items()}
    diffs: dict[str, list[float]] = {k: [] for k in producers}
    with torch.no_grad():
        seen: set[str] = set()
        for fn in host_calls(device).values():
            c = counted_call(fn)
            if not c.op or c.op in seen or c.family in ROTATED_FAMILIES:
                continue
            seen.add(c.op)
            for fam, produce in producers.items():
                after, reference = [], []
                for _ in range(samples):
                    produce()
                    start = now()
                    fn()
                    after.append(now() - start)
                    adds[fam].add_(0.0)
                    start = now()
                    fn()
                    reference.append(now() - start)
                diffs[fam].append(statistics.median(after) - statistics.median(reference))
    return {k: statistics.median(v) for k, v in diffs.items() if v}


MMAP_BYTES = 32 << 20
"""glibc's malloc serves an allocation of more than its largest dynamic mmap threshold (32 MiB
on 64-bit: ``DEFAULT_MMAP_THRESHOLD_MAX``, the malloc(3) and mallopt(3) manual pages) with a
fresh mapping, and unmaps it when freed: every call allocating that much page-faults on each
page it writes. Smaller allocations come, once the threshold has risen, from memory the heap
keeps (a steady-state forward of every torchvision classifier here takes no page fault; a
training step of BERT-base takes 80,000: its 94 MB embedding gradient and AdamW's temporaries
of the same size)."""


def fault_cost(device: str, *, samples: int = 5) -> tuple[int, float]:
    """What a fresh allocation of at least :data:`MMAP_BYTES` costs per byte beyond the work
    written into it: ``samples`` times, a 128 MiB fp32 tensor allocated, zeroed and freed, and
    the same zeroing of a tensor kept, interleaved, each by :func:`clock`; the medians'
    difference per byte (the page faults, the zeroing of each page by the kernel, the
    unmapping). 128 MiB: more than glibc's heap keeps free after its threshold rose (twice the
    threshold, 64 MiB), which would serve a smaller one without a fault.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (CUDA's caching allocator keeps device memory: not
            modelled).
        samples: timed pairs.

    Returns:
        (:data:`MMAP_BYTES`, seconds per byte), or ``(0, 0.0)`` where not modelled: on CUDA,
        with a C library other than glibc, or when the fresh allocations took no page fault
        (an allocator that keeps the memory).
    """
    import platform

    if device.startswith("cuda") or platform.libc_ver()[0] != "glibc":
        return 0, 0.0
    import resource

    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    now = clock(device)[1]
    n = MMAP_BYTES  # elements: 4 x MMAP_BYTES bytes
    kept = torch.zeros(n)
    fresh, reused, faults = [], [], []
    for _ in range(samples):
        before = resource.getrusage(who).ru_minflt
        start = now()
        x = torch.empty(n)
        x.zero_()
        del x
        fresh.append(now() - start)
        faults.append(resource.getrusage(who).ru_minflt - before)
        start = now()
        kept.zero_()
        reused.append(now() - start)
    if sum(faults) < 1:
        return 0, 0.0
    return MMAP_BYTES, max(statistics.median(fresh) - statistics.median(reused), 0.0) / (4 * n)


def module_call_time(device: str, *, modules: int = 200, samples: int = 21) -> float:
    """Python's time per ``nn.Module`` call outside its operators: a chain of ``modules``
    distinct modules, each a ``view``, against the same views called bare, interleaved
    ``samples`` times; the medians' difference per module (``Module.__call__``'s hooks
    bookkeeping and the frame of a one-line ``forward``), by :func:`clock`.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (host time either way).
        modules: modules in the chain.
        samples: timed pairs.

    Returns:
        Seconds per module call (0 or more).
    """
    from torch import nn

    class _View(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(-1)

    chain = [_View() for _ in range(modules)]
    x = torch.zeros(64, device=device)
    now = clock(device)[1]

    def called() -> None:
        y = x
        for m in chain:
            y = m(y)

    def bare() -> None:
        y = x
        for _ in chain:
            y = y.view(-1)

    with torch.no_grad():
        for fn in (called, bare, called, bare):
            fn()
        with_modules, without = [], []
        for _ in range(samples):
            start = now()
            called()
            with_modules.append(now() - start)
            start = now()
            bare()
            without.append(now() - start)
    return max(statistics.median(with_modules) - statistics.median(without), 0.0) / modules
