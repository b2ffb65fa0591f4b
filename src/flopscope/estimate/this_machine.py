"""Measure the machine this runs on: the ``this-machine`` profile.

:func:`measure_this_machine` times short probes (GEMMs, convolutions, special functions, a sum
and a copy through main memory, a copy inside the last-level cache) and returns a
:class:`~flopscope.estimate.profile.Hardware` of the rates they attained, marked
``measured=True``: attained rates, not a vendor's peaks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flopscope.errors import UsageError
from flopscope.estimate.profile import SPECIAL_FUNCTIONS, Hardware
from flopscope.render.units import human

__all__ = ["best_seconds", "last_level_cache_bytes", "measure_this_machine"]


def best_seconds(fn: Any, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``fn``, after one untimed warm-up call, by the
    calibration's clock (:func:`flopscope.estimate.timers.clock`: at one torch thread the
    thread's CPU time, so that peaks measured on a shared machine are the core's, not lowered
    by other processes, and the bound they give stays below what the core later runs).

    Args:
        fn: what to time (called with no arguments).
        repeats: timed calls.

    Returns:
        Seconds.
    """
    from flopscope.estimate.timers import clock

    now = clock("cpu")[1]
    fn()  # warm-up: first-touch page faults, library initialisation
    best = float("inf")
    for _ in range(repeats):
        start = now()
        fn()
        best = min(best, now() - start)
    return best


