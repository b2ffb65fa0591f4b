"""Sparse tensors: products by stored non-zeros, gathers free (rules/sparse.py)."""

from __future__ import annotations

import torch

from rules._util import count, op


def _half_zero(rows: int, cols: int) -> torch.Tensor:
    """A dense matrix with about half its entries zero (to be made sparse)."""
    torch.manual_seed(0)
    return torch.randn(rows, cols).relu()


def test_sparse_mm_reduce_backward_counts_stored_entries() -> None:
    dense = _half_zero(5, 4)
    nnz = int((dense != 0).sum())
    a = dense.to_sparse_csr().requires_grad_(True)
    b = torch.randn(4, 3, requires_grad=True)
    report = count(lambda: torch.sparse.mm(a, b, "sum"), backward=True)
    # forward: nnz * 3 MACs; backward: grad B = A^T @ grad (nnz * 3) and grad A's values =
    # (grad @ B^T) at A's stored entries (nnz * 3)
    assert op(report, "aten._sparse_mm_reduce_impl.default").macs == nnz * 3
    assert op(report, "aten._sparse_mm_reduce_impl_backward.default", "backward").macs == \
        2 * nnz * 3
    assert report.uncounted == {}


def test_sparse_mask_is_a_gather() -> None:
    x, mask = torch.randn(3, 4), _half_zero(3, 4).to_sparse()
    cost = op(count(lambda: x.sparse_mask(mask)), "aten.sparse_mask.default")
    assert (cost.macs, cost.flops) == (0, 0)
    assert cost.bytes_read > 0
