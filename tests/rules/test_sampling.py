"""Grid sampling, fractional max pooling, max unpooling."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rules._util import count, op


def test_grid_sample_bilinear_2d() -> None:
    x, grid = torch.randn(2, 3, 5, 5), torch.rand(2, 4, 6, 2) * 2 - 1
    cost = op(count(lambda: F.grid_sample(x, grid, align_corners=False)),
              "aten.grid_sampler_2d.default")
    # 2*4*6 = 48 locations: per coordinate unnormalize 3 + floor, fraction, 1 - t 3 = 6, two
    # coordinates + 4 tap weights = 16; per output element (x 3 channels) 4 multiplies + 3 adds
    assert cost.flops == 48 * 16 + 48 * 3 * 7  # 768 + 1,008 = 1,776
    assert cost.macs == 0


def test_grid_sample_nearest_border_and_trilinear_3d() -> None:
    x, grid = torch.randn(2, 3, 5, 5), torch.rand(2, 4, 6, 2) * 2 - 1
    nearest = op(count(lambda: F.grid_sample(x, grid, mode="nearest", padding_mode="border",
                                             align_corners=False)), "aten.grid_sampler_2d.default")
    assert nearest.flops == 48 * 2 * (3 + 2 + 1)  # unnormalize, clamp, round; copies are free
    v, grid3 = torch.randn(1, 2, 4, 4, 4), torch.rand(1, 2, 3, 3, 3) * 2 - 1
    tri = op(count(lambda: F.grid_sample(v, grid3, align_corners=True)),
             "aten.grid_sampler_3d.default")
    # 18 locations x (3 coordinates x 6 + 8 taps x 2 multiplies = 34) + 18 x 2 channels x 15
    assert tri.flops == 18 * 34 + 18 * 2 * 15  # 612 + 540 = 1,152


def test_grid_sample_backward() -> None:
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    grid = (torch.rand(1, 3, 3, 2) * 2 - 1).requires_grad_()
    report = count(lambda: F.grid_sample(x, grid, align_corners=False), backward=True)
    cost = op(report, "aten.grid_sampler_2d_backward.default", "backward")
    # 9 locations: per-location part 16 recomputed; grad_input 4 taps x (multiply, add) = 8 per
    # element; grad_grid 4 taps x (1 + 2*2) = 20 per element + 2 per location
    assert cost.flops == 9 * 16 + 9 * 2 * 8 + 9 * 2 * 20 + 9 * 2  # 144 + 144 + 360 + 18 = 666


def test_fractional_max_pool_and_unpool() -> None:
    x = torch.randn(1, 2, 8, 8)
    pooled = op(count(lambda: F.fractional_max_pool2d(x, 2, output_size=4)),
                "aten.fractional_max_pool2d.default")
    assert pooled.flops == 1 * 2 * 4 * 4 * 4  # 32 outputs, a 2 x 2 window each
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    unpooled = op(count(lambda: F.max_unpool2d(y, idx, 2)), "aten.max_unpool2d.default")
    assert unpooled.flops == 0  # a scatter copy
    assert unpooled.bytes_written == 2 * 8 * 8 * 4