def last_level_cache_bytes() -> int | None:
    """Capacity of this CPU's last-level cache, as the operating system reports it (Linux
    ``/sys/devices/system/cpu/cpu0/cache``: the highest level of a data or unified cache; else
    ``sysconf(SC_LEVEL3_CACHE_SIZE)``/``SC_LEVEL2_CACHE_SIZE``), or ``None`` when it is not
    reported.

    Returns:
        Bytes, or ``None``.
    """
    import os

    best: tuple[int, int] | None = None
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for entry in root.glob("index*"):
            kind = (entry / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((entry / "level").read_text())
            text = (entry / "size").read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * scale
            if best is None or level > best[0]:
                best = (level, size)
    except (OSError, ValueError):
        best = None
    if best is not None and best[1] > 0:
        return best[1]
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if size > 0:
            return int(size)
    return None


def _counted_bytes(fn: Any) -> tuple[int, int]:
    """(bytes read, bytes written) that flopscope counts for ``fn()``: the roofline's own
    accounting, so that measured bandwidths and estimates use one unit (``copy_`` counts the
    destination as read too, which is what a CPU does: a store to a line not in cache first
    reads it, write-allocate)."""
    from flopscope.core.counter import Counter

    with Counter(warn=False) as counter:
        fn()
    total = counter.report.total()
    return int(total.bytes_read), int(total.bytes_written)


def _matrix_probes(dtype: torch.dtype, n: int) -> list[tuple[int, Any]]:
    """(FLOPs, a call) of the matrix products whose best rate is a profile's matrix rate: the
    n^3 GEMM, a 512^3 GEMM (its operands stay in cache, where BLAS runs fastest) and, in fp32, a
    1x1 convolution (a GEMM over the channels, run by the convolution library's own 1x1 kernel:
    ResNet-50's 1024 -> 256 channels on 14 x 14, batch 8, 2 x 8 x 14 x 14 x 1024 x 256 FLOPs).
    A roofline is a bound only if no kernel runs faster than its roof, so the roof is the fastest
    of them; the roofline charges 1x1 convolutions at this rate."""
    probes: list[tuple[int, Any]] = []
    for size in sorted({n, min(n, 512)}):
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        c = torch.empty(size, size, dtype=dtype)
        probes.append((2 * size**3, lambda a=a, b=b, c=c: torch.mm(a, b, out=c)))
    if dtype is torch.float32:
        x = torch.randn(8, 1024, 14, 14)
        w = torch.randn(256, 1024, 1, 1)
        probes.append((2 * 8 * 14 * 14 * 1024 * 256,
                       lambda: torch.nn.functional.conv2d(x, w)))
    return probes


def _special_probes(numel: int) -> list[tuple[str, Any, Any]]:
    """(function, a call over ``numel`` fp32 elements, the same call over one element) for each of
    :data:`SPECIAL_FUNCTIONS`, writing into preallocated outputs (``out=``: a fresh output would
    add the allocator's page faults to the function's time). Inputs are standard normal; the
    logarithms' and ``pow``'s are ``|x| + 0.5`` (positive). ``pow`` raises to 2.5, softmax and
    log-softmax run over rows of 1,024 elements."""
    aten = torch.ops.aten
    calls: dict[str, Any] = {
        "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2,
        "log10": torch.log10, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
        "erfc": torch.erfc, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
        "atan": torch.atan,
        "pow": lambda x, out: torch.pow(x, 2.5, out=out),
        "silu": lambda x, out: aten.silu.out(x, out=out),
        "gelu": lambda x, out: aten.gelu.out(x, out=out),
        "gelu_tanh": lambda x, out: aten.gelu.out(x, approximate="tanh", out=out),
        "softmax": lambda x, out: aten._softmax.out(x, -1, False, out=out),
        "log_softmax": lambda x, out: aten._log_softmax.out(x, -1, False, out=out),
    }
    row = 1024
    numel = max(numel // row, 1) * row
    probes: list[tuple[str, Any, Any]] = []
    for function in SPECIAL_FUNCTIONS:
        fn = calls[function]
        pair = []
        for shape in ((numel // row, row), (1, 1)):
            x = torch.randn(shape)
            if function.startswith("log") and function != "log_softmax" or function == "pow":
                x = x.abs() + 0.5
            out = torch.empty(shape)
            pair.append(lambda fn=fn, x=x, out=out: fn(x, out=out))
        probes.append((function, pair[0], pair[1]))
    return probes


def _special_rates(repeats: int, cache_bytes: int | None) -> dict[str, float]:
    """Evaluations per second of each special function in fp32 (:func:`_special_probes`), over a
    tensor whose input and output take a quarter of the last-level cache (at most 2^21
    elements; 2^18 when the capacity is unknown), so the function's arithmetic, not memory, sets
    the time. The rate is the marginal one, (n - 1) / (t(n) - t(1)): the time of a one-element
    call (dispatch, the fixed cost the roofline ignores) is taken off; n / t(n) when the
    difference is not positive. Each call is timed 4 x ``max(repeats, 5)`` times (best of)."""
    numel = min(max(cache_bytes // 32, 2**16), 2**21) if cache_bytes else 2**18
    rates: dict[str, float] = {}
    # short calls: timed more often than the GEMMs (a best of more runs is nearer the best rate
    # the machine attains, which is what a bound needs)
    runs = max(repeats, 5) * 4
    for function, fn, one in _special_probes(numel):
        elements = (numel // 1024) * 1024
        seconds = best_seconds(fn, runs)
        fixed = best_seconds(one, runs)
        marginal = seconds - fixed
        rates[function] = ((elements - 1) / marginal if marginal > 0 and elements > 1
                           else elements / seconds)
    return rates


def _convolution_probes() -> list[tuple[int, Any]]:
    """(FLOPs, a call) of fp32 3x3 convolutions, whose best rate is the profile's convolution
    rate (oneDNN's kernels, not the BLAS GEMM: on a CPU the two reach different fractions of
    the cores): 64 channels on 56 x 56 and 256 channels on 14 x 14, batch 8 (ResNet's shapes),
    2 x batch x C_out x H x W x C_in x 9 FLOPs each (padding 1 keeps H x W)."""
    probes: list[tuple[int, Any]] = []
    for channels, side in ((64, 56), (256, 14)):
        x = torch.randn(8, channels, side, side)
        w = torch.randn(channels, channels, 3, 3)
        flops = 2 * 8 * channels * side * side * channels * 9
        probes.append((flops, lambda x=x, w=w: torch.nn.functional.conv2d(x, w, padding=1)))
    return probes


def measure_this_machine(*, gemm_size: int = 2048, copy_mib: int = 256,
                         repeats: int = 3,
                         dtypes: tuple[str, ...] = ("fp32", "fp64", "bf16"),
                         special: bool = True) -> Hardware:
    """Measure the CPU this runs on: the best rate of an n^3 and a 512^3 GEMM per dtype (FP32,
    FP64, BF16; in FP32 also a 1x1 convolution, a GEMM over channels), the best of two FP32 3x3
    convolutions (the convolution rate), the FP32 element rate of each special function
    (:data:`SPECIAL_FUNCTIONS`, over a tensor in the last-level cache), main memory's
    read bandwidth (a sum over a buffer well beyond the caches) and write bandwidth (a copy of
    it: the time the copy takes beyond reading at the read bandwidth), and a copy that fits in
    the last-level cache (whose capacity the operating system reports:
    :func:`last_level_cache_bytes`), with torch's current thread count. Best of ``repeats``
    timings (after one warm-up; the cache copy, being short, is timed more often); the figures
    are *attained* rates, not the vendor's peaks, and the profile says so (``measured=True``).
    Bandwidths are the bytes flopscope counts for the sum and the copy (the copy's source
    read, destination read and written) over their times, the unit the roofline's estimates
    use; so the roofline gives the sum and the copy exactly their measured times.

    Args:
        gemm_size: n of the n x n x n GEMMs (2 n^3 FLOPs each).
        copy_mib: size of the summed and copied buffer in MiB (well beyond the last-level
            cache).
        repeats: timed runs per measurement.
        dtypes: the GEMM dtypes to measure, of ``fp32``, ``fp64``, ``bf16`` (``fp32`` always).
        special: measure the special-function rates (about 0.8 s with a 32 MiB L3, one
            thread); ``False``: the profile has none.

    Returns:
        The profile, named ``"this-machine"``.

    Raises:
        UsageError: a dtype that is not measured.
    """
    n = gemm_size
    rates: dict[str, float] = {}
    known = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
    unknown = sorted(set(dtypes) - set(known))
    if unknown:
        raise UsageError(f"measure_this_machine: cannot measure {', '.join(unknown)}; use "
                         f"{', '.join(known)}")
    for key, dtype in known.items():
        if key != "fp32" and key not in dtypes:
            continue
        # the roof is the best rate a GEMM attains: several probes, the fastest wins
        rates[key] = max(flops / best_seconds(fn, repeats)
                         for flops, fn in _matrix_probes(dtype, n))
    convolution = {"fp32": max(flops / best_seconds(fn, repeats)
                               for flops, fn in _convolution_probes())}
    numel = copy_mib * 2**20 // 4
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.empty_like(src)
    # reads: a read-only stream (a sum); writes: what a copy takes beyond its reads at that rate
    read_s = best_seconds(lambda: src.sum(), max(repeats, 10))
    sum_read, sum_written = _counted_bytes(lambda: src.sum())
    bandwidth = (sum_read + sum_written) / read_s
    copy_s = best_seconds(lambda: dst.copy_(src), max(repeats, 10))
    copy_read, copy_written = _counted_bytes(lambda: dst.copy_(src))
    write_s = copy_s - copy_read / bandwidth
    # a copy no slower than its reads alone: the machine's writes cost nothing extra that can be
    # measured, one bandwidth for both (the copy's, if it was the faster)
    write_bandwidth = copy_written / write_s if write_s > 0 else None
    if write_bandwidth is None:
        bandwidth = max(bandwidth, (copy_read + copy_written) / copy_s)
    cache_bytes = last_level_cache_bytes()
    cache_bandwidth = None
    what = ""
    if cache_bytes:
        # source and destination together a quarter of the cache: resident after the warm-up,
        # and beyond the private L1/L2 of one core on the CPUs this targets
        small = max(cache_bytes // 8 // 4, 1024)
        csrc = torch.ones(small, dtype=torch.float32)
        cdst = torch.empty_like(csrc)
        seconds = best_seconds(lambda: cdst.copy_(csrc), max(repeats, 5) * 20)
        cache_bandwidth = sum(_counted_bytes(lambda: cdst.copy_(csrc))) / seconds
        what = (f", {human(small * 4, 'B')} copy in the {human(cache_bytes, 'B')} last-level "
                "cache")
    special_rates = {"fp32": _special_rates(repeats, cache_bytes)} if special else {}
    threads = torch.get_num_threads()
    # a CPU GEMM runs on the same FMA units as everything else: one rate for matrix and vector
    return Hardware(
        name="this-machine",
        memory_bandwidth=bandwidth,
        matrix=dict(rates),
        vector=dict(rates),
        description=f"this machine, measured ({threads} threads): best of {n}^3 and 512^3 GEMM "
                    f"and a 1x1 convolution, best of two 3x3 convolutions, "
                    f"{'fp32 special-function element rates, ' if special else ''}"
                    f"{human(copy_mib * 2**20, 'B')} sum and copy{what}",
        source="measured by flopscope.estimate.measure_this_machine (cache capacity from the "
               "operating system)",
        measured=True,
        cache_bytes=cache_bytes,
        cache_bandwidth=cache_bandwidth,
        write_bandwidth=write_bandwidth,
        convolution=convolution,
        special=special_rates,
    )
