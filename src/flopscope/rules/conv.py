"""Convolution and transposed convolution (1d/2d/3d, any groups, stride, dilation, padding)."""

from __future__ import annotations

from collections.abc import Sequence

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, numel
from flopscope.rules.registry import rule


def conv_macs(
    x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int], transposed: bool
) -> int:
    """MACs of a convolution.

    A regular convolution with weight [C_out, C_in/groups, *k] does C_in/groups * prod(k) MACs per
    output element: N * prod(out_spatial) * C_out * C_in/groups * prod(k). A transposed one with
    weight [C_in, C_out/groups, *k] scatters every *input* element into C_out/groups * prod(k)
    outputs: N * prod(in_spatial) * C_in * C_out/groups * prod(k). Padding taps are counted (the
    dense kernel's work); this is the formula of torch's FlopCounterMode (which reports 2 * MACs).
    """
    spatial = (x_shape if transposed else out_shape)[2:]
    return x_shape[0] * numel(spatial) * numel(w_shape)


@rule("aten::convolution", "aten::_convolution", "aten::convolution_overrideable",
      "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::mkldnn_convolution",
      "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward", "aten::slow_conv_dilated2d",
      "aten::slow_conv_dilated3d", "aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d",
      "aten::_nnpack_spatial_convolution", "aten::miopen_convolution", "aten::thnn_conv2d")
def convolution(call: OpCall) -> Cost:
    """y = conv(x, W) + b. MACs: see ``conv_macs``; FLOPs = 2 * MACs + one add per output element
    when there is a bias."""
    x, w = call.args[0], call.args[1]
    bias = call.args[2] if len(call.args) > 2 else call.kwargs.get("bias")
    name = call.op._schema.name
    transposed = bool(named_arg(call, "transposed", False)) or name.endswith("transpose2d") or \
        name.endswith("transpose3d") or name.endswith("convolution_transpose")
    out = call.output
    macs = conv_macs(x.shape, w.shape, out.shape, transposed)
    return call.cost(macs=macs, flops=2 * macs + (out.numel() if bias is not None else 0))


@rule("aten::convolution_backward", "aten::convolution_backward_overrideable")
def convolution_backward(call: OpCall) -> Cost:
    """Gradients of a convolution, each as asked for by ``output_mask``:
    grad_input is the transposed operation of the forward (same MACs as the forward); grad_weight
    correlates input with grad_output (same MACs as the forward); grad_bias sums grad_output (one
    add per grad_output element). torch's FlopCounterMode counts grad_weight of a grouped
    convolution ``groups`` times; flopscope counts it once."""
    grad_out, x, w = call.args[0], call.args[1], call.args[2]
    transposed = bool(named_arg(call, "transposed", False))
    mask = named_arg(call, "output_mask", [True, True, True])
    fwd = conv_macs(x.shape, w.shape, grad_out.shape, transposed)
    macs = (fwd if mask[0] else 0) + (fwd if mask[1] else 0)
    flops = 2 * macs + (grad_out.numel() if mask[2] else 0)
    return call.cost(macs=macs, flops=flops)
