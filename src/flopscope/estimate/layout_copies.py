"""Scratch memory a matrix-product kernel holds while it runs: the dense copies it makes of operands
BLAS cannot read in place (:func:`layout_copy_bytes`; the memory tracker's ``workspace``
category, :mod:`flopscope.estimate.memory`).
"""

from __future__ import annotations

from typing import Any

import torch

from flopscope.cost import OpCall

__all__ = ["layout_copy_bytes"]


def _blas_ready(t: torch.Tensor) -> bool:
    """Whether a matrix operand can be handed to BLAS as it is: row-major (unit column stride,
    row stride at least the number of columns) or column-major (the transpose). This is ATen's
    test in ``addmm_impl_cpu_`` (aten/src/ATen/native/LinearAlgebra.cpp), which otherwise runs
    ``clone(MemoryFormat::Contiguous)`` on the operand; cuBLAS's ``prepare_matrix_for_cublas``
    (aten/src/ATen/native/cuda/Blas.cpp) makes the same test and the same copy."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    return (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows))


_MATRIX_OPERANDS: dict[Any, tuple[int, ...]] = {}  # operator -> positions of its two matrices


def _matrix_operands() -> dict[Any, tuple[int, ...]]:
    if not _MATRIX_OPERANDS:
        aten = torch.ops.aten
        _MATRIX_OPERANDS.update({aten.mm.default: (0, 1), aten.addmm.default: (1, 2),
                                 aten._addmm_activation.default: (1, 2)})
    return _MATRIX_OPERANDS


def layout_copy_bytes(call: OpCall) -> int:
    """Bytes of the dense copies a matrix-product kernel makes of operands BLAS cannot read in
    place, held while the call runs and freed when it returns.

    ``mm`` and ``addmm`` (hence ``linear`` and ``matmul`` on 2-D and folded 3-D inputs) hand each
    operand to BLAS as a row- or column-major matrix; an operand with neither layout (an expanded
    tensor with stride 0, such as the gradient of ``out.sum()``; a slice with a step) is first
    copied to a contiguous matrix of the same shape and dtype. The backward of ``linear`` under
    a ``sum`` loss multiplies by that expanded gradient twice (input and weight gradients): one
    copy of the output's size each time. Other kernels' scratch is not modelled.

    Args:
        call: the operator call.

    Returns:
        The bytes copied (0 for other operators and for operands BLAS takes as they are).
    """
    positions = _matrix_operands().get(call.op)
    if positions is None:
        return 0
    total = 0
    for i in positions:
        t = call.args[i] if i < len(call.args) else None
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.numel() and not _blas_ready(t):
            total += t.numel() * t.element_size()
    return total
