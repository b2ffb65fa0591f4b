"""Counting a ``torch.compile``'d model: Dynamo stays out of flopscope's dispatch handler."""

from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.utils import counters

import flopscope


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_compiled_model_counts_as_eager_and_dynamo_compiles_no_flopscope_frame() -> None:
    model = _model()
    x = torch.randn(2, 8)
    eager = flopscope.count(model, x, warn=False)
    compiled = torch.compile(model, backend="eager")
    compiled(x)  # compiled once, before counting
    frames = counters["frames"]["total"]
    report = flopscope.count(compiled, x, warn=False)
    # Linear(8, 16) and Linear(16, 4) on 2 rows: 2*8*16 + 2*16*4 = 256 + 128 = 384 MACs
    assert report.macs == eager.macs == 384
    assert report.flops == eager.flops
    # Dynamo would otherwise compile the dispatch handler's frame (and what it calls) while
    # the compiled model runs under the count: no new frame may be compiled
    assert counters["frames"]["total"] == frames
