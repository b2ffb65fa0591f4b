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


def _adjacency() -> torch.Tensor:
    a = torch.zeros(6, 5)
    a[0, 1], a[2, 3], a[5, 0] = 1.0, 2.0, 3.0  # 3 stored entries
    return a


class _Graph(nn.Module):
    """A graph layer: a sparse adjacency buffer times the features (torch.sparse.mm)."""

    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        a = _adjacency()
        self.register_buffer("adjacency", a.to_sparse() if layout is torch.sparse_coo
                             else a.to_sparse_csr())
        self.weight = nn.Parameter(torch.randn(5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.adjacency, self.weight * x)


def _real_and_shape_only(model: nn.Module, *args: Any, **options: Any) -> list[tuple[int, int]]:
    reports = [flopscope.count(model, *args, **options),
               flopscope.count(model, *args, shape_only=True, **options)]
    return [(r.macs, r.flops) for r in reports]


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_a_sparse_buffer_keeps_its_stored_entries(layout: torch.layout) -> None:
    # weight * x: 20 FLOPs; the sparse product: nnz x n = 3 x 4 = 12 MACs, 2 x 12 FLOPs + 6 x 4
    # adds of the (zero) output it accumulates into
    assert _real_and_shape_only(_Graph(layout), torch.randn(5, 4)) == [(12, 20 + 24 + 24)] * 2


def test_the_backward_of_a_sparse_coo_product_keeps_its_stored_entries() -> None:
    # forward as above; backward: the weight's gradient through A^T @ dY, 3 x 4 = 12 MACs, and
    # the product rule of weight * x: 20 FLOPs
    twice = _real_and_shape_only(_Graph(torch.sparse_coo), torch.randn(5, 4), backward=True)
    assert twice == [(24, 68 + 24 + 20)] * 2


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_a_sparse_input_keeps_its_stored_entries(layout: torch.layout) -> None:
    a = _adjacency()
    x = a.to_sparse() if layout is torch.sparse_coo else a.to_sparse_csr()
    product = nn.Linear(5, 4, bias=False)
    # x @ W^T through linear on a sparse input: nnz x 4 = 12 MACs
    assert _real_and_shape_only(product, x) == [(12, 24)] * 2


class _Quantized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 32)
        self.lstm = nn.LSTM(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.lin(x))[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16])
def test_dynamically_quantized_layers_count_shape_only(dtype: torch.dtype) -> None:
    # The rules read the packed weights (a script object holding real tensors), which failed
    # (int8: NotImplemented on QuantizedMeta) or crashed the process (float16) under the fake
    # mode of a shape-only run.
    model = torch.ao.quantization.quantize_dynamic(_Quantized(), {nn.Linear, nn.LSTM}, dtype=dtype)
    x = torch.randn(5, 2, 16)  # 5 steps, batch 2
    real, shape_only = _real_and_shape_only(model, x)
    # MACs as the float model: linear 10 x 16 x 32 = 5,120; LSTM 10 rows x 4 gates x 8 x (32 + 8)
    # = 12,800
    assert real == shape_only
    assert real[0] == 5120 + 12800


def test_an_lstm_on_a_packed_sequence_counts_shape_only() -> None:
    from torch.nn.utils.rnn import pack_padded_sequence

    lstm = nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    packed = pack_padded_sequence(torch.randn(5, 3, 4), [5, 3, 2])  # batch sizes 3, 3, 2, 1, 1
    # per direction, each row of each step: 4 gates x 6 x (input + 6) MACs; 10 rows;
    # layer 0: input 4 -> 10 x 24 x 10 = 2,400 per direction; layer 1: input 12 -> 10 x 24 x 18
    # = 4,320 per direction
    macs = 2 * (2400 + 4320)
    assert [r[0] for r in _real_and_shape_only(lstm, packed)] == [macs, macs]
    assert len(set(_real_and_shape_only(lstm, packed))) == 1
    with torch.device("meta"):
        on_meta = nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    assert flopscope.count(on_meta, packed).macs == macs


def test_packing_a_padded_batch_is_counted() -> None:
    from torch.nn.utils.rnn import pack_padded_sequence

    x = torch.randn(5, 3, 4)  # 60 floats: 240 bytes
    with flopscope.Counter() as counter:
        pack_padded_sequence(x, [5, 3, 2])
    packing = counter.report.by_op()["aten._pack_padded_sequence.default"]
    assert packing.cost.flops == 0  # rows gathered, no arithmetic
    assert counter.report.uncounted == {}
