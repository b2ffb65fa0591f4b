"""The decomposition fallback: how an operator with no rule is split into operators that have one.

An operator without a rule is not given up on. It is run as its decomposition instead, and the
pieces are counted (recursively: a piece with no rule is decomposed in turn):

1. its ``CompositeImplicitAutograd`` kernel (``OpOverload.decompose``), the decomposition PyTorch
   itself uses under autograd -- this is what makes ``torch.inference_mode()`` count like
   ``torch.no_grad()``: there ``aten.conv2d``, ``aten.matmul``, ``aten.layer_norm`` reach the
   dispatcher undecomposed;
2. else an entry of PyTorch's decomposition table (``torch._decomp.decomposition_table``), for
   functional operators only (no argument is written in place);
3. a higher-order operator (``flex_attention``, ``cond``, ``while_loop``, ``scan``, ...) runs its
   eager (dense) implementation, so its body is counted as it runs: a ``cond`` counts the branch
   taken, a ``while_loop`` every iteration. Where that needs values fake tensors do not have (a
   ``cond`` predicate in a shape-only count), the operator is listed as uncounted.

A few composite operators are never decomposed: their kernels call a library directly (FBGEMM's
legacy linear layers), so their pieces would be an allocation and nothing else (``_OPAQUE``).

A direct rule wins over a table decomposition, so fused kernels keep their own cost. A
``CompositeImplicitAutograd`` operator without a backend kernel has no kernel of its own -- its
decomposition *is* what runs -- so a default rule on one is used only where its decomposition cannot
run (a user's rule for it still wins). Only an operator that has neither rule nor decomposition is reported in
``Report.uncounted``. The pieces' MACs and FLOPs are
reported under the original operator (its record is marked ``decomposed``); its bytes are the
original operator's own inputs and outputs, not the intermediate traffic of the pieces (a fused
kernel would not write them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["decomposition", "is_composite", "runs_decomposed"]

_KERNEL_KEYS = ("CPU", "CUDA", "Meta", "XPU", "MPS", "CompositeExplicitAutograd",
                "CompositeExplicitAutogradNonFunctional")
# Metadata queries: never decomposed (they carry no arithmetic and some subclasses rely on them).
_NEVER = frozenset({
    "aten::sym_is_contiguous", "aten::is_contiguous", "aten::is_strides_like_format",
    "aten::is_non_overlapping_and_dense", "aten::size", "aten::sym_size", "aten::stride",
    "aten::sym_stride", "aten::storage_offset", "aten::sym_storage_offset", "aten::numel",
    "aten::sym_numel", "aten::dim", "prim::layout", "prim::device",
})

# Composite operators whose kernel calls a library directly instead of other operators (FBGEMM's
# legacy linear layers and weight packing): run as their "decomposition", the dispatcher would
# see only the output's allocation, a silent zero. They are never decomposed, so their rules
# (rules/quantized.py) cost them wherever they reach the counter as themselves.
_OPAQUE = frozenset({
    "aten::fbgemm_linear_int8_weight_fp32_activation", "aten::fbgemm_linear_int8_weight",
    "aten::fbgemm_linear_fp16_weight_fp32_activation", "aten::fbgemm_linear_fp16_weight",
    "aten::fbgemm_linear_quantize_weight", "aten::fbgemm_pack_quantized_matrix",
    "aten::fbgemm_pack_gemm_matrix_fp16",
})
_NOT_DECOMPOSED = _NEVER | _OPAQUE


def _cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any],
          operands: Any) -> Any:
    """``cond``: the branch taken (its eager kernel refuses to run under a dispatch mode)."""
    return (true_fn if bool(pred) else false_fn)(*operands)


def _while_loop(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: Any,
                additional: Any) -> Any:
    """``while_loop``: every iteration, as it runs."""
    carried = tuple(carried)
    while bool(cond_fn(*carried, *additional)):
        carried = tuple(body_fn(*carried, *additional))
    return carried


def _invoke_subgraph(subgraph: Callable[..., Any], identifier: Any, *operands: Any) -> Any:
    """``invoke_subgraph``: the subgraph, called."""
    return subgraph(*operands)


# higher-order operator -> its body, run as it would run eagerly (used where the operator's own
# eager kernel cannot run under a dispatch mode)
_BODIES: dict[str, Callable[..., Any]] = {
    "cond": _cond,
    "while_loop": _while_loop,
    "invoke_subgraph": _invoke_subgraph,
}


def _table() -> dict[Any, Callable[..., Any]]:
    from torch._decomp import decomposition_table

    return decomposition_table


def _functional(op: Any) -> bool:
    schema = op._schema
    return not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def is_composite(op: Any) -> bool:
    """Whether ``op`` has a ``CompositeImplicitAutograd`` kernel (a decomposition of its own)."""
    return isinstance(op, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), "CompositeImplicitAutograd")


def runs_decomposed(op: Any) -> bool:
    """Whether ``op``'s decomposition is what runs: a composite operator with no kernel of its own
    for any backend (``aten.conv2d``, ``aten.linear``; not ``aten.silu_backward``, which has a
    fused CPU kernel beside its decomposition)."""
    return is_composite(op) and op._schema.name not in _OPAQUE and not any(
        torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key) for key in _KERNEL_KEYS)


def decomposition(op: Any) -> Callable[..., Any] | None:
    """The function that runs ``op`` as operators of its decomposition, or ``None``.

    Args:
        op: an ``OpOverload``.

    Returns:
        ``op.decompose`` where ``op`` has a ``CompositeImplicitAutograd`` kernel, else PyTorch's
        table decomposition for a functional ``op``, else ``None``.
    """
    found: Callable[..., Any] | None = None
    if isinstance(op, torch._ops.HigherOrderOperator):
        found = _BODIES.get(op.name()) or op.py_kernels.get(
            torch._C.DispatchKey.CompositeExplicitAutograd)
    elif isinstance(op, torch._ops.OpOverload) and op._schema.name not in _NOT_DECOMPOSED:
        if is_composite(op):
            found = op.decompose
        elif _functional(op):
            found = _table().get(op)
    return found
