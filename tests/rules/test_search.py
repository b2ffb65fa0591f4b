"""Histograms (bin arithmetic counted), searching and selecting (0 FLOPs), allclose."""

from __future__ import annotations

import torch

from rules._util import count, op


def test_histc() -> None:
    x = torch.randn(100)
    # bin index (subtract, multiply, floor) + count = 4 per element, + min and max without a range
    assert op(count(lambda: torch.histc(x, bins=10)), "aten.histc.default").flops == 600
    ranged = count(lambda: torch.histc(x, bins=10, min=-1, max=1))
    assert op(ranged, "aten.histc.default").flops == 400


def test_histogram_with_edges_and_density() -> None:
    x, edges = torch.randn(50), torch.linspace(-2, 2, 6)
    cost = op(count(lambda: torch.histogram(x, edges, density=True)), "aten.histogram.bins_tensor")
    assert cost.flops == 50 + 3 * 5  # search 0 + accumulate 1 per element; density 3 per bin


def test_searching_and_selecting_are_zero() -> None:
    ids = torch.randint(0, 100, (4, 16))
    cost = op(count(lambda: torch.isin(ids, torch.tensor([2, 7]))), "aten.isin.Tensor_Tensor")
    assert cost.flops == 0
    assert cost.bytes_read == 4 * 16 * 8 + 2 * 8 and cost.bytes_written == 64
    x = torch.randn(5, 7)
    assert op(count(lambda: x.median(dim=1)), "aten.median.dim").flops == 0
    assert op(count(lambda: x.mode(dim=1)), "aten.mode.default").flops == 0


def test_allclose() -> None:
    a, b = torch.randn(4, 5), torch.randn(5)
    # broadcast to 20 elements: sub, 2 abs, multiply, add, compare + the all-reduction = 7
    assert op(count(lambda: torch.allclose(a, b)), "aten.allclose.default").flops == 140


def test_bincount_integer_counts_and_float_weights() -> None:
    x = torch.tensor([1, 3, 3, 0, 7])
    plain = op(count(lambda: torch.bincount(x)), "aten.bincount.default")
    assert (plain.macs, plain.flops) == (0, 0)  # integer counting is not FLOPs
    weights = torch.tensor([0.5, 1.0, 2.0, 1.5, 1.0])
    weighted = op(count(lambda: torch.bincount(x, weights=weights)), "aten.bincount.default")
    assert weighted.flops == 5  # each float weight added to its bin
