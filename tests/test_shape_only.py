"""Shape-only counts equal real counts where a model does more than arithmetic on dense tensors:
assertions on values, models on ``meta`` that hold a few CPU tensors, sparse buffers,
dynamically quantized layers, packed sequences. Each case: the real CPU count, the shape-only
count of the same model, and the count of the model built on ``meta``, MACs and FLOPs exactly."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import flopscope


def _three_ways(build: Callable[[], nn.Module], *args: Any) -> list[tuple[int, int]]:
    """(MACs, FLOPs) of the real model, of it shape-only, and of it built on ``meta``; nothing
    may be left uncounted."""
    torch.manual_seed(0)
    model = build()
    with torch.device("meta"):
        on_meta = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        reports = [flopscope.count(model, *args), flopscope.count(model, *args, shape_only=True),
                   flopscope.count(on_meta, *args)]
    return [(r.macs, r.flops) for r in reports]


class _Checked(nn.Module):
    """A linear layer behind transformers' kind of check (``torch._check_tensor_all``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._check_tensor_all_with(ValueError, x > -1e9, lambda: "inputs must be finite")
        return self.lin(x)  # type: ignore[no-any-return]


def test_assertions_on_values_hold_in_a_shape_only_count() -> None:
    # linear: 2 x 8 x 8 = 128 MACs, 2 x 128 + 16 bias adds; the comparison x > -1e9: 16;
    # the check itself (_is_all_true) 0
    assert _three_ways(_Checked, torch.randn(2, 8)) == [(128, 256 + 16 + 16)] * 3


def test_a_failing_assertion_still_raises_in_a_real_count() -> None:
    with pytest.raises(flopscope.ForwardError, match="inputs must be finite"):
        flopscope.count(_Checked(), torch.full((2, 8), -1e10))


class _HoldsCpuTensors(nn.Module):
    """Built under ``torch.device("meta")``, it still holds CPU tensors, each way a model can:
    a parameter and a buffer made with an explicit device (transformers' ``masked_spec_embed``
    and ImageGPT's layer-norm weight, made with ``torch.Tensor(n)``), a plain attribute, and a
    tensor made inside forward with ``device="cpu"``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8, device="cpu"))
        self.register_buffer("shift", torch.zeros(8, device="cpu"))
        self.table = torch.ones(8, device="cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.scale + self.shift
        return y * self.table + torch.arange(8, device="cpu", dtype=torch.float32)


def test_a_meta_model_holding_cpu_tensors_counts_like_the_real_one() -> None:
    # linear 2 x 8 x 8 = 128 MACs, 256 + 16 FLOPs; then 4 element-wise ops on 16 elements: 64
    assert _three_ways(_HoldsCpuTensors, torch.randn(2, 8)) == [(128, 256 + 16 + 64)] * 3
