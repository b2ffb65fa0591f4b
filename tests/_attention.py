"""The attention block of issue 3 and its wrappers, shared by the module-rule and thop tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DIM, HEADS, B, N = 768, 12, 1, 640

# The user's rule: qkv (3*N*C*C) + proj (N*C*C) = 4*N*C^2, plus q@k^T and attn@v (N*N*C each).
RULE_MACS = B * 4 * N * DIM**2 + B * 2 * DIM * N**2  # 2,139,095,040
LINEAR_MACS = B * 4 * N * DIM**2  # qkv + proj only: 1,509,949,440 (what thop sees)
PARAMS = 3 * DIM * DIM + DIM * DIM + DIM  # qkv (no bias) + proj (with bias): 2,360,064


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        x = (self.attn_drop(attn) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))  # type: ignore[no-any-return]


class Wrapper(nn.Module):
    """Holds one Attention, calls it once."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(DIM, num_heads=HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)  # type: ignore[no-any-return]


class TwiceWrapper(nn.Module):
    """Holds one Attention, calls it twice in a row."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(DIM, num_heads=HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.attn(x))  # type: ignore[no-any-return]


def attention_rule(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> int:
    """macs = B*4*N*C**2 + B*2*C*N**2, from the input's shape."""
    b, n, c = inputs[0].shape
    return int(b * 4 * n * c**2 + b * 2 * c * n**2)


def thop_attention_rule(module: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """The same rule written thop-style: add to ``module.total_ops``."""
    b, n, c = inputs[0].shape
    module.total_ops += torch.DoubleTensor([int(b * 4 * n * c**2 + b * 2 * c * n**2)])


def sample() -> torch.Tensor:
    return torch.randn(B, N, DIM)
