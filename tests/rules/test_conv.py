"""Convolution: N * prod(out_spatial) * numel(W) MACs (transposed: the input's spatial size)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rules._util import count, leaf, op

CONV = "aten.convolution.default"


def test_conv1d() -> None:
    x, w = torch.randn(1, 3, 10), torch.randn(4, 3, 3)
    cost = op(count(lambda: F.conv1d(x, w)), CONV)
    assert (cost.macs, cost.flops) == (8 * 4 * 3 * 3, 2 * 288)  # L_out 8 * W 36 = 288 MACs


def test_conv2d_groups_stride_dilation_padding_bias() -> None:
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)
    x = torch.randn(2, 4, 9, 9)
    cost = op(count(lambda: conv(x)), CONV)
    # out = floor((9 + 2 - 2*(3-1) - 1)/2) + 1 = 4; W [6, 4/2, 3, 3] = 108 elements
    macs = 2 * 4 * 4 * 108  # N * out_h * out_w * numel(W) = 3,456
    assert cost.macs == macs
    assert cost.flops == 2 * macs + 2 * 6 * 4 * 4  # + one bias add per output element (192)


def test_conv3d() -> None:
    x, w = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2)
    assert op(count(lambda: F.conv3d(x, w)), CONV).macs == 27 * 48  # 3*3*3 outputs * 48 = 1,296


def test_conv_transpose2d() -> None:
    conv = nn.ConvTranspose2d(4, 3, 3, stride=2)
    x = torch.randn(1, 4, 5, 5)
    cost = op(count(lambda: conv(x)), CONV)
    # each of the 5*5 input positions scatters into numel(W [4, 3, 3, 3]) = 108 products
    assert cost.macs == 25 * 108  # 2,700
    assert cost.flops == 2 * 2700 + 3 * 11 * 11  # output (5-1)*2 + 3 = 11: 363 bias adds


@pytest.mark.parametrize("input_grad", [True, False])
def test_convolution_backward_output_mask(input_grad: bool) -> None:
    conv = nn.Conv2d(2, 4, 3, padding=1)
    x = leaf(1, 2, 6, 6) if input_grad else torch.randn(1, 2, 6, 6)
    report = count(lambda: conv(x), backward=True)
    fwd = 36 * 4 * 2 * 9  # 6*6 outputs * numel(W) 72 = 2,592
    cost = op(report, "aten.convolution_backward.default", "backward")
    # grad_input (mask[0], only when x requires grad) and grad_weight each cost the forward's MACs;
    # grad_bias sums grad_output: one add per element (4*6*6 = 144)
    macs = fwd * (2 if input_grad else 1)
    assert (cost.macs, cost.flops) == (macs, 2 * macs + 144)
