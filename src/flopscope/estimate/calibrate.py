"""Calibrate a hardware profile: microbenchmarks flopscope runs itself (:func:`calibrate`).

Each point is one operator on one shape (:mod:`flopscope.estimate.workloads`: generic shapes, no
model's), run eagerly from Python as a model runs it, timed per call: a warm-up call, then three
batches of calls sized to about ``budget_s`` each, the median batch's time per call (on CUDA,
CUDA events around each batch; on the CPU the wall clock). Its FLOPs and bytes are what
flopscope counts for the same call (one counted run of it), so points and predictions use one
unit, and its operator is the ATen operator flopscope records for it.

Host time per eager call is measured twice over: per family (a tiny operator of each, as
before) and per operator (:func:`op_host_times`: each operator's tiny variant,
:func:`flopscope.estimate.workloads.host_calls`), each the median of five batches of 400 calls.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from flopscope.errors import UsageError
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.chains import chain_points
from flopscope.estimate.framework import framework_costs
from flopscope.estimate.profile import Hardware
from flopscope.estimate.workloads import Fn, Workload, host_calls, workloads

__all__ = ["EVICTIONS", "MMAP_BYTES", "Counted", "calibrate", "calibration_points", "clock",
           "counted_call", "evicted_host_times", "fault_cost", "module_call_time", "host_times",
           "op_base", "op_host_times", "time_in_rotation", "time_per_call"]


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


def _per_call(fn: Fn, calls: int, device: str) -> float:
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
        out = {fam: _per_call(fn, calls, device) for fam, fn in tiny.items()}
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
        view = _per_call(tiny["view"], calls, device)
        for fn in tiny.values():
            c = counted_call(fn)
            op, n = c.op, c.calls
            if not op:
                continue
            seconds = max(_per_call(fn, calls, device) - (n - 1) * view, view)
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


def calibration_points(device: str = "cpu", *, budget_s: float = 0.01,
                       progress: Callable[[str], None] | None = None) -> list[Point]:
    """Time every microbenchmark (see the module docstring) on ``device``: on a CPU, the
    families of :data:`~flopscope.estimate.families.ROTATED_FAMILIES` in rotation within their
    group (:func:`time_in_rotation`), the others each in a loop of itself
    (:func:`time_per_call`: the streaming operators' activations stay in the caches, as a model's
    just-written ones do; their host time's growth in a model is measured apart,
    :func:`evicted_host_times`).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one timed batch.
        progress: called with a line per group.

    Returns:
        The points.
    """
    from flopscope.estimate.families import ROTATED_FAMILIES

    points: list[Point] = []
    with torch.no_grad():
        groups: dict[str, list[Workload]] = {}
        for w in workloads(device):
            groups.setdefault(w.group, []).append(w)
        for group, todo in groups.items():
            start = time.perf_counter()
            counted = [counted_call(w.fn) for w in todo]
            rotated = [i for i, c in enumerate(counted)
                       if c.family in ROTATED_FAMILIES and not device.startswith("cuda")]
            seconds = dict(zip(rotated, time_in_rotation([todo[i].fn for i in rotated], device,
                                                         budget_s=budget_s), strict=True))
            for i, (w, c) in enumerate(zip(todo, counted, strict=True)):
                t = seconds[i] if i in seconds else time_per_call(w.fn, device, budget_s=budget_s)
                points.append(Point(c.family, w.dtype, w.what, c.flops, c.bytes, t, c.function,
                                    c.inplace, c.op, c.reduction, c.fresh))
            if progress is not None:
                progress(f"{group}: {time.perf_counter() - start:.1f} s")
    return points


def calibrate(hardware: Hardware, *, device: str | None = None, threads: int | None = None,
              budget_s: float = 0.01,
              progress: Callable[[str], None] | None = None) -> Hardware:
    """Calibrate ``hardware`` on the machine this runs on: the microbenchmarks' raw points, the
    host time per call (:mod:`flopscope.estimate.calibration`) and, last, the chains of layers
    over fresh outputs timed whole against what the points predict for them
    (:mod:`flopscope.estimate.chains`), stored in a copy of the profile, from which estimates
    predict time (:mod:`flopscope.estimate.predict`).

    Args:
        hardware: the profile the calibration is stored in (its peaks stay the bound's).
        device: ``"cpu"`` or ``"cuda"``; ``None``: CUDA when available, else the CPU.
        threads: torch's intra-op threads during the run (put back after); ``None``: as set.
        budget_s: the time of one timed batch (three per point).
        progress: called with a line per group of points.

    Returns:
        The calibrated profile.

    Raises:
        UsageError: ``cuda`` without a CUDA device, or threads below 1.
    """
    import dataclasses
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed version (the package's __init__ would be an import cycle)
        __version__ = version("flopscope")
    except PackageNotFoundError:  # run from a source tree that is not installed
        __version__ = "unknown"

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"calibrate: device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("calibrate: device 'cuda' asked for, but torch sees no CUDA device; "
                         "use device='cpu'")
    if threads is not None and threads < 1:
        raise UsageError(f"calibrate: threads must be at least 1, not {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        mmap_bytes, fault = fault_cost(device)  # first: before the heap has grown
        host = host_times(device)
        host_op = op_host_times(device)
        evicted = evicted_host_times(device)
        module_s = module_call_time(device)
        dtensor_s, fsdp_s = framework_costs(clock(device)[1])  # host time: any device
        points = calibration_points(device, budget_s=budget_s, progress=progress)
        name = device if device == "cpu" else f"cuda ({torch.cuda.get_device_name()})"
        calibration = Calibration(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            device=name if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
            threads=torch.get_num_threads(),
            versions={"torch": torch.__version__, "flopscope": __version__,
                      "python": platform.python_version()},
            host_s=host, points=tuple(points), host_op_s=host_op, clock=clock(device)[0],
            host_evicted_s=evicted, evictions=EVICTIONS if evicted else (), mmap_bytes=mmap_bytes,
            fault_s_per_byte=fault, module_call_s=module_s, dtensor_call_s=dtensor_s,
            fsdp_collective_s=fsdp_s)
        # last: the chains' prediction is the points'
        chained = chain_points(dataclasses.replace(hardware, calibration=calibration), device,
                               lambda fn, dev: time_per_call(fn, dev, budget_s=2 * budget_s))
    finally:
        torch.set_num_threads(before)
    return dataclasses.replace(hardware, calibration=dataclasses.replace(calibration,
                                                                         chains=chained))
