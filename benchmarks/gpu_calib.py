"""Raw calibration points measured on the GPU (issue 28 part 5, for issue 29's fitted model).

Each point is one operator on one shape and dtype, timed on the device (CUDA events around
``repeat`` back-to-back calls after a warm-up, the median of three such batches) and on the host
(the wall time of ``host_calls`` calls of the same operator on tiny inputs, divided by their
number: what eager PyTorch spends per call before a kernel runs, when the device is not the
bottleneck), also in rotation with the other tiny calls (a model's mixed sequence), and of
chains of layers at tiny sizes timed eagerly (the host's time for a model-like sequence, its
module calls and fresh outputs). Nothing is fitted here: the points are stored raw, with the device and versions, and
the prediction issue fits and validates on them (no model under validation is among them).

In dry mode (no CUDA) the same loops run on tiny CPU shapes with ``time.perf_counter``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from flopscope.estimate.calibration import GRAPH_CLOCK


def _timer(device: str) -> Callable[[Callable[[], Any], int], float]:
    """Seconds per call of ``fn`` over ``repeat`` calls (median of three batches). On CUDA the
    ``repeat`` calls are captured as one CUDA graph and its replays timed by CUDA events: the
    device's time per kernel back to back, with no host launch between them (an eager loop of
    small kernels times the host instead, and its points could only be dropped)."""
    def cuda(fn: Callable[[], Any], repeat: int) -> float:
        def calls() -> None:
            for _ in range(repeat):
                fn()

        graph = captured(calls)
        times = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / repeat)
        del graph
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


_Key = tuple[tuple[int, ...], torch.dtype, torch.device]
_OTHERS: dict[_Key, torch.Tensor] = {}
_POSITIONS: dict[_Key, torch.Tensor] = {}


def _other(x: torch.Tensor) -> torch.Tensor:
    """A second tensor like ``x`` (made once per shape, dtype and device), so a binary operator reads two."""
    key = (tuple(x.shape), x.dtype, x.device)  # not id(x): a freed tensor's id is reused
    if key not in _OTHERS:
        _OTHERS.clear()
        _OTHERS[key] = torch.empty_like(x).fill_(1.0)
    return _OTHERS[key]


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
        seconds = timer(lambda x=x, y=y: y.copy_(x), 4 if dry else 200)
        nbytes = 2 * x.numel() * 4
        rows.append({"op": "copy_in_graph" if device == "cuda" else "copy", "mib": mib,
                     "bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9})
    return rows


def _bn_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Running mean and variance of 64 channels like ``x`` (made once per shape, dtype and
    device)."""
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _STATS:
        _STATS.clear()
        _STATS[key] = (torch.zeros(64, device=x.device, dtype=x.dtype),
                       torch.ones(64, device=x.device, dtype=x.dtype))
    return _STATS[key]


_STATS: dict[_Key, tuple[torch.Tensor, torch.Tensor]] = {}
# name -> (the call on a flat tensor of at least 1,024 elements, tensors' worth of bytes moved);
# benchmarks/gpu_profile.py rebuilds each on the meta device by the same name
STREAM_OPS: dict[str, tuple[Callable[[torch.Tensor], Any], float]] = {
    # add reads two tensors (x and x + 1 made once); add(x, x) would read x once
    "add": (lambda x: torch.add(x, _other(x)), 3), "mul_scalar": (lambda x: x * 2.0, 2),
    "gelu": (F.gelu, 2), "silu": (F.silu, 2), "relu_": (lambda x: x.relu_(), 2),
    "sum": (lambda x: x.sum(), 1), "mean_rows": (lambda x: x.view(-1, 1024).mean(-1), 1),
    "softmax": (lambda x: torch.softmax(x.view(-1, 1024), -1), 2),
    "layer_norm": (lambda x: F.layer_norm(x.view(-1, 1024), (1024,)), 2),
    "batch_norm": (lambda x: F.batch_norm(x.view(-1, 64, 16), *_bn_stats(x)), 2),
    "max_pool2d": (lambda x: F.max_pool2d(x.view(-1, 16, 8, 8), 3, 2, 1), 1.25),
    "copy": (lambda x: x.clone(), 2),
    # a key/value cache's append along its sequence (a DynamicCache's cat: heads of 128 over
    # the positions, one new position), with 8 and with 32 x 8 rows of heads (run 10: it
    # streams as a copy does, 3.8-3.9 TB/s from 64 MiB on an H200)
    "cat_seq": (lambda x: torch.cat([x.view(1, 8, -1, 128), _position(x, 1)], dim=2), 2),
    "cat_seq32": (lambda x: torch.cat([x.view(32, 8, -1, 128), _position(x, 32)], dim=2), 2),
}


