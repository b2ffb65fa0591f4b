"""Calibrate a hardware profile: microbenchmarks flopscope runs itself (:func:`calibrate`).

Each point is one operator on one shape, run eagerly from Python as a model runs it, timed per
call: a warm-up call, then three batches of calls sized to about ``budget_s`` each, the median
batch's time per call (on CUDA, CUDA events around each batch; on the CPU the wall clock). Its
FLOPs and bytes are what flopscope counts for the same call (one counted run of it), so points
and predictions use one unit. The workloads are generic shapes, no model's:

- matrix products: squares 16-1024, tall-skinny (M = 1-64 against 256-1024), small K (8-128),
  fp32, and a few bf16 squares;
- convolutions (fp32, batch 1): dense 3x3 and 1x1 over 16-256 channels, depthwise 3x3 and 7x7,
  a strided 7x7 with 3 input channels;
- element-wise (add, scalar multiply, ReLU, a copy; in place: add, multiply, a copy into a
  tensor), reductions (a full sum, row sums, row
  maxima) and normalisations (layer norm over rows of 256, batch norm in eval mode) over
  2^8-2^24 fp32 elements: cache-resident to streaming;
- pooling (3x3 stride-2 max pooling, 2x2 average pooling, global average pooling) over 16-128
  channels of 32-128 pixels square;
- special functions (exp, tanh, sigmoid, erf, GELU, SiLU, softmax and log-softmax over rows of
  256) over 2^10-2^22 elements;
- attention (``scaled_dot_product_attention``, 4 heads, sequence 64-1024, head size 32 and 64,
  causal or not);
- host time per eager call of a tiny operator of each family (8 x 8 inputs), the median of five
  batches of 400 calls.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from flopscope.errors import UsageError
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.profile import Hardware

__all__ = ["calibrate", "calibration_points", "host_times", "time_per_call"]

Fn = Callable[[], Any]


def _bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Fn:
    """``fn`` with its arguments bound (each benchmark holds its own tensors)."""
    return lambda: fn(*args, **kwargs)


def time_per_call(fn: Fn, device: str, *, budget_s: float = 0.02, batches: int = 3) -> float:
    """Seconds per call of ``fn``: one warm-up call, then ``batches`` batches of calls of about
    ``budget_s`` each; the median batch's time per call (CUDA events on ``"cuda"``).

    Args:
        fn: the call.
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one batch.
        batches: how many batches.

    Returns:
        Seconds.
    """
    cuda = device.startswith("cuda")

    def batch(n: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / n
        begin = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - begin) / n

    fn()
    once = max(batch(1), 1e-7)
    n = int(min(2000, max(1, budget_s / once)))
    return statistics.median(batch(n) for _ in range(batches))


def _counted(fn: Fn) -> tuple[str, int, int, str, bool]:
    """(family, FLOPs, bytes, special function, in place) flopscope counts for ``fn()``: the
    call of the most work (the others, e.g. a ``t`` view, are summed in)."""
    from flopscope.core.counter import Counter
    from flopscope.estimate.predict import family
    from flopscope.estimate.roofline import CallLog

    log = CallLog()
    with Counter(warn=False, observers=[log]):
        fn()
    if not log.records:
        return "view", 0, 0, "", False
    main = max(log.records, key=lambda r: (r.flops, r.bytes))
    function = main.special[0] if main.special is not None else ""
    return (family(main), sum(r.flops for r in log.records),
            sum(r.bytes for r in log.records), function, main.fresh_bytes == 0)


def _matmul(device: str) -> list[tuple[str, str, Fn]]:
    shapes = [(s, s, s) for s in (16, 32, 64, 128, 256, 512, 1024)]
    shapes += [(m, n, n) for m in (1, 8, 64) for n in (256, 1024)]  # tall-skinny
    shapes += [(n, n, k) for n in (256, 1024) for k in (8, 32, 128)]  # small K
    shapes += [(4096, 64, 64), (2048, 256, 32)]  # many rows, few columns
    out: list[tuple[str, str, Fn]] = []
    for dtype, grid in ((torch.float32, shapes),
                        (torch.bfloat16, [(s, s, s) for s in (64, 256, 512)])):
        for m, n, k in grid:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            out.append((f"mm {m}x{n}x{k}", _key(dtype), _bind(torch.mm, a, b)))
    return out


def _conv(device: str) -> list[tuple[str, str, Fn]]:
    # (in, out, side, kernel, stride, groups)
    grid = [(c, c, s, 3, 1, 1) for c, s in ((16, 64), (64, 32), (128, 16), (256, 8))]
    grid += [(c, 2 * c, s, 1, 1, 1) for c, s in ((32, 32), (128, 16), (256, 8))]
    grid += [(c, c, s, k, 1, c) for c, s, k in ((32, 64, 3), (128, 32, 3), (512, 8, 3),
                                               (128, 32, 7))]
    grid += [(3, 32, 128, 7, 2, 1), (64, 128, 32, 3, 2, 1)]
    out: list[tuple[str, str, Fn]] = []
    for cin, cout, side, k, stride, groups in grid:
        x = torch.randn(1, cin, side, side, device=device)
        w = torch.randn(cout, cin // groups, k, k, device=device)
        out.append((f"conv2d {cin}->{cout} {side}x{side} k{k} s{stride} g{groups}", "fp32",
                    _bind(F.conv2d, x, w, padding=k // 2, stride=stride, groups=groups)))
    return out


def _streams(device: str) -> list[tuple[str, str, Fn]]:
    out: list[tuple[str, str, Fn]] = []
    for p in (8, 12, 16, 18, 20, 22, 24):
        n = 2**p
        x = torch.randn(n, device=device)
        zeros, dst = torch.zeros_like(x), torch.empty_like(x)  # x + 0 in place: x stays
        rows = x.view(-1, 256)
        ones = torch.ones(n // 256 if n >= 256 else 1, device=device)
        calls: dict[str, Fn] = {
            "add": _bind(torch.add, x, x), "mul": _bind(torch.mul, x, 2.0),
            "add_ (in place)": _bind(x.add_, zeros), "mul_ (in place)": _bind(x.mul_, 1.0),
            "copy_ (into)": _bind(dst.copy_, x),
            "relu": _bind(torch.relu, x), "copy": _bind(torch.clone, x),
            "sum": _bind(torch.sum, x), "row sum": _bind(torch.sum, rows, -1),
            "row max": _bind(torch.amax, rows, -1),
            "layer_norm": _bind(F.layer_norm, rows, (256,)),
            "batch_norm": _bind(F.batch_norm, rows.view(1, -1, 256), ones, ones,
                                training=False),
        }
        out += [(f"{name} 2^{p}", "fp32", fn) for name, fn in calls.items()]
    return out


def _pooling(device: str) -> list[tuple[str, str, Fn]]:
    out: list[tuple[str, str, Fn]] = []
    for channels, side in ((16, 32), (32, 64), (64, 128), (128, 128)):
        x = torch.randn(1, channels, side, side, device=device)
        out += [(f"max_pool2d 3x3 s2 {channels}x{side}x{side}", "fp32",
                 _bind(F.max_pool2d, x, 3, 2, 1)),
                (f"avg_pool2d 2x2 s2 {channels}x{side}x{side}", "fp32",
                 _bind(F.avg_pool2d, x, 2, 2)),
                (f"adaptive_avg_pool2d 1 {channels}x{side}x{side}", "fp32",
                 _bind(F.adaptive_avg_pool2d, x, 1))]
    return out


def _special(device: str) -> list[tuple[str, str, Fn]]:
    out: list[tuple[str, str, Fn]] = []
    for p in (10, 14, 18, 22):
        x = torch.randn(2**p, device=device)
        rows = x.view(-1, 256)
        calls: dict[str, Fn] = {
            "exp": _bind(torch.exp, x), "tanh": _bind(torch.tanh, x),
            "sigmoid": _bind(torch.sigmoid, x), "erf": _bind(torch.erf, x),
            "gelu": _bind(F.gelu, x), "silu": _bind(F.silu, x),
            "softmax": _bind(torch.softmax, rows, -1),
            "log_softmax": _bind(torch.log_softmax, rows, -1),
        }
        out += [(f"{name} 2^{p}", "fp32", fn) for name, fn in calls.items()]
    return out


def _attention(device: str) -> list[tuple[str, str, Fn]]:
    out: list[tuple[str, str, Fn]] = []
    for seq in (64, 256, 1024):
        for head in (32, 64):
            q = torch.randn(1, 4, seq, head, device=device)
            for causal in (False, True):
                out.append((f"sdpa 4x{seq}x{head}{' causal' if causal else ''}", "fp32",
                            _bind(F.scaled_dot_product_attention, q, q, q, is_causal=causal)))
    return out


def _key(dtype: torch.dtype) -> str:
    from flopscope.estimate.profile import dtype_key

    return dtype_key(dtype) or "fp32"


def host_times(device: str, *, calls: int = 400) -> dict[str, float]:
    """Seconds per eager call of a tiny operator (8 x 8 inputs) of each family: the median of
    five batches of ``calls`` calls, by the wall clock (on CUDA: what the host spends issuing
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
    out: dict[str, float] = {}
    with torch.no_grad():
        for fam, fn in tiny.items():
            for _ in range(20):
                fn()
            batches = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                batches.append((time.perf_counter() - start) / calls)
            out[fam] = statistics.median(batches)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return out


def calibration_points(device: str = "cpu", *, budget_s: float = 0.02,
                       progress: Callable[[str], None] | None = None) -> list[Point]:
    """Time every microbenchmark (see the module docstring) on ``device``.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one timed batch.
        progress: called with a line per group.

    Returns:
        The points.
    """
    points: list[Point] = []
    with torch.no_grad():
        for group, make in (("matrix products", _matmul), ("convolutions", _conv),
                            ("element-wise, reductions, normalisations", _streams),
                            ("pooling", _pooling), ("special functions", _special),
                            ("attention", _attention)):
            start = time.perf_counter()
            for what, dtype, fn in make(device):
                fam, flops, nbytes, function, inplace = _counted(fn)
                seconds = time_per_call(fn, device, budget_s=budget_s)
                points.append(Point(fam, dtype, what, flops, nbytes, seconds, function, inplace))
            if progress is not None:
                progress(f"{group}: {time.perf_counter() - start:.1f} s")
    return points


def calibrate(hardware: Hardware, *, device: str | None = None, threads: int | None = None,
              budget_s: float = 0.02,
              progress: Callable[[str], None] | None = None) -> Hardware:
    """Calibrate ``hardware`` on the machine this runs on: the microbenchmarks' raw points and
    the host time per call (:mod:`flopscope.estimate.calibration`), stored in a copy of the
    profile, from which estimates predict time (:mod:`flopscope.estimate.predict`).

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
        host = host_times(device)
        points = calibration_points(device, budget_s=budget_s, progress=progress)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    name = device if device == "cpu" else f"cuda ({torch.cuda.get_device_name()})"
    calibration = Calibration(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=name if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        threads=used,
        versions={"torch": torch.__version__, "flopscope": __version__,
                  "python": platform.python_version()},
        host_s=host, points=tuple(points))
    return dataclasses.replace(hardware, calibration=calibration)
