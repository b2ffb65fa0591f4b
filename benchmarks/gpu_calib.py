"""Raw calibration points measured on the GPU (issue 28 part 5, for issue 29's fitted model).

Each point is one operator on one shape and dtype, timed on the device (CUDA events around
``repeat`` back-to-back calls after a warm-up, the median of three such batches) and on the host
(the wall time of ``host_calls`` calls of the same operator on tiny inputs, divided by their
number: what eager PyTorch spends per call before a kernel runs, when the device is not the
bottleneck). Nothing is fitted here: the points are stored raw, with the device and versions, and
the prediction issue fits and validates on them (no model under validation is among them).

In dry mode (no CUDA) the same loops run on tiny CPU shapes with ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def _timer(device: str) -> Callable[[Callable[[], Any], int], float]:
    """Seconds per call of ``fn`` over ``repeat`` calls (median of three batches)."""
    def cuda(fn: Callable[[], Any], repeat: int) -> float:
        times = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeat):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / repeat)
        return statistics.median(times)

    def cpu(fn: Callable[[], Any], repeat: int) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            times.append((time.perf_counter() - start) / repeat)
        return statistics.median(times)

    return cuda if device == "cuda" else cpu


def _point(timer: Callable[[Callable[[], Any], int], float], fn: Callable[[], Any],
           budget_s: float = 0.02) -> tuple[float, int]:
    """Warm up, size the batch so it runs about ``budget_s``, time it."""
    fn()
    once = max(timer(fn, 1), 1e-7)
    repeat = int(min(200, max(3, budget_s / once)))
    return timer(fn, repeat), repeat


def gemm_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Matrix products: squares, decode-like (small M), small K, per dtype."""
    timer = _timer(device)
    if dry:
        shapes, dtypes = [(32, 32, 32), (1, 64, 64)], [torch.float32]
    else:
        squares = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)]
        skinny = [(m, 4096, 4096) for m in (1, 8, 32, 128)] + [(m, 14336, 4096) for m in (1, 16)]
        small_k = [(4096, 4096, k) for k in (16, 64, 256)]
        shapes = squares + skinny + small_k
        dtypes = [torch.bfloat16, torch.float16, torch.float32]
    rows = []
    for dtype in dtypes:
        for m, n, k in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            seconds, repeat = _point(timer, lambda a=a, b=b: torch.mm(a, b))
            rows.append({"op": "mm", "dtype": str(dtype).removeprefix("torch."), "m": m, "n": n,
                         "k": k, "seconds": seconds, "repeat": repeat,
                         "tflops": 2 * m * n * k / seconds / 1e12})
    return rows