def _position(x: torch.Tensor, rows: int) -> torch.Tensor:
    """One new position of ``rows`` x 8 heads of 128 like ``x`` (made once per shape)."""
    key = ((rows,), x.dtype, x.device)
    if key not in _POSITIONS:
        _POSITIONS[key] = torch.ones(rows, 8, 1, 128, dtype=x.dtype, device=x.device)
    return _POSITIONS[key]


def stream_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Element-wise, reductions, normalisation, pooling and softmax by size, from 4 KiB (a
    kernel's floor on a GPU) to cache-resident and streaming; bytes are what the operator must
    read and write once."""
    timer = _timer(device)
    sizes = [1 << 10, 1 << 14] if dry else [1 << p for p in range(10, 29, 2)]
    dtypes = [torch.float32] if dry else [torch.float32, torch.bfloat16]
    rows = []
    for dtype in dtypes:
        for numel in sizes:
            x = torch.randn(numel, device=device, dtype=dtype)
            for name, (fn, moved) in STREAM_OPS.items():
                try:
                    seconds, repeat = _point(timer, lambda fn=fn, x=x: fn(x))
                except Exception as e:  # noqa: BLE001 - one operator failing loses only itself
                    rows.append({"op": name, "dtype": str(dtype).removeprefix("torch."),
                                 "numel": numel, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                nbytes = int(moved * numel * x.element_size())
                rows.append({"op": name, "dtype": str(dtype).removeprefix("torch."),
                             "numel": numel, "bytes": nbytes, "seconds": seconds,
                             "repeat": repeat, "gbps": nbytes / seconds / 1e9})
    return rows


def attention_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """SDPA (the default backend choice) by sequence length and head size, causal or not, in
    bfloat16 (flash) and float32 (memory-efficient)."""
    timer = _timer(device)
    grid = [(torch.float32, 64, 32)] if dry else [
        (dt, s, d) for dt in (torch.bfloat16, torch.float32) for s in (128, 512, 2048, 8192)
        for d in (64, 128) if s < 8192 or dt is torch.bfloat16]
    rows = []
    for dtype, seq, head in grid:
        heads = 2 if dry else 16
        # queries, keys and values apart, as a model's projections make them (until run 13
        # one tensor was all three, which the kernel may read from memory once)
        q, k, v = (torch.randn(1, heads, seq, head, device=device, dtype=dtype)
                   for _ in range(3))
        for causal in (False, True):
            seconds, repeat = _point(timer, lambda q=q, k=k, v=v, c=causal:
                                     F.scaled_dot_product_attention(q, k, v, is_causal=c))
            macs = 2 * heads * seq * seq * head  # QK^T and PV, the full square
            rows.append({"op": "sdpa", "dtype": str(dtype).removeprefix("torch."), "seq": seq,
                         "head_dim": head, "heads": heads, "causal": causal,
                         "seconds": seconds, "repeat": repeat,
                         "tflops_full_square": 2 * macs / seconds / 1e12})
    return rows + cached_attention_points(device, dry)


def cached_attention_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """SDPA of a few new queries per sequence on a long cache, as a decode step or continuous
    batching's mixed step attends: 1 and 9 queries, 512-8,192 keys, batch 8 and 32, 32 query
    heads on 8 key/value heads of 128 (``enable_gqa``, no mask: a serving engine's kernel), in
    bfloat16. The square points above have no such shape (docs/gpu.md, "Serving on the
    H200")."""
    timer = _timer(device)
    grid = [(2, 1, 64), (2, 4, 64)] if dry else [
        (b, q, kv) for b in (8, 32) for q in (1, 9) for kv in (512, 2048, 8192)]
    heads, kv_heads, head = (4, 2, 32) if dry else (32, 8, 128)
    dtype = torch.float32 if dry else torch.bfloat16
    rows = []
    for batch, queries, keys in grid:
        q = torch.randn(batch, heads, queries, head, device=device, dtype=dtype)
        # keys and values apart: one tensor for both is read once from memory (run 12 timed
        # that by mistake: 7.9 TB/s of "cache" on an H200 whose memory gives 4.8)
        k, v = (torch.randn(batch, kv_heads, keys, head, device=device, dtype=dtype)
                for _ in range(2))
        try:
            seconds, repeat = _point(timer, lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, enable_gqa=True))
        except Exception as e:  # noqa: BLE001 - one shape failing loses only itself
            rows.append({"op": "sdpa_cached", "batch": batch, "queries": queries,
                         "keys": keys, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        rows.append({"op": "sdpa_cached", "dtype": str(dtype).removeprefix("torch."),
                     "batch": batch, "queries": queries, "keys": keys, "heads": heads,
                     "kv_heads": kv_heads, "head_dim": head, "seconds": seconds,
                     "repeat": repeat,
                     "cache_gbps": (k.nbytes + v.nbytes) / seconds / 1e9})  # each read once
    return rows


def conv_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """ResNet-like convolutions, and depthwise ones (one group per channel, 3x3 and 7x7)
    (cuDNN's default choice; TF32 as torch's default allows)."""
    timer = _timer(device)
    grid = [(1, 8, 8, 16, 3, 1), (1, 8, 8, 16, 3, 8)] if dry else [
        (b, c, c, hw, k, 1) for b in (1, 32) for c, hw in ((64, 56), (256, 14)) for k in (1, 3)
    ] + [(b, 256, 256, 28, k, 256) for b in (1, 32) for k in (3, 7)]
    rows = []
    for batch, cin, cout, hw, k, groups in grid:
        conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, bias=False, groups=groups).to(device)
        x = torch.randn(batch, cin, hw, hw, device=device)
        with torch.no_grad():
            seconds, repeat = _point(timer, lambda conv=conv, x=x: conv(x))
        macs = batch * cout * hw * hw * cin // groups * k * k
        rows.append({"op": "conv2d", "dtype": "float32", "batch": batch, "cin": cin, "cout": cout,
                     "hw": hw, "k": k, "groups": groups, "seconds": seconds, "repeat": repeat,
                     "tflops": 2 * macs / seconds / 1e12})
    return rows


class _Ops(TorchDispatchMode):
    """The ATen operators (base names) a call dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def tiny_calls(device: str, rows: int = 8, width: int = 8, channels: int = 4,
               side: int = 8) -> dict[str, Callable[[], Any]]:
    """The functional calls whose eager time per call is host time: by default tiny (8 x 8
    inputs, a 4-channel 8 x 8 image), dispatch and launch, what a batch-1 eager run pays per
    kernel; :data:`SIZED` makes the same calls at a batch-1 model's sizes. No ``nn.Module``: a
    module's own Python time is measured apart (``module_call_s``)."""
    x = torch.randn(rows, width, device=device)
    w, b = torch.randn(width, width, device=device), torch.randn(width, device=device)
    cw = torch.randn(channels, channels, 3, 3, device=device)
    img = torch.randn(1, channels, side, side, device=device)
    mean, var = torch.zeros(channels, device=device), torch.ones(channels, device=device)
    table = torch.randn(16, width, device=device)
    ids = torch.arange(rows, device=device) % 16
    head = min(width, 64)
    q = torch.randn(1, 1, rows, head, device=device)
    return {
        "add": lambda: torch.add(x, x), "mm": lambda: torch.mm(x, w),
        "linear": lambda: F.linear(x, w, b), "gelu": lambda: F.gelu(x),
        "layer_norm": lambda: F.layer_norm(x, (width,)), "softmax": lambda: torch.softmax(x, -1),
        "conv2d": lambda: F.conv2d(img, cw), "sdpa": lambda: F.scaled_dot_product_attention(
            q, q, q), "view": lambda: x.view(rows * width),
        "batch_norm": lambda: F.batch_norm(img, mean, var), "relu_": lambda: img.relu_(),
        "max_pool2d": lambda: F.max_pool2d(img, 3, 2, 1),
        "mean": lambda: x.mean(-1), "cat": lambda: torch.cat([x, x]),
        "mul": lambda: torch.mul(x, x), "silu": lambda: F.silu(x),
        "embedding": lambda: F.embedding(ids, table), "transpose": lambda: x.transpose(0, 1),
    }


# the same calls at a batch-1 model's sizes: 256 x 1024 float32 rows (1 MiB, the caching
# allocator's small/large pool boundary), a 64-channel 56 x 56 image (784 KiB; resnet50's first
# stage at batch 1); the dry mode's stay small
SIZED: dict[str, int] = {"rows": 256, "width": 1024, "channels": 64, "side": 56}
_DRY_SIZED: dict[str, int] = {"rows": 16, "width": 32, "channels": 8, "side": 12}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Host time per eager call of each of :func:`tiny_calls` in a tight loop of itself (the
    device idle between them). Each row names the ATen operators its call dispatched on the
    device."""
    calls = 50 if dry else 2000
    rows = []
    with torch.no_grad():
        for name, fn in tiny_calls(device).items():
            for _ in range(20):
                fn()
            with _Ops() as seen:
                fn()
            _sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            host = (time.perf_counter() - start) / calls
            _sync(device)
            total = (time.perf_counter() - start) / calls
            rows.append({"op": name, "calls": calls, "host_s_per_call": host,
                         "until_done_s_per_call": total, "aten": seen.ops})
    return rows


def _loop_host_s(fn: Callable[[], Any], device: str, calls: int) -> float:
    """Host seconds per call of ``fn`` in a tight loop of ``calls`` (after 20), by wall clock."""
    for _ in range(20):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def host_rotation_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """Host time per eager call of each of :func:`tiny_calls` called in turn with the others, as
    a model calls a mixed sequence of operators (:func:`flopscope.estimate.timers
    .time_in_rotation`: rounds of one call of each, every call timed alone by the wall clock,
    the median over the rounds), against the same call in a rotation of itself alone (the same
    timing, no other operator between) and in a tight loop (timed as a batch); the three
    interleaved, ``rounds`` times each, the medians: the CPU calibration's finding that a call
    following other operators costs the host more (its code, the dispatcher's and the kernel
    library's state evicted from the caches, branch predictors trained on another call),
    measured on the GPU's host. The device keeps up with tiny kernels, so each call's time is
    the host's."""
    from flopscope.estimate.timers import time_in_rotation

    calls = tiny_calls(device)
    names, fns = list(calls), list(calls.values())
    budget = 0.002 if dry else 0.01
    loops: dict[str, list[float]] = {n: [] for n in names}
    alone: dict[str, list[float]] = {n: [] for n in names}
    rotated: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for _ in range(3 if dry else 7):
            for name, fn in calls.items():
                loops[name].append(_loop_host_s(fn, device, 50 if dry else 500))
                alone[name].append(time_in_rotation([fn], device, budget_s=budget)[0])
            _sync(device)
            for name, seconds in zip(names, time_in_rotation(fns, device, budget_s=budget),
                                     strict=True):
                rotated[name].append(seconds)
            _sync(device)
    rows = []
    for name in names:
        rotation, by_itself = statistics.median(rotated[name]), statistics.median(alone[name])
        rows.append({"op": name, "loop_s_per_call": statistics.median(loops[name]),
                     "alone_s_per_call": by_itself, "rotation_s_per_call": rotation,
                     "rotation_over_alone": rotation / by_itself})
    return rows


# the chains of layers timed eagerly on the device (flopscope.estimate.chains.chains' kinds, at
# sizes small enough for the host to be the bottleneck on a GPU: activations of 2-32 KiB);
# benchmarks/gpu_profile.py rebuilds them on the meta device from the same table
GPU_CHAINS: dict[str, Any] = {
    "conv": (("conv3x3", 16, 16), ("conv3x3", 32, 8), ("conv1x1", 16, 16), ("conv1x1", 64, 8),
             ("depthwise3x3", 32, 16), ("depthwise3x3", 64, 8)),
    "linear": ((8, 64), (16, 128), (8, 256)),
    "residual": ((8, 64), (16, 128), (8, 256)),
}
_DRY_CHAINS: dict[str, Any] = {"conv": (("conv3x3", 16, 16), ("depthwise3x3", 32, 16)),
                               "linear": ((8, 64),), "residual": ((8, 64),)}
# the same kinds at a batch-1 model's sizes (activations of 0.4-3 MiB: resnet50's and
# mobilenet's first stages, a 256-token BERT-base row block), still host-bound at batch 1 on a
# GPU: beside the tiny ones, the chain factor of a model's calls at their own size
# (benchmarks/gpu_profile.py)
GPU_CHAINS_SIZED: dict[str, Any] = {
    "conv": (("conv3x3", 64, 56), ("conv1x1", 256, 56), ("depthwise3x3", 96, 56)),
    "linear": ((256, 768),), "residual": ((256, 768),)}
_DRY_CHAINS_SIZED: dict[str, Any] = {"conv": (("depthwise3x3", 96, 56),), "linear": ((256, 768),),
                                     "residual": ()}  # among the GPU's, by name


def chain_rows(device: str, dry: bool, sized: bool = False) -> list[dict[str, Any]]:
    """Model-like chains of layers (:func:`flopscope.estimate.chains.chains`: three blocks of a
    convolution, a batch norm and an in-place ReLU at batch 1; of a linear layer, a layer norm
    and a GELU; of a pre-norm residual block) at tiny sizes, each forward timed eagerly by the
    wall clock with a synchronize at the end of each batch (``calls`` forwards, the median of
    five batches): the host's time for a model's mixed sequence of calls, its module calls and
    fresh outputs. On CUDA each is also replayed as a CUDA graph (its device time, ``graph_s``),
    to show it is host-bound. No validated model is among them. ``sized``: the same kinds at a
    batch-1 model's sizes (:data:`GPU_CHAINS_SIZED`)."""
    from flopscope.estimate.chains import chains

    calls = 5 if dry else 100
    table = ((_DRY_CHAINS_SIZED if dry else GPU_CHAINS_SIZED) if sized else
             (_DRY_CHAINS if dry else GPU_CHAINS))
    rows = []
    with torch.no_grad():
        for what, module, x in chains(device, **table):
            for _ in range(3):
                module(x)
            times = []
            for _ in range(5):
                _sync(device)
                start = time.perf_counter()
                for _ in range(calls):
                    module(x)
                _sync(device)
                times.append((time.perf_counter() - start) / calls)
            row: dict[str, Any] = {"what": what, "calls": calls, "seconds": statistics.median(times)}
            if device == "cuda":
                row["graph_s"] = _timer(device)(lambda m=module, x=x: m(x), 20)
            rows.append(row)
    return rows


def kernels_per_call(fn: Callable[[], Any], device: str) -> int:
    """The kernels one call of ``fn`` launches on the device: ``torch.profiler``'s device-side
    events (:func:`flopscope.timing.run.recording`, as the measured-time join reads them); 0 on
    the CPU, where there are none; -1 where the profiler failed (the group's times are kept)."""
    if device != "cuda":
        return 0
    from flopscope.timing.join import device_events
    from flopscope.timing.run import recording

    try:
        fn()
        torch.cuda.synchronize()
        with recording(True) as prof:
            fn()
            torch.cuda.synchronize()
        return len(device_events(prof.events()))
    except Exception:  # noqa: BLE001 - the count is a side figure of the group
        return -1


def host_sized_points(device: str, dry: bool) -> list[dict[str, Any]]:
    """The calls of :func:`host_rotation_points` at a batch-1 model's sizes (:data:`SIZED`)
    beside the tiny ones, both in rotation (the same timing, the two rotations interleaved 7
    times, the medians), with the bytes of each call's output and the kernels each call
    launched: whether a call's host time grows with its size (the caching allocator's large
    pool above 1 MiB, cuDNN's multi-kernel algorithms for larger convolutions) where a
    batch-1 model's calls are under-predicted from tiny points. ``until_done_s_per_call``:
    the sized rotation's time with the device's work waited for (its rounds timed whole, a
    synchronize at the end): where it is well above the host's, the device did not keep up and
    the host time is not clean."""
    from flopscope.estimate.timers import time_in_rotation

    tiny = tiny_calls(device)
    sized = tiny_calls(device, **(_DRY_SIZED if dry else SIZED))
    names = list(tiny)
    budget = 0.002 if dry else 0.01
    small: dict[str, list[float]] = {n: [] for n in names}
    large: dict[str, list[float]] = {n: [] for n in names}
    done: list[float] = []
    with torch.no_grad():
        for _ in range(3 if dry else 7):
            for times, calls in ((small, tiny), (large, sized)):
                _sync(device)
                for name, seconds in zip(names, time_in_rotation(
                        list(calls.values()), device, budget_s=budget), strict=True):
                    times[name].append(seconds)
            _sync(device)
            start = time.perf_counter()
            for _ in range(5):
                for fn in sized.values():
                    fn()
            _sync(device)
            done.append((time.perf_counter() - start) / (5 * len(names)))
        rows = []
        for name in names:
            out = sized[name]()
            rows.append({"op": name, "tiny_rotation_s_per_call": statistics.median(small[name]),
                         "sized_rotation_s_per_call": statistics.median(large[name]),
                         "sized_over_tiny": (statistics.median(large[name])
                                             / statistics.median(small[name])),
                         "sized_out_bytes": (out.numel() * out.element_size()
                                             if isinstance(out, torch.Tensor) else 0),
                         "tiny_kernels": kernels_per_call(tiny[name], device),
                         "sized_kernels": kernels_per_call(sized[name], device)})
    rows.append({"op": "(all, sized, until done)",
                 "until_done_s_per_call": statistics.median(done)})
    return rows


def module_call_points(device: str, dry: bool) -> dict[str, Any]:
    """Python's time per ``nn.Module`` call outside its operators, as the CPU calibration
    measures it (:func:`flopscope.estimate.host_probes.module_call_time`: host time either way)."""
    from flopscope.estimate.host_probes import module_call_time

    return {"module_call_s": module_call_time(device, modules=50 if dry else 200,
                                              samples=5 if dry else 21)}


def framework_points(device: str, dry: bool) -> dict[str, Any]:
    """DTensor's host time per operator (and per point-wise operator on like-sharded DTensors)
    and FSDP2's per collective, as the CPU calibration measures them
    (:func:`flopscope.estimate.framework.framework_costs`: on a fake process group, over CPU
    tensors, the difference against the same work on plain tensors; DTensor's dispatch and
    FSDP2's hooks are Python on the host whatever device runs the kernels)."""
    from flopscope.estimate.framework import framework_costs

    dtensor, pointwise, fsdp = framework_costs(time.perf_counter, samples=5 if dry else 21)
    return {"dtensor_call_s": dtensor, "dtensor_pointwise_s": pointwise,
            "fsdp_collective_s": fsdp}


def part_calib(device: str, dry: bool) -> dict[str, Any]:
    """Every group of points, timed; raw, nothing fitted (``GPU_CALIB_GROUPS=stream,...`` in
    the environment: those groups only, to add points to an earlier run's)."""
    out: dict[str, Any] = {"note": "raw points; dry mode: tiny CPU shapes" if dry else
                           "raw points: device time by CUDA events around CUDA graph replays, host "
                           "time by perf_counter",
                           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                           "tf32_cudnn": torch.backends.cudnn.allow_tf32}
    out["timing"] = GRAPH_CLOCK if device == "cuda" else "perf_counter loop"
    only = [g for g in os.environ.get("GPU_CALIB_GROUPS", "").split(",") if g]
    for name, fn in (("host", host_points), ("host_rotation", host_rotation_points),
                     ("host_sized", host_sized_points),
                     ("module", module_call_points), ("framework", framework_points),
                     ("chains", chain_rows),
                     ("chains_sized", lambda d, dry: chain_rows(d, dry, sized=True)),
                     ("gemm", gemm_points), ("stream", stream_points),
                     ("cache", cache_points),
                     ("attention", attention_points), ("conv", conv_points)):
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            out[name] = fn(device, dry)
        except Exception as e:  # noqa: BLE001 - one group failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        out[f"{name}_seconds"] = time.perf_counter() - start
    return out
