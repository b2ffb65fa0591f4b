"""Pooling (max/avg/adaptive, 1d-3d) and interpolation (nearest, linear, bilinear, bicubic,
trilinear).

Pooling convention: a window of k elements costs k FLOPs per output element (max: k compares
counting the first against -inf; average: k - 1 adds + 1 divide). Adaptive pooling uses the exact
window of every output position (start = floor(i*in/out), end = ceil((i+1)*in/out)).
"""

from __future__ import annotations

from collections.abc import Sequence

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, numel
from flopscope.rules.registry import register_table, rule


def _window(call: OpCall, dims: int) -> int:
    k = list(named_arg(call, "kernel_size"))
    if len(k) == 1:
        k = k * dims
    return numel(k)


def _spatial_dims(call: OpCall) -> int:
    name = call.op._schema.name
    for d in (1, 2, 3):
        if f"{d}d" in name:
            return d
    return 2


@rule("aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d", "aten::max_pool1d_with_indices",
      "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices", "aten::mkldnn_max_pool2d",
      "aten::mkldnn_max_pool3d", "aten::_max_pool2d", "aten::avg_pool1d", "aten::avg_pool2d",
      "aten::avg_pool3d", "aten::mkldnn_avg_pool2d")
def pool(call: OpCall) -> Cost:
    """Max or average pooling with a k-element window: k FLOPs per output element."""
    return call.cost(flops=_window(call, _spatial_dims(call)) * call.out_numel())


@rule("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward")
def max_pool_backward(call: OpCall) -> Cost:
    """Max-pool gradient: each grad_output element is added at its argmax: 1 FLOP per grad_output
    element."""
    return call.cost(flops=call.args[0].numel())


@rule("aten::avg_pool2d_backward", "aten::avg_pool3d_backward")
def avg_pool_backward(call: OpCall) -> Cost:
    """Average-pool gradient: g/k once (1) and added to k inputs (k): k + 1 FLOPs per grad_output
    element."""
    return call.cost(flops=(_window(call, _spatial_dims(call)) + 1) * call.args[0].numel())


def adaptive_windows(in_sizes: Sequence[int], out_sizes: Sequence[int]) -> int:
    """Sum over output positions of the adaptive window size (separable, so a product of per-dim sums)."""
    total = 1
    for size_in, size_out in zip(in_sizes, out_sizes, strict=True):
        per_dim = 0
        for i in range(size_out):
            start = (i * size_in) // size_out
            end = -((-(i + 1) * size_in) // size_out)
            per_dim += end - start
        total *= per_dim
    return total


def _adaptive(x_shape: Sequence[int], out_shape: Sequence[int], dims: int) -> int:
    lead = numel(x_shape[:-dims])
    return lead * adaptive_windows(x_shape[-dims:], out_shape[-dims:])


@rule("aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d", "aten::adaptive_avg_pool1d",
      "aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
      "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d", "aten::mkldnn_adaptive_avg_pool2d")
def adaptive_pool(call: OpCall) -> Cost:
    """Adaptive pooling: the exact window of each output position, 1 FLOP per window element
    (average: window - 1 adds + 1 divide; max: window compares)."""
    dims = _spatial_dims(call)
    return call.cost(flops=_adaptive(call.args[0].shape, call.output.shape, dims))


@rule("aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward")
def adaptive_avg_backward(call: OpCall) -> Cost:
    """Adaptive average gradient: every window element receives g/size (divide + add): 2 FLOPs per
    window element."""
    grad_out, x = call.args[0], call.args[1]
    dims = _spatial_dims(call)
    return call.cost(flops=2 * _adaptive(x.shape, grad_out.shape, dims))


@rule("aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward")
def adaptive_max_backward(call: OpCall) -> Cost:
    """Adaptive max gradient: 1 add per grad_output element."""
    return call.cost(flops=call.args[0].numel())


register_table([
    (["aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
      "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d",
      "aten::_upsample_nearest_exact3d"],
     0, "Nearest-neighbour interpolation copies a source element: 0 FLOPs (bytes are counted)."),
    (["aten::upsample_linear1d"],
     3, "Linear interpolation: w0*a + w1*b (2 multiplies, 1 add) = 3 FLOPs per output element "
        "(interpolation weights are computed once per coordinate and not counted)."),
    (["aten::upsample_bilinear2d", "aten::_upsample_bilinear2d_aa"],
     7, "Bilinear interpolation: 4 taps, 4 multiplies + 3 adds = 7 FLOPs per output element."),
    (["aten::upsample_trilinear3d"],
     15, "Trilinear interpolation: 8 taps, 8 multiplies + 7 adds = 15 FLOPs per output element."),
    (["aten::upsample_bicubic2d", "aten::_upsample_bicubic2d_aa"],
     35, "Bicubic interpolation: 4 rows of 4 taps (4 multiplies + 3 adds each = 28), then the 4 row "
         "results (7) = 35 FLOPs per output element."),
], of="output")

register_table([
    (["aten::upsample_nearest1d_backward", "aten::upsample_nearest2d_backward",
      "aten::upsample_nearest3d_backward", "aten::_upsample_nearest_exact1d_backward",
      "aten::_upsample_nearest_exact2d_backward", "aten::_upsample_nearest_exact3d_backward"],
     1, "Nearest-interpolation gradient: each grad_output element is added to its source: 1 FLOP."),
    (["aten::upsample_linear1d_backward"],
     4, "Linear-interpolation gradient: 2 taps, multiply and add each = 4 FLOPs per grad element."),
    (["aten::upsample_bilinear2d_backward", "aten::_upsample_bilinear2d_aa_backward"],
     8, "Bilinear gradient: 4 taps, multiply and add each = 8 FLOPs per grad_output element."),
    (["aten::upsample_trilinear3d_backward"],
     16, "Trilinear gradient: 8 taps, multiply and add each = 16 FLOPs per grad_output element."),
    (["aten::upsample_bicubic2d_backward", "aten::_upsample_bicubic2d_aa_backward"],
     32, "Bicubic gradient: 16 taps, multiply and add each = 32 FLOPs per grad_output element."),
    (["aten::reflection_pad1d_backward", "aten::reflection_pad2d_backward",
      "aten::reflection_pad3d_backward", "aten::replication_pad1d_backward",
      "aten::replication_pad2d_backward", "aten::replication_pad3d_backward"],
     1, "Reflection/replication padding gradient: each grad_output element is added to the input "
        "element it was copied from: 1 FLOP per grad_output element, as for nearest "
        "interpolation."),
], of="input")
