"""Pooling (k FLOPs per output for a k-element window; adaptive: exact windows) and
interpolation (taps: nearest 0, linear 3, bilinear 7, bicubic 35, trilinear 15 per output)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rules._util import count, leaf, op


def test_max_and_avg_pool_1d_2d_3d() -> None:
    # 2x2 window over (1,2,4,4): 2*2*2 = 8 outputs * 4
    assert count(lambda: nn.MaxPool2d(2)(torch.randn(1, 2, 4, 4))).flops == 8 * 4
    # window 3, stride 1 over length 5: 3 outputs * 3
    assert count(lambda: nn.AvgPool1d(3, stride=1)(torch.randn(1, 1, 5))).flops == 3 * 3
    # 2x2x2 window over (1,1,4,4,4): 8 outputs * 8
    assert count(lambda: nn.MaxPool3d(2)(torch.randn(1, 1, 4, 4, 4))).flops == 8 * 8
    assert count(lambda: nn.AvgPool3d(2)(torch.randn(1, 1, 4, 4, 4))).flops == 8 * 8


def test_adaptive_pool_exact_windows() -> None:
    # 5 -> 2: windows [0,3) and [2,5) = 3 + 3; 7 -> 3: [0,3), [2,5), [4,7) = 9; 6 * 9 = 54
    x = torch.randn(1, 1, 5, 7)
    assert count(lambda: nn.AdaptiveAvgPool2d((2, 3))(x)).flops == 54
    assert count(lambda: nn.AdaptiveMaxPool2d((2, 3))(x)).flops == 54
    assert count(lambda: nn.AdaptiveMaxPool1d(2)(torch.randn(1, 1, 5))).flops == 6
    # (2,2,2) -> (1,2,2) over 2 channels: depth window 2, 1 each for h, w: 2 * (2 * 2 * 2)
    assert count(lambda: nn.AdaptiveAvgPool3d((1, 2, 2))(torch.randn(1, 2, 2, 2, 2))).flops == 16


def test_pool_backward() -> None:
    x = leaf(1, 2, 4, 4)
    report = count(lambda: F.max_pool2d(x, 2), backward=True)
    # each of the 8 grad_output elements is added at its argmax
    assert op(report, "aten.max_pool2d_with_indices_backward.default", "backward").flops == 8
    report = count(lambda: F.avg_pool2d(x, 2), backward=True)
    # g/k once and added to k inputs: (4 + 1) per grad_output element
    assert op(report, "aten.avg_pool2d_backward.default", "backward").flops == 5 * 8


@pytest.mark.parametrize(
    ("shape", "mode", "name", "per_output"),
    [
        ((1, 2, 5), "linear", "aten.upsample_linear1d.default", 3),
        ((1, 2, 5, 6), "nearest", "aten.upsample_nearest2d.default", 0),
        ((1, 2, 5, 6), "nearest-exact", "aten._upsample_nearest_exact2d.default", 0),
        ((1, 2, 5, 6), "bilinear", "aten.upsample_bilinear2d.default", 7),
        ((1, 2, 5, 6), "bicubic", "aten.upsample_bicubic2d.default", 35),
        ((1, 2, 3, 4, 5), "trilinear", "aten.upsample_trilinear3d.default", 15),
    ],
)
def test_interpolate(shape: tuple[int, ...], mode: str, name: str, per_output: int) -> None:
    x = leaf(*shape)
    report = count(lambda: F.interpolate(x, scale_factor=2, mode=mode), backward=True)
    outputs = x.numel() * 2 ** (len(shape) - 2)  # scale 2 in every spatial dim
    cost = op(report, name)
    assert cost.flops == per_output * outputs
    assert cost.bytes_written == outputs * 4
    assert report.uncounted == {}


@pytest.mark.parametrize(("mode", "name"), [("reflect", "aten.reflection_pad2d_backward.default"),
                                            ("replicate",
                                             "aten.replication_pad2d_backward.default")])
def test_padding_backward(mode: str, name: str) -> None:
    # (1, 2, 5, 6) padded by (1, 2) columns and (1, 1) rows: grad_output 1 x 2 x 7 x 9 = 126
    # elements, each added to the input element it was copied from: 126 FLOPs
    x = leaf(1, 2, 5, 6)
    report = count(lambda: F.pad(x, (1, 2, 1, 1), mode=mode), backward=True)
    assert op(report, name, "backward").flops == 126
    assert report.uncounted == {}
