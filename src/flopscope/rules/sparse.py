"""Sparse tensors: products count the stored non-zeros, conversions are free.

A sparse-dense product A[m,k] (nnz stored entries) @ B[k,n] multiplies every stored entry with a
row of B: nnz * n MACs (what the kernel does; the dense equivalent would be m * n * k). Bytes are
those of the stored values and indices (see ``flopscope.cost.tensor_bytes``).
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import rule


def _nnz(t: torch.Tensor) -> int:
    return int(t._nnz()) if t.layout is not torch.strided else t.numel()


@rule("aten::_sparse_mm", "aten::_sparse_mm_reduce_impl", "aten::_sparse_sparse_matmul")
def sparse_mm(call: OpCall) -> Cost:
    """Sparse A[m,k] @ B[k,n]: one MAC per (stored entry of A, column of B): nnz(A) * n."""
    a, b = call.args[0], call.args[1]
    macs = _nnz(a) * int(b.shape[-1])
    return call.cost(macs=macs)


@rule("aten::_sparse_addmm", "aten::_sparse_csr_addmm", "aten::addmm_sparse")
def sparse_addmm(call: OpCall) -> Cost:
    """beta * C + alpha * (sparse A[m,k] @ B[k,n]): nnz(A) * n MACs, plus 1 FLOP per output
    element for the add (scaling by alpha/beta folded in, as for dense addmm)."""
    a, b = call.args[1], call.args[2]
    macs = _nnz(a) * int(b.shape[-1])
    return call.cost(macs=macs, flops=2 * macs + call.out_numel())


@rule("aten::sparse_sampled_addmm")
def sampled_addmm(call: OpCall) -> Cost:
    """beta * S + alpha * (A[m,k] @ B[k,n]) sampled at S's stored entries: k MACs per stored
    entry of S, plus 1 add each."""
    s, a = call.args[0], call.args[1]
    nnz = _nnz(s)
    macs = nnz * int(a.shape[-1])
    return call.cost(macs=macs, flops=2 * macs + nnz)


@rule("aten::_to_sparse", "aten::to_sparse", "aten::_to_sparse_csr", "aten::_to_sparse_csc",
      "aten::_to_sparse_bsr", "aten::_to_sparse_bsc",
      "aten::_coalesce", "aten::coalesce", "aten::_sparse_coo_tensor_with_dims_and_tensors",
      "aten::sparse_resize_and_clear_", "aten::_nnz", "aten::_values", "aten::_indices",
      "aten::crow_indices", "aten::col_indices", "aten::ccol_indices", "aten::row_indices")
def sparse_layout(call: OpCall) -> Cost:
    """Converting between dense and sparse layouts, coalescing and reading a sparse tensor's
    parts: 0 FLOPs (comparisons and copies of indices), bytes in and out."""
    return call.cost()


@rule("aten::_sparse_mm_reduce_impl_backward")
def sparse_mm_reduce_backward(call: OpCall) -> Cost:
    """Gradient of ``torch.sparse.mm(A, B, reduce)`` (A sparse [m,k], B dense [k,n]): the grad of
    B is A^T @ grad_out, one MAC per (stored entry, column): nnz * n; the grad of A's values is
    grad_out @ B^T sampled at A's stored entries, n MACs per stored entry: nnz * n; each as
    ``output_mask`` asks. (For mean/amax/amin the per-row scaling or routing is bookkeeping
    next to these products and is not counted.)"""
    a, grad_out = call.args[0], call.args[1]
    mask = named_arg(call, "output_mask", [True, True])
    macs = _nnz(a) * int(grad_out.shape[-1]) * sum(bool(m) for m in mask)
    return call.cost(macs=macs)


@rule("aten::sparse_mask")
def sparse_mask(call: OpCall) -> Cost:
    """A dense (or sparse) tensor's values at a sparse mask's stored positions: a gather, 0 FLOPs;
    bytes of the inputs and the sparse output's values and indices."""
    return call.cost()
