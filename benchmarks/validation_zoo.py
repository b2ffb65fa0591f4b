"""Reduced-input variants of torchvision classifiers too large to measure under valgrind here at
their own input size (``docs/validation.md``, zoo table).

``vit_h_14`` at 224x224 is 632 M parameters (5.1 GB in float64) and 167.3 GMAC (torchvision's
published ``_ops`` figure, which flopscope's count equals), 2.7x ``vit_l_16``. torchvision's
``VisionTransformer`` takes ``image_size`` as an argument (the position embedding is sized to
it), so the same network -- 32 layers, hidden size 1,280, MLP 5,120, 16 heads, 14x14 patches -- is
measured on a 112x112 image: 64 patches and the class token instead of 256 and one, 41.3 GMAC.
Under valgrind on the shared 2-core machine the page is made on, that took 15.5 minutes (2 to
start, 8 to build the weights and count, 5.5 for the warm-up and the measured forward); the
forwards grow 4x at 224x224, an estimated 35 to 55 minutes in all, beside a zoo224 sweep that
already takes hours. What changes with the image is how many tokens each layer sees (linear
layers scale with tokens, attention scores with their square); the per-token arithmetic, which
is what measured/counted checks, is the same.

Each factory returns ``(model, input)`` in float32 with random weights (seed 0); the validation
casts them to float64: ``python -m benchmarks.validation --dtype float64 --out
docs/validation/zoo224 --models benchmarks/validation_zoo.py:vit_h_14_112``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Variant:
    """A zoo model measured at a smaller input than its own.

    Attributes:
        source: the variant's SOURCE (a factory in this file).
        label: how the page's zoo table names it.
        reason: why the model itself is not measured, and what the variant keeps.
    """

    source: str
    label: str
    reason: str


VARIANTS: dict[str, Variant] = {
    "vit_h_14": Variant(
        "benchmarks/validation_zoo.py:vit_h_14_112", "vit_h_14 (image_size=112)",
        "at 224x224 it is 632 M parameters (5.1 GB in float64) and 167.3 GMAC (= torchvision's "
        "published figure), 2.7x vit_l_16: an estimated 35 to 55 minutes under valgrind on this "
        "shared 2-core machine, beside a zoo224 sweep of hours (`python -m benchmarks.validation "
        "--dtype float64 --out docs/validation/zoo224 --models vit_h_14` measures it where time "
        "allows). The same network built for 112x112 images (all 32 layers and widths; 64 "
        "patches + the class token instead of 256 + 1; 41.3 GMAC) took 15.5 minutes and is "
        "measured instead: the per-token arithmetic is the same, only the number of tokens "
        "changes."),
}
"""torchvision name -> its reduced-input variant."""


def vit_h_14_model(image_size: int) -> nn.Module:
    """torchvision's ViT-H/14 (random weights, eval mode) built for square images of one size.

    Args:
        image_size: the image side; a multiple of the 14-pixel patch.

    Returns:
        The model.
    """
    import torchvision.models as tvm

    return tvm.vit_h_14(weights=None, image_size=image_size).eval()


def vit_h_14_112() -> tuple[nn.Module, torch.Tensor]:
    """ViT-H/14 built for 112x112 images, and one such image (seed 0).

    Returns:
        (the model in eval mode, a 1x3x112x112 input).
    """
    torch.manual_seed(0)
    return vit_h_14_model(112), torch.randn(1, 3, 112, 112, generator=torch.Generator().manual_seed(0))


class _Call(nn.Module):
    """One call on tensors held as plain attributes (a child module per operator)."""

    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn()


class MaxVitAttentionCore(nn.Module):
    """The functional code of maxvit_t's ``RelativePositionalMultiHeadAttention`` at its first
    stage (56x56 x 64 channels: 8x8 windows of 7x7 = 49 tokens, 2 heads of 32), one child module
    per operator as torchvision writes them: ``scores`` (q k^T, an einsum), ``bias`` (+ the
    relative-position bias), ``softmax``, ``values`` (attention x v, an einsum), ``scale``
    (q * 32**-0.5), all float64."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        win, heads, n, d = 64, 2, 49, 32
        q, k, v = (torch.randn(1, win, heads, n, d, dtype=torch.float64, generator=g)
                   for _ in range(3))
        s = torch.randn(1, win, heads, n, n, dtype=torch.float64, generator=g)
        bias = torch.randn(1, 1, heads, n, n, dtype=torch.float64, generator=g)
        self.scores = _Call(lambda: torch.einsum("BGHID,BGHJD->BGHIJ", q, k))
        self.bias = _Call(lambda: s + bias)
        self.softmax = _Call(lambda: torch.softmax(s, dim=-1))
        self.values = _Call(lambda: torch.einsum("BGHIJ,BGHJD->BGHID", s, v))
        self.scale = _Call(lambda: q * d ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for op in (self.scores, self.bias, self.softmax, self.values, self.scale):
            op(x)
        return x


def maxvit_attention_core() -> tuple[nn.Module, torch.Tensor]:
    """maxvit_t's attention core, operator by operator, for ``flopscope measure
    benchmarks/validation_zoo.py:maxvit_attention_core --dtype float64`` (split per operator).

    Returns:
        (the module, a dummy input).
    """
    return MaxVitAttentionCore(), torch.zeros(1, dtype=torch.float64)
