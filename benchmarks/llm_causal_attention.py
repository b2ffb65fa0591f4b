"""Factories for ``flopscope measure``: one causal (or dense) self-attention call on the CPU flash
kernel, to check the executed figure of :mod:`flopscope.llm.attention` under valgrind::

    flopscope measure benchmarks/llm_causal_attention.py:causal --backend valgrind
    flopscope measure benchmarks/llm_causal_attention.py:dense --backend valgrind

One head, L = 1024, d = 64 (float64 by default in ``measure``). Per head the dense kernel computes
1024^2 = 1,048,576 scores; the causal kernel (query blocks of 256, key blocks of 512) computes
256 x (512 + 512 + 1024 + 1024) = 786,432 (75%); the model's visible pairs are
1024 x 1025 / 2 = 524,800 (50.05%).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

L, D = 1024, 64


class Attention(nn.Module):
    """``x`` [1, 1, L, 3D] split into q, k, v; one SDPA call."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = x.split(D, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def causal() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Causal self-attention."""
    return Attention(True), (torch.randn(1, 1, L, 3 * D),)


def dense() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The same without a mask."""
    return Attention(False), (torch.randn(1, 1, L, 3 * D),)
