"""Normalizations: batch, layer, group, instance (as batch norm on a reshaped input) and RMS.

Per-element conventions (n = elements of the input):
statistics = mean (1 add) + variance (subtract, square, add = 3) = 4; normalize = subtract mean,
multiply by 1/std = 2; affine = multiply by weight (1) and add bias (1). Per-channel/row terms
(1/sqrt(var + eps), running-statistic updates) are not counted.
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall, tensor_bytes
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import rule


def _mask(call: OpCall) -> list[bool]:
    return list(named_arg(call, "output_mask", [True, True, True]))


@rule("aten::native_batch_norm", "aten::_native_batch_norm_legit",
      "aten::_native_batch_norm_legit_functional", "aten::cudnn_batch_norm",
      "aten::miopen_batch_norm", "aten::_batch_norm_with_update",
      "aten::_batch_norm_with_update_functional", "aten::batch_norm")
def batch_norm(call: OpCall) -> Cost:
    """Batch norm. Training (batch statistics): statistics 4 + scale-and-shift 2 = 6 FLOPs per element.
    Eval (running statistics): y = x * a_c + b_c with a, b folded per channel = 2 FLOPs per element.
    The per-channel fold is used in both modes (scale and shift cost the same with or without
    affine parameters). With running statistics the bytes written are the output's only (the
    saved-statistics outputs are empty on a CPU, so a count is the same on every device)."""
    training = named_arg(call, "training", True)
    if call.op._schema.name == "aten::_batch_norm_with_update" or \
            call.op._schema.name == "aten::_batch_norm_with_update_functional":
        training = True
    cost = call.cost(flops=(6 if training else 2) * call.args[0].numel())
    if training:
        return cost
    # with running statistics only the output is written: the saved-statistics outputs are empty
    # on a CPU and C long on meta, so they are left out to make the count device-independent
    return Cost(0, cost.flops, cost.bytes_read, tensor_bytes(call.output))


@rule("aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_no_update")
def batch_norm_eval(call: OpCall) -> Cost:
    """Batch norm with running statistics: y = x * a_c + b_c: 2 FLOPs per element."""
    return call.cost(flops=2 * call.args[0].numel())


@rule("aten::native_batch_norm_backward", "aten::batch_norm_backward",
      "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward")
def batch_norm_backward(call: OpCall) -> Cost:
    """Batch norm gradient. With batch statistics, grad_input = a/N * (N g - sum g - x^ sum(g x^)):
    recompute x^ (2), g*x^ (1), two sums (2), N g - sum - x^*s (3), scale (1) = 9 FLOPs per element,
    and grad_weight/grad_bias reuse those sums. With running statistics: grad_input = g * a (1),
    grad_weight = sum(g * x^) (recompute 2 + multiply 1 + add 1 = 4), grad_bias = sum(g) (1), each
    as asked for by output_mask; the saved statistics are then not read (not counted as read)."""
    n = call.args[1].numel()
    train = named_arg(call, "train", None)
    if train is None:
        train = named_arg(call, "training", True)
    mask = _mask(call)
    if train:
        return call.cost(flops=9 * n if any(mask) else 0)
    cost = call.cost(flops=n * ((1 if mask[0] else 0) + (4 if mask[1] else 0) + (1 if mask[2] else 0)))
    # with running statistics the saved-statistics inputs are not read (and are empty on a CPU)
    unread = sum(tensor_bytes(t) for t in (named_arg(call, "save_mean"), named_arg(call, "save_invstd"),
                                          named_arg(call, "save_var"))
                 if isinstance(t, torch.Tensor))
    return Cost(0, cost.flops, cost.bytes_read - unread, cost.bytes_written)


def _affine(call: OpCall) -> int:
    return int(named_arg(call, "weight") is not None) + int(named_arg(call, "bias") is not None)


@rule("aten::native_layer_norm", "aten::native_group_norm")
def layer_norm(call: OpCall) -> Cost:
    """Layer/group norm: statistics 4 + normalize 2 = 6 FLOPs per element, +1 with a weight and +1
    with a bias (8 for the usual affine norm)."""
    return call.cost(flops=(6 + _affine(call)) * call.args[0].numel())


@rule("aten::native_layer_norm_backward", "aten::native_group_norm_backward")
def layer_norm_backward(call: OpCall) -> Cost:
    """Layer/group norm gradient: grad_input = rstd * (g' - mean(g') - x^ mean(g' x^)) with
    g' = g * w: recompute x^ (2), g' (1 with a weight), g' x^ (1), two means (2), subtract twice and
    multiply (3), scale (1) = 9 FLOPs per element (+1 with a weight); grad_weight = sum(g x^) = 2 more
    (multiply, add; x^ is shared); grad_bias = sum(g) = 1; each as asked for by output_mask."""
    n = call.args[1].numel()
    mask = _mask(call)
    weighted = named_arg(call, "weight") is not None
    flops = (9 + int(weighted) if mask[0] else 0) + (2 if mask[1] else 0) + (1 if mask[2] else 0)
    return call.cost(flops=flops * n)


@rule("aten::_fused_rms_norm")
def rms_norm(call: OpCall) -> Cost:
    """RMS norm: square (1) and sum (1) for the mean square, multiply by 1/rms (1) = 3 FLOPs per
    element, +1 with a weight."""
    weighted = named_arg(call, "weight") is not None
    return call.cost(flops=(3 + int(weighted)) * call.args[0].numel())


@rule("aten::_fused_rms_norm_backward")
def rms_norm_backward(call: OpCall) -> Cost:
    """RMS norm gradient: g' = g * w (1), x * g' summed (2), dx = rstd * (g' - x * rstd^2 * s / D)
    (4) = 7 FLOPs per element; grad_weight = sum(g * x * rstd) = 3 more."""
    n = call.args[1].numel()
    mask = _mask(call)
    return call.cost(flops=n * ((7 if mask[0] else 0) + (3 if len(mask) > 1 and mask[1] else 0)))
