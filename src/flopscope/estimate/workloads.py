"""The calibration's microbenchmarks (:func:`flopscope.estimate.calibrate.calibrate`): generic
shapes, no model's layer, each one ATen operator called eagerly as a model calls it.

A prediction interpolates a call's rate among the points *of its own operator* where the
calibration has them (:mod:`flopscope.estimate.predict`): the rate per byte of ``sqrt`` is a
quarter of ``add``'s on this machine's CPU, a 3x3 stride-1 max pooling does four times the
comparisons of a stride-2 one over the same bytes, so one curve per family mispredicts whichever
operator its neighbours are not. The operators are those models are made of: forward and
backward, and an optimizer's in-place updates. Every sweep's smallest size (64 elements, an 8 x 8
product) is also timed in batches of many calls for the operator's host time
(:func:`flopscope.estimate.host_probes.host_times`).

- **matmul**: ``mm`` squares 16-1024; tall-skinny (M = 1-64 against 256-1024, the weight
  transposed as ``nn.Linear`` holds it); small K (8-128); many rows and few columns; weights of
  48-64 MiB (M = 1-128; at M = 1-16 transposed as ``nn.Linear``'s, reduction lengths
  256-4096); ``addmm`` (a linear layer's bias) and ``bmm`` (12 batches); bf16 squares;
- **conv** (batch 1): dense 3x3 and 1x1 over 16-512 channels and 7-112 pixels, 1x1 of few
  channels over many pixels, strided 3x3 and 7x7; grouped 3x3 (group widths 8, 16, 32) and
  depthwise 3x3/5x5/7x7 over 32 channels of 112 pixels to 1024 of 7, some at stride 2; 1x1
  over one pixel (squeeze-and-excitation), 3x3 over 2-4 pixels; 1x1 and depthwise over 128 x 128
  pixels (activations of 4-8 MiB); 1x1 and depthwise of channel counts off oneDNN's 16-channel
  blocks (20-180) over 14-56 pixels (round 12);
- **element-wise** over 2^10-2^24 fp32 elements (L1-resident to streaming from memory): binary
  (``add``, ``mul``, ``div``, a scalar ``mul``), unary (``relu``, ``sqrt``, ``hardswish``,
  ``hardsigmoid``, a copy), backward (``threshold_backward``, ``gelu_backward``,
  ``silu_backward``), in place (``add_``, ``mul_``, ``div_``, ``addcmul_``, ``addcdiv_``,
  ``lerp_``, ``copy_``, ``relu_``, ``hardswish_``, ``zero_``, ``bernoulli_``), ``cat``;
- **reduction**: full sum, row sums, row maxima, row means, column sums (a bias's gradient);
- **normalization**: layer norm over rows of 256 (forward, backward), batch norm over 64
  channels (eval, training, backward);
- **special**: ``exp``, ``tanh``, ``sigmoid``, ``erf``, GELU, SiLU, softmax and log-softmax over
  rows of 256 (and softmax's backward; ``_safe_softmax``, attention's, an element-wise call by its
  counts);
- **pooling** over 16-128 channels of 16-112 pixels square: max 3x3 stride 2 and stride 1, max
  2x2, average 2x2 and 3x3 stride 1, max pooling's backward;
- **indexing**: ``embedding`` and its backward (tables of 2^2-2^16 rows of 256);
- **attention**: ``scaled_dot_product_attention``, 4 heads, sequence 64-1024, head size 32/64,
  causal or not; and (round 12) one query token against 128-2048 keys (a decode step's), 4 and
  32 sequences x heads, head size 64, rotated in a group of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["SIZES", "Fn", "Workload", "host_calls", "workloads"]

Fn = Callable[[], Any]

SIZES = (10, 14, 17, 20, 22, 24)
"""log2 of the element counts of the streaming sweeps: L1-resident (4 KiB) to 64 MiB, beyond
any last-level cache of this class of machine."""

_HOST_N = 64  # the tiny size whose time per call is the operator's host time


@dataclass(frozen=True)
class Workload:
    """One microbenchmark.

    Attributes:
        group: the group it is timed in (progress lines).
        what: what runs (``"sqrt 2^20"``), for people reading the profile file.
        dtype: its dtype key.
        fn: the call.
    """

    group: str
    what: str
    dtype: str
    fn: Fn


def _bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Fn:
    """``fn`` with its arguments bound (each benchmark holds its own tensors)."""
    return lambda: fn(*args, **kwargs)


def _stream_ops(n: int, device: str) -> dict[str, Fn]:
    """The streaming operators over ``n`` fp32 elements, each one ATen call."""
    aten = torch.ops.aten
    x = torch.randn(n, device=device)
    y, g = torch.randn_like(x), torch.randn_like(x)
    pos = x.abs() + 1  # sqrt and division of positive numbers
    zeros, dst = torch.zeros_like(x), torch.empty_like(x)  # x + 0 in place: x stays
    width = min(256, n)
    rows, grows = x.view(-1, width), g.view(-1, width)
    w, b = torch.ones(width, device=device), torch.zeros(width, device=device)
    _, mean, rstd = aten.native_layer_norm(rows, [width], w, b, 1e-5)
    channels = 64 if n >= 64 * 16 else 4
    img = x.view(1, channels, -1)
    gimg = g.view(1, channels, -1)
    ones_c = torch.ones(channels, device=device)
    zeros_c = torch.zeros(channels, device=device)
    _, save_mean, save_invstd = aten.native_batch_norm(img, ones_c, zeros_c, None, None, True,
                                                       0.1, 1e-5)
    soft = torch.softmax(rows, -1)
    scratch = x.clone()  # the random and zeroing calls write here
    return {
        "add": _bind(torch.add, x, y), "mul": _bind(torch.mul, x, y),
        "mul (scalar)": _bind(torch.mul, x, 2.0), "div": _bind(torch.div, x, pos),
        "relu": _bind(torch.relu, x), "sqrt": _bind(torch.sqrt, pos),
        "hardswish": _bind(F.hardswish, x), "hardsigmoid": _bind(F.hardsigmoid, x),
        "copy": _bind(torch.clone, x),
        "threshold_backward": _bind(aten.threshold_backward, g, x, 0.0),
        "gelu_backward": _bind(aten.gelu_backward, g, x),
        "silu_backward": _bind(aten.silu_backward, g, x),
        "add_ (in place)": _bind(x.add_, zeros), "mul_ (in place)": _bind(x.mul_, 1.0),
        "div_ (in place)": _bind(x.div_, 1.0),
        "addcmul_ (in place)": _bind(x.addcmul_, y, g, value=0.0),
        "addcdiv_ (in place)": _bind(x.addcdiv_, y, pos, value=0.0),
        "lerp_ (in place)": _bind(x.lerp_, y, 0.0), "copy_ (into)": _bind(dst.copy_, x),
        "relu_ (in place)": _bind(pos.relu_), "hardswish_ (in place)": _bind(
            torch.ops.aten.hardswish_, scratch),
        "zero_ (in place)": _bind(scratch.zero_),
        "bernoulli_ (in place)": _bind(scratch.bernoulli_, 0.9),
        "cat": _bind(torch.cat, [rows, rows], 1),
        "sum": _bind(torch.sum, x), "row sum": _bind(torch.sum, rows, -1),
        "row max": _bind(torch.amax, rows, -1), "row mean": _bind(torch.mean, rows, -1),
        "column sum": _bind(torch.sum, rows, 0),
        "layer_norm": _bind(F.layer_norm, rows, (width,)),
        "layer_norm backward": _bind(aten.native_layer_norm_backward, grows, rows, [width],
                                     mean, rstd, w, b, [True, True, True]),
        "batch_norm (eval)": _bind(aten.native_batch_norm, img, ones_c, zeros_c, zeros_c,
                                   ones_c, False, 0.1, 1e-5),
        "batch_norm (training)": _bind(aten.native_batch_norm, img, ones_c, zeros_c,
                                       zeros_c.clone(), ones_c.clone(), True, 0.1, 1e-5),
        "batch_norm backward": _bind(aten.native_batch_norm_backward, gimg, img, ones_c, None,
                                     None, save_mean, save_invstd, True, 1e-5,
                                     [True, True, True]),
        "exp": _bind(torch.exp, x), "tanh": _bind(torch.tanh, x),
        "sigmoid": _bind(torch.sigmoid, x), "erf": _bind(torch.erf, x),
        "gelu": _bind(F.gelu, x), "silu": _bind(F.silu, x),
        "softmax": _bind(torch.softmax, rows, -1),
        # scaled_dot_product_attention's math path (training, CPU) normalises by
        # _safe_softmax: softmax, then rows wholly -inf set to 0, four kernels (3.5-5x
        # softmax's time here), counted as one element-wise call
        "_safe_softmax": _bind(aten._safe_softmax, rows, -1),
        "log_softmax": _bind(torch.log_softmax, rows, -1),
        "softmax backward": _bind(aten._softmax_backward_data, grows, soft, -1, torch.float32),
    }


def _indexing(rows: int, device: str) -> dict[str, Fn]:
    """``embedding`` of 128 ids from a table of ``rows`` x 256, and its backward."""
    aten = torch.ops.aten
    table = torch.randn(rows, 256, device=device)
    ids = torch.randint(0, rows, (128,), device=device)
    grad = torch.randn(128, 256, device=device)
    return {"embedding": _bind(F.embedding, ids, table),
            "embedding backward": _bind(aten.embedding_dense_backward, grad, ids, rows, -1,
                                        False)}


def _pool_ops(channels: int, side: int, device: str) -> dict[str, Fn]:
    aten = torch.ops.aten
    x = torch.randn(1, channels, side, side, device=device)
    out, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    return {
        "max_pool2d 3x3 s2": _bind(F.max_pool2d, x, 3, 2, 1),
        "max_pool2d 3x3 s1": _bind(F.max_pool2d, x, 3, 1, 1),
        "max_pool2d 2x2 s2": _bind(F.max_pool2d, x, 2, 2),
        "avg_pool2d 2x2 s2": _bind(F.avg_pool2d, x, 2, 2),
        "avg_pool2d 3x3 s1": _bind(F.avg_pool2d, x, 3, 1, 1),
        "max_pool2d backward": _bind(aten.max_pool2d_with_indices_backward, torch.randn_like(
            out), x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx),
    }


_MATMUL = ([(s, s, s) for s in (16, 32, 64, 128, 256, 512, 1024)]
           + [(n, n, k) for n in (256, 1024) for k in (8, 32, 128)]  # small K
           + [(4096, 64, 64), (2048, 256, 32), (128, 3072, 768), (768, 768, 128),
              (128, 768, 3072), (196, 2304, 768)]
           # weights past the last-level cache, streamed from memory once per call
           + [(128, 16384, 768)])
"""(M, N, K) of the fp32 products ``A[M, K] @ B[K, N]``, B contiguous."""

_LINEAR = ([(m, n, n) for m in (1, 8, 64) for n in (256, 1024)]  # tall-skinny
           # weights past the last-level cache (48-64 MiB), streamed from memory once per
           # call, at reduction lengths 256-4096: a decode step's products (round 11)
           + [(1, 4096, 4096), (16, 4096, 4096)]
           + [(m, (12 << 20) // k, k) for m in (1, 8) for k in (256, 512, 1024)])
"""(M, N, K) of the fp32 products of few rows as ``nn.Linear`` makes them: ``x[M, K] @
W[N, K].t()``, the weight transposed (at M = 1 against a weight past the cache, 2.0-2.5x the
time of the same product with the weight contiguous in ``[K, N]`` at K = 256-512 here, 1.0x at
K = 4096: a dot product of K elements per output; round 11)."""

# (in, out, side, kernel, stride, groups), batch 1
_CONV = ([(c, c, s, 3, 1, 1) for c, s in ((16, 64), (64, 32), (64, 56), (128, 16), (256, 8),
                                           (512, 7))]
         + [(c, 2 * c, s, 1, 1, 1) for c, s in ((32, 32), (128, 16), (256, 8))]
         + [(c, c // 4, s, 1, 1, 1) for c, s in ((256, 56), (512, 28), (1024, 14))]
         + [(16, 64, 56, 1, 1, 1), (24, 144, 56, 1, 1, 1), (64, 16, 56, 1, 1, 1)]
         + [(c, c, s, k, 1, c) for c, s, k in ((32, 64, 3), (128, 32, 3), (512, 8, 3),
                                               (128, 32, 7), (96, 56, 5))]
         + [(c, c, s, 3, 2, c) for c, s in ((96, 112), (232, 28))]
         + [(c, c, s, 3, 1, c // 8) for c, s in ((64, 56), (224, 28))]
         + [(3, 32, 128, 7, 2, 1), (3, 64, 224, 7, 2, 1), (64, 128, 32, 3, 2, 1)]
         # grouped and depthwise over the usual (channels, pixels) pairs: group widths 1
         # (depthwise), 8, 16, 32; 3x3 at stride 1, some at stride 2, depthwise 5x5
         + [(c, c, s, 3, 1, c // w) for c, s in ((32, 112), (64, 56), (256, 28), (512, 14),
                                                 (1024, 7)) for w in (1, 8, 16, 32) if w < c]
         + [(c, c, s, 3, 2, c // w) for c, s in ((64, 56), (256, 28)) for w in (1, 16)]
         + [(c, c, s, 5, 1, c) for c, s in ((64, 56), (256, 28), (1024, 7))]
         # 1x1 over one pixel (a squeeze-and-excitation block's pair), few pixels
         + [(c, c // 4, 1, 1, 1, 1) for c in (64, 256, 1024)]
         + [(c // 4, c, 1, 1, 1, 1) for c in (64, 256, 1024)]
         + [(64, 64, 4, 3, 1, 1), (256, 256, 2, 3, 1, 1)]
         # activations of 4-8 MiB (past the L2, a large share of the last-level cache): 1x1
         # expanding and projecting, depthwise 3x3 (stride 1 and 2) and 5x5, over 128 x 128
         + [(32, 128, 128, 1, 1, 1), (128, 32, 128, 1, 1, 1), (128, 128, 128, 3, 1, 128),
            (128, 128, 128, 3, 2, 128), (64, 64, 128, 5, 1, 64)]
         # channel counts off oneDNN's 16-channel blocks (round 12): each call reorders its
         # input and output between PyTorch's layout and the blocked one, padded (oneDNN's
         # slower "jit:uni" reorder) where the count is not a multiple of 16; at more than one
         # thread PyTorch runs a 1x1 convolution through oneDNN (at one, as a plain product),
         # so 1x1 and depthwise over 14-56 pixels, expanding, projecting and square
         + [(20, 52, 56, 1, 1, 1), (52, 20, 56, 1, 1, 1), (36, 100, 28, 1, 1, 1),
            (100, 36, 28, 1, 1, 1), (100, 100, 28, 1, 1, 1), (180, 180, 14, 1, 1, 1),
            (52, 52, 56, 3, 1, 52), (100, 100, 28, 3, 1, 100), (180, 180, 14, 3, 1, 180)])


def _matmul(device: str) -> list[Workload]:
    out: list[Workload] = []
    for m, n, k in _MATMUL:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        out.append(Workload("matrix products", f"mm {m}x{n}x{k}", "fp32", _bind(torch.mm, a, b)))
    for m, n, k in _LINEAR:
        a, w = torch.randn(m, k, device=device), torch.randn(n, k, device=device)
        out.append(Workload("matrix products", f"mm {m}x{n}x{k} (weight as nn.Linear's)",
                            "fp32", _bind(torch.mm, a, w.t())))
    for m, n, k in ((128, 768, 768), (1024, 256, 256), (1, 1000, 1280)):
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        bias = torch.randn(n, device=device)
        out.append(Workload("matrix products", f"addmm {m}x{n}x{k}", "fp32",
                            _bind(torch.addmm, bias, a, b)))
    for m, n, k in ((128, 128, 64), (128, 64, 128), (256, 256, 32)):
        a = torch.randn(12, m, k, device=device)
        b = torch.randn(12, k, n, device=device)
        out.append(Workload("matrix products", f"bmm 12x{m}x{n}x{k}", "fp32",
                            _bind(torch.bmm, a, b)))
    for s in (64, 256, 512):
        a = torch.randn(s, s, device=device, dtype=torch.bfloat16)
        out.append(Workload("matrix products", f"mm {s}x{s}x{s}", "bf16", _bind(torch.mm, a, a)))
    return out


def _conv(device: str) -> list[Workload]:
    out: list[Workload] = []
    for cin, cout, side, k, stride, groups in _CONV:
        x = torch.randn(1, cin, side, side, device=device)
        w = torch.randn(cout, cin // groups, k, k, device=device)
        out.append(Workload("convolutions",
                            f"conv2d {cin}->{cout} {side}x{side} k{k} s{stride} g{groups}", "fp32",
                            _bind(F.conv2d, x, w, padding=k // 2, stride=stride, groups=groups)))
    return out


def _streams(device: str) -> list[Workload]:
    out: list[Workload] = []
    for p in SIZES:
        out += [Workload("element-wise, reductions, normalisations, special functions",
                         f"{name} 2^{p}", "fp32", fn)
                for name, fn in _stream_ops(2**p, device).items()]
    for p in (2, 6, 10, 13, 16):
        out += [Workload("indexing", f"{name} {2**p} rows", "fp32", fn)
                for name, fn in _indexing(2**p, device).items()]
    return out


def _pooling(device: str) -> list[Workload]:
    out: list[Workload] = []
    for channels, side in ((16, 16), (16, 32), (32, 64), (64, 112), (128, 56)):
        out += [Workload("pooling", f"{name} {channels}x{side}x{side}", "fp32", fn)
                for name, fn in _pool_ops(channels, side, device).items()]
    return out


def _attention(device: str) -> list[Workload]:
    out: list[Workload] = []
    for seq in (64, 256, 1024):
        for head in (32, 64):
            # queries, keys and values apart, as a model's projections make them (one tensor
            # for all three is read once: 0-5% faster here at these sizes, more on a GPU)
            q, k, v = (torch.randn(1, 4, seq, head, device=device) for _ in range(3))
            for causal in (False, True):
                out.append(Workload("attention", f"sdpa 4x{seq}x{head}{' causal' if causal else ''}",
                                    "fp32", _bind(F.scaled_dot_product_attention, q, k, v,
                                                  is_causal=causal)))
    # a decode step's attention (round 12): one query token per sequence against a cache of
    # 128-2048 keys, 4 and 32 sequences x heads, head size 64: a read of the keys
    # and values at about 0.5 FLOP per byte, where the square calls above do S / 4 and more;
    # their own group, whose keys and values (about 50 MiB in all) evict each other in the
    # rotation as a model's weights evict its cache between two steps
    for heads, keys, head in _SHORT_QUERY:
        q = torch.randn(1, heads, 1, head, device=device)
        k, v = (torch.randn(1, heads, keys, head, device=device) for _ in range(2))
        out.append(Workload("attention, one query token", f"sdpa {heads}x1x{keys}x{head}",
                            "fp32", _bind(F.scaled_dot_product_attention, q, k, v)))
    return out


_SHORT_QUERY = [(heads, keys, 64) for heads in (4, 32) for keys in (128, 512, 2048)]
"""(sequences x heads, keys, head size) of the one-query-token attention points: head size 64
only, as the square points' 32 and 64: a head of 128 read its keys at half the rate here
(6.5-7.0 GB/s against 13-15, round 12), which the interpolation's coordinates (work,
intensity, reduction length) cannot tell from a head of 64."""


def workloads(device: str) -> list[Workload]:
    """Every microbenchmark (see the module docstring), its tensors on ``device``.

    Args:
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        The workloads, grouped.
    """
    return [w for make in (_matmul, _conv, _streams, _pooling, _attention) for w in make(device)]


def host_calls(device: str) -> dict[str, Fn]:
    """The tiny calls whose time per call is host time: each streaming, pooling and indexing
    operator at its smallest (64 elements, 4 channels of 8 x 8, a table of 4 rows), an 8 x 8
    product, a 4-channel 3 x 3 convolution of 8 x 8 pixels, a view.

    Args:
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        What runs -> the call.
    """
    x = torch.randn(8, 8, device=device)
    bias = torch.randn(8, device=device)
    img = torch.randn(1, 4, 8, 8, device=device)
    w = torch.randn(4, 4, 3, 3, device=device)
    dw = torch.randn(4, 1, 3, 3, device=device)
    q = torch.randn(1, 1, 8, 8, device=device)
    calls: dict[str, Fn] = {
        "mm": _bind(torch.mm, x, x), "addmm": _bind(torch.addmm, bias, x, x),
        "bmm": _bind(torch.bmm, x[None], x[None]), "conv2d": _bind(F.conv2d, img, w),
        "conv2d (depthwise)": _bind(F.conv2d, img, dw, groups=4),
        "sdpa": _bind(F.scaled_dot_product_attention, q, q, q),
        "view": _bind(x.view, 64), "t": _bind(x.t), "transpose": _bind(x.transpose, 0, 1),
        "permute": _bind(img.permute, 0, 2, 3, 1), "expand": _bind(bias.expand, 8, 8),
        "reshape": _bind(x.reshape, 64), "unsqueeze": _bind(x.unsqueeze, 0),
        "select": _bind(x.select, 0, 0), "slice": _bind(x.__getitem__, slice(0, 4)),
        "split": _bind(x.split, 4), "empty": _bind(torch.empty, (8, 8), device=device),
        "detach": _bind(x.detach),
    }
    calls.update(_stream_ops(_HOST_N, device))
    calls.update(_indexing(4, device))
    calls.update(_pool_ops(4, 8, device))
    return calls
