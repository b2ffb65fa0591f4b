"""Window partitions under symbolic sizes (torchvision's maxvit_t pattern): sizes that PyTorch's
reshape leaves as floor-division expressions, which a guard then pins to a number, are written as
that number (flopscope.symbolic.fake.PinningFakeMode), so they do not grow block after block.

Before, each block below doubled the time of a symbolic count (1, 2, 3 blocks: 5.5, 11.8,
23.3 s on this machine; maxvit_t gave no result in 14 minutes), and the blocks after the first
cost nested ``floor`` expressions instead of numbers."""

from __future__ import annotations

import os

import pytest
import sympy
import torch
from torch import nn

import flopscope
from flopscope.symbolic import DomainError, count_symbolic


class _Windows(nn.Module):
    """maxvit's window attention without the attention: cut the image into p x p windows (how
    many follows from the input), mix channels in each, and put the windows back on the grid
    fixed when the model was built (``grid * p`` square), as ``WindowDepartition`` does."""

    def __init__(self, channels: int, grid: int, p: int) -> None:
        super().__init__()
        self.grid, self.p = grid, p
        self.mix = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p, g = self.p, self.grid
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        x = self.mix(x.reshape(b, (h // p) * (w // p), p * p, c))
        x = x.reshape(b, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(b, c, g * p, g * p)


def _model(blocks: int) -> nn.Sequential:
    # 3 x r x r -> stride-2 convolution -> 4 x 28 x 28 (for r = 55, 56) -> 4 x 4 windows of 7 x 7
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1),
                         *[_Windows(4, 4, 7) for _ in range(blocks)]).eval()


SPEC = {"batch": (0, 0), "resolution": [(0, 2), (0, 3)]}


def test_window_partitions_pin_to_numbers_and_equal_concrete_counts() -> None:
    rep = count_symbolic(_model(6), torch.zeros(2, 3, 56, 56), symbolic=SPEC, warn=False)
    b, r = rep.symbols["batch"], rep.symbols["resolution"]
    side = sympy.floor((r - 1) / 2) + 1  # the convolution's output size: (r + 2 - 3) // 2 + 1
    # the convolution: 4 output channels x 27 products per output position
    assert sympy.expand(rep.by_module()["0"].macs - 108 * b * side**2) == 0
    # the first block sees (side // 7)**2 windows of 49 positions, 4 x 4 products each
    assert sympy.expand(rep.by_module()["1"].macs - 784 * b * sympy.floor(side / 7) ** 2) == 0
    # every later block sees the 4 x 4 grid of the first block's output: numbers, no floor()
    for i in range(2, 7):
        assert rep.by_module()[str(i)].macs == 12544 * b  # 16 windows * 49 positions * 4 * 4
    # the formula holds where the model runs: the grid needs side == 28, i.e. r in {55, 56}
    assert [n for n in range(40, 80) if not rep.violated(batch=2, resolution=n)] == [55, 56]
    # below 13 not one 7 x 7 window fits: a guard's Mod by the number of windows divides by 0
    # there, and such a guard does not hold (it raised ZeroDivisionError)
    assert rep.violated(batch=2, resolution=5)
    for batch, res in ((3, 55), (5, 56)):
        concrete = flopscope.count(_model(6), torch.zeros(batch, 3, res, res), shape_only=True,
                                   warn=False)
        evaluated = rep.evaluate(batch=batch, resolution=res)
        assert evaluated.total() == concrete.total()
        assert {p: s.inclusive for p, s in evaluated.by_module().items()} == \
            {p: s.inclusive for p, s in concrete.by_module().items()}
    with pytest.raises(DomainError, match="resolution=57 is outside the domain"):
        rep.evaluate(batch=2, resolution=57)


def test_pinned_sizes_under_backward() -> None:
    # backward replays nothing (flopscope.core.memo): the pinned sizes must hold for autograd's views
    model = _model(3).train()
    rep = count_symbolic(model, torch.zeros(2, 3, 56, 56), symbolic=SPEC, warn=False,
                         backward=True)
    b = rep.symbols["batch"]
    assert rep.by_module("forward")["3"].macs == 12544 * b
    assert rep.by_module("backward")["3"].macs == 2 * 12544 * b  # input and weight gradients
    concrete = flopscope.count(_model(3).train(), torch.zeros(3, 3, 55, 55), shape_only=True,
                               backward=True, warn=False)
    assert rep.evaluate(batch=3, resolution=55).total() == concrete.total()


@pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"), reason="slow tier: FLOPSCOPE_SLOW=1")
def test_maxvit_t_against_resolution() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.maxvit_t().eval()
    rep = count_symbolic(model, torch.zeros(2, 3, 224, 224), symbolic=SPEC, warn=False)
    # the window grid fixed at construction (8 x 8 windows of 7 after a stride of 4) holds for
    # (r - 1) // 4 + 1 == 56: resolutions 221 to 224
    assert [n for n in range(200, 260) if not rep.violated(batch=2, resolution=n)] == \
        [221, 222, 223, 224]
    for batch, res in ((2, 224), (3, 221)):
        concrete = flopscope.count(model, torch.zeros(batch, 3, res, res), shape_only=True,
                                   warn=False)
        assert rep.evaluate(batch=batch, resolution=res).total() == concrete.total()
    # torchvision publishes 5.56 GFLOPS (multiply-accumulates) per image at 224
    per_image = rep.evaluate(batch=2, resolution=224).total().macs / 2
    assert round(per_image / 1e9, 2) == 5.56
