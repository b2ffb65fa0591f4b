"""Normalizations: statistics 4 + normalize 2 per element (+1 weight, +1 bias); eval batch norm 2."""

from __future__ import annotations

import torch
from torch import nn

import flopscope
from rules._util import count


def _flops(module: nn.Module, x: torch.Tensor, train: bool) -> int:
    return flopscope.count(module, x, train=train).flops


def test_batch_norm_train_and_eval() -> None:
    bn, x = nn.BatchNorm2d(3), torch.randn(2, 3, 4, 4)  # 96 elements
    # statistics 4 + scale-and-shift 2 per element; num_batches_tracked += 1 is integer work,
    # not a FLOP (flopscope.core.numbers)
    assert _flops(bn, x, train=True) == 6 * 96
    assert _flops(bn, x, train=False) == 2 * 96  # x * a_c + b_c with running statistics
    assert _flops(nn.BatchNorm1d(3), torch.randn(4, 3), train=True) == 6 * 12


def test_layer_norm() -> None:
    x = torch.randn(2, 3, 4)  # 24 elements
    assert _flops(nn.LayerNorm(4), x, train=True) == 8 * 24  # 6 + weight + bias
    assert _flops(nn.LayerNorm(4), x, train=False) == 8 * 24  # no mode dependence
    assert _flops(nn.LayerNorm(4, elementwise_affine=False), x, train=True) == 6 * 24


def test_group_norm() -> None:
    assert _flops(nn.GroupNorm(2, 4), torch.randn(2, 4, 3, 3), train=True) == 8 * 72


def test_instance_norm_is_batch_norm_on_reshaped_input() -> None:
    x = torch.randn(2, 3, 4, 4)  # 96 elements, statistics per (sample, channel)
    assert _flops(nn.InstanceNorm2d(3), x, train=True) == 6 * 96
    assert _flops(nn.InstanceNorm2d(3), x, train=False) == 6 * 96  # still batch statistics


def test_rms_norm() -> None:
    x = torch.randn(2, 3, 4)  # 24 elements
    report = flopscope.count(nn.RMSNorm(4), x)
    assert report.uncounted == {}
    # on the CPU nn.RMSNorm runs decomposed: pow (24), mean (24 adds + 6 row divides), + eps (6
    # rows), rsqrt (6), x * rsqrt (24), * weight (24); the fused kernel's rule (aten::_fused_rms_norm)
    # charges square + sum + scale + weight = 4 per element: the same per-element part
    assert report.flops == 4 * 24 + 3 * 6


def test_layer_norm_backward() -> None:
    ln, x = nn.LayerNorm(4), torch.randn(2, 3, 4, requires_grad=True)
    report = count(lambda: ln(x), backward=True)
    back = report.by_op("backward")["aten.native_layer_norm_backward.default"].cost
    # grad_input 9 + 1 (weight), grad_weight 2, grad_bias 1 per element
    assert back.flops == (10 + 2 + 1) * 24