def captured(fn: Callable[[], Any], warmups: int = 1) -> Any:
    """``fn`` captured as a CUDA graph (``torch.cuda.CUDAGraph``), after warm-up calls on a side
    stream, as PyTorch's CUDA-graph notes do it: replaying it launches no kernel from the host."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
        with torch.cuda.graph(graph):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


_OTHERS: dict[int, torch.Tensor] = {}


def _other(x: torch.Tensor) -> torch.Tensor:
    """A second tensor like ``x`` (made once per tensor), so a binary operator reads two."""
    if id(x) not in _OTHERS:
        _OTHERS.clear()
        _OTHERS[id(x)] = torch.empty_like(x).fill_(1.0)
    return _OTHERS[id(x)]


def cache_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Copies whose source and destination fit in the L2 (up to 2 x 16 MiB of 50 MiB), many in a
    row inside one CUDA graph (no host launch between them): the cache's bandwidth, which the
    roofline lacks for NVIDIA GPUs (a bound charged at HBM bandwidth was beaten by an L2-resident
    ReLU on the H200). In dry mode: plain copies timed on the CPU."""
    timer = _timer(device)
    rows = []
    for mib in ([1] if dry else [1, 4, 8, 16]):
        x = torch.empty(mib * 2**20 // 4, device=device)
        y = torch.empty_like(x)
        copies = 4 if dry else 200
        if device == "cuda":
            def copy_all(x: torch.Tensor = x, y: torch.Tensor = y, n: int = copies) -> None:
                for _ in range(n):
                    y.copy_(x)

            seconds = timer(captured(copy_all).replay, 5) / copies
        else:
            seconds = timer(lambda x=x, y=y: y.copy_(x), copies)
        nbytes = 2 * x.numel() * 4
        rows.append({"op": "copy_in_graph" if device == "cuda" else "copy", "mib": mib,
                     "bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9})
    return rows


def stream_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Element-wise, reductions, normalisation and softmax by size (cache-resident to
    streaming); bytes are what the operator must read and write once."""
    timer = _timer(device)
    sizes = [1 << 10, 1 << 14] if dry else [1 << p for p in (12, 16, 20, 22, 24, 26, 28)]
    dtypes = [torch.float32] if dry else [torch.float32, torch.bfloat16]
    ops: dict[str, tuple[Callable[[torch.Tensor], Any], int]] = {  # fn, tensors moved
        # add reads two tensors (x and x + 1 made once); add(x, x) would read x once
        "add": (lambda x: torch.add(x, _other(x)), 3), "mul_scalar": (lambda x: x * 2.0, 2),
        "gelu": (F.gelu, 2), "sum": (lambda x: x.sum(), 1),
        "softmax": (lambda x: torch.softmax(x.view(-1, 1024), -1), 2),
        "layer_norm": (lambda x: F.layer_norm(x.view(-1, 1024), (1024,)), 2),
        "copy": (lambda x: x.clone(), 2),
    }
    rows = []
    for dtype in dtypes:
        for numel in sizes:
            x = torch.randn(numel, device=device, dtype=dtype)
            for name, (fn, moved) in ops.items():
                seconds, repeat = _point(timer, lambda fn=fn, x=x: fn(x))
                nbytes = moved * numel * x.element_size()
                rows.append({"op": name, "dtype": str(dtype).removeprefix("torch."),
                             "numel": numel, "bytes": nbytes, "seconds": seconds,
                             "repeat": repeat, "gbps": nbytes / seconds / 1e9})
    return rows


def attention_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """SDPA (the default backend choice) by sequence length and head size, causal or not."""
    timer = _timer(device)
    dtype = torch.float32 if dry else torch.bfloat16
    grid = [(64, 32)] if dry else [(s, d) for s in (512, 2048, 8192) for d in (64, 128)]
    rows = []
    for seq, head in grid:
        heads = 2 if dry else 16
        q = torch.randn(1, heads, seq, head, device=device, dtype=dtype)
        for causal in (False, True):
            seconds, repeat = _point(timer, lambda q=q, c=causal: F.scaled_dot_product_attention(
                q, q, q, is_causal=c))
            macs = 2 * heads * seq * seq * head  # QK^T and PV, the full square
            rows.append({"op": "sdpa", "dtype": str(dtype).removeprefix("torch."), "seq": seq,
                         "head_dim": head, "heads": heads, "causal": causal,
                         "seconds": seconds, "repeat": repeat,
                         "tflops_full_square": 2 * macs / seconds / 1e12})
    return rows


def conv_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """ResNet-like convolutions (cuDNN's default choice; TF32 as torch's default allows)."""
    timer = _timer(device)
    grid = [(1, 8, 8, 16, 3)] if dry else [
        (b, c, c, hw, k) for b in (1, 32) for c, hw in ((64, 56), (256, 14)) for k in (1, 3)]
    rows = []
    for batch, cin, cout, hw, k in grid:
        conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, bias=False).to(device)
        x = torch.randn(batch, cin, hw, hw, device=device)
        with torch.no_grad():
            seconds, repeat = _point(timer, lambda conv=conv, x=x: conv(x))
        macs = batch * cout * hw * hw * cin * k * k
        rows.append({"op": "conv2d", "dtype": "float32", "batch": batch, "cin": cin, "cout": cout,
                     "hw": hw, "k": k, "seconds": seconds, "repeat": repeat,
                     "tflops": 2 * macs / seconds / 1e12})
    return rows


def host_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Host time per eager call of tiny operators (the device idle between them): dispatch and
    launch, what a batch-1 eager run pays per kernel."""
    calls = 50 if dry else 2000
    x = torch.randn(8, 8, device=device)
    lin = torch.nn.Linear(8, 8).to(device)
    conv = torch.nn.Conv2d(4, 4, 3).to(device)
    img = torch.randn(1, 4, 8, 8, device=device)
    q = torch.randn(1, 1, 8, 8, device=device)
    ops: dict[str, Callable[[], Any]] = {
        "add": lambda: torch.add(x, x), "mm": lambda: torch.mm(x, x), "linear": lambda: lin(x),
        "gelu": lambda: F.gelu(x), "layer_norm": lambda: F.layer_norm(x, (8,)),
        "softmax": lambda: torch.softmax(x, -1), "conv2d": lambda: conv(img),
        "sdpa": lambda: F.scaled_dot_product_attention(q, q, q), "view": lambda: x.view(64),
    }
    rows = []
    with torch.no_grad():
        for name, fn in ops.items():
            for _ in range(20):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            host = (time.perf_counter() - start) / calls
            if device == "cuda":
                torch.cuda.synchronize()
            total = (time.perf_counter() - start) / calls
            rows.append({"op": name, "calls": calls, "host_s_per_call": host,
                         "until_done_s_per_call": total})
    return rows


def part_calib(device: str, dry: bool) -> dict[str, Any]:
    """Every group of points, timed; raw, nothing fitted."""
    out: dict[str, Any] = {"note": "raw points; dry mode: tiny CPU shapes" if dry else
                           "raw points: device time by CUDA events, host time by perf_counter",
                           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                           "tf32_cudnn": torch.backends.cudnn.allow_tf32}
    for name, fn in (("host", host_points), ("gemm", gemm_points), ("stream", stream_points),
                     ("cache", cache_points),
                     ("attention", attention_points), ("conv", conv_points)):
        start = time.perf_counter()
        try:
            out[name] = fn(device, dry)
        except Exception as e:  # noqa: BLE001 - one group failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        out[f"{name}_seconds"] = time.perf_counter() - start
    return out
