"""Grouped and segmented operators: grouped matrix products (``_grouped_mm``, the mixture-of-experts
kernel), segment reductions (``segment_reduce``) and the three-operand product behind
``nn.Bilinear`` (``_trilinear``). None has a decomposition.

Grouped products are MACs, one per term of each group's sum of products. Their group boundaries
(``offs``, cumulative ends) are *values*: when the offsets tensor is real they are read and only
the rows (columns, or reduced extent) the groups cover are counted; on fake or meta tensors the
values do not exist, and the count assumes the groups cover the whole dimension (their sizes then
sum to the tensor's size, so the sum over groups of m_g * k * n is M * k * n). That assumption is
exact whenever the last offset equals the dimension, which is how mixture-of-experts layers
call the kernel. Sizes are used as they are (no ``int()``): symbolic sizes give formulas.

A group without rows reads none of its weights: a mixture of experts' decode step at a small
batch runs only the experts its tokens chose, and the kernel loads only those experts' weights
(:func:`groups_with_rows`). With real offsets the empty groups are counted; on fake or meta
tensors the rows are assumed spread over the groups as evenly as they go (balanced routing, as
everywhere shape-only), so ``min(groups, rows)`` groups are read.
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import broadcast_size, named_arg, tensor_values
from flopscope.rules.registry import rule


def group_sizes(offs: Any, size: int) -> list[int] | None:
    """The sizes of the groups ending at ``offs`` within a dimension of ``size``
    (offs[g] - offs[g-1], clamped to the dimension), or ``None`` when the offsets cannot be
    read (fake or meta tensors, or none)."""
    ends = tensor_values(offs) if offs is not None else None
    if ends is None:
        return None
    sizes, start = [], 0
    for end in ends:
        sizes.append(max(0, min(end, size) - start))
        start = max(start, min(end, size))
    return sizes


def covered(offs: Any, size: int) -> int:
    """Elements of a dimension of ``size`` covered by groups ending at ``offs``: the sum of the
    group sizes when the offsets are readable, else ``size``."""
    sizes = group_sizes(offs, size)
    return size if sizes is None else sum(sizes)


def groups_with_rows(offs: Any, groups: Any, rows: Any) -> Any:
    """The groups of a 2d x 3d grouped product that get at least one of the ``rows`` (those whose
    weights the kernel reads): counted from the offsets when they are readable, else
    ``min(groups, rows)`` (the rows spread evenly: balanced routing)."""
    sizes = group_sizes(offs, rows)
    if sizes is None:
        return torch.sym_min(groups, rows)
    return sum(1 for n in sizes[:groups] if n > 0)


def grouped_mm_macs(a: torch.Tensor, b: torch.Tensor, offs: Any) -> tuple[int, int]:
    """(MACs, output elements computed) of a grouped product of ``a`` and ``b``.

    2d x 3d (a [M, K], b [G, K, N], groups along M): sum_g m_g K N; 3d x 2d (a [G, M, K],
    b [K, N], groups along N): sum_g M K n_g; 2d x 2d (a [M, K], b [K, N], groups along K, output
    [G, M, N]): sum_g M k_g N; 3d x 3d (batched, no offsets): G M K N.
    """
    if a.dim() == 2 and b.dim() == 3:
        m = covered(offs, a.shape[0])
        k, n = a.shape[1], b.shape[2]
        return m * k * n, m * n
    if a.dim() == 3 and b.dim() == 2:
        m, k = a.shape[1], a.shape[2]
        n = covered(offs, b.shape[1])
        return m * k * n, m * n
    if a.dim() == 2 and b.dim() == 2:
        m, n = a.shape[0], b.shape[1]
        k = covered(offs, a.shape[1])
        groups = offs.shape[0] if offs is not None else 1
        return m * k * n, groups * m * n
    g, m, k = a.shape
    n = b.shape[-1]
    return g * m * k * n, g * m * n


@rule("aten::_grouped_mm", "aten::_scaled_grouped_mm")
def grouped_mm(call: OpCall) -> Cost:
    """Grouped GEMM (mixture of experts): the sum over groups of m_g * k * n MACs (2d x 3d, groups
    of rows; 3d x 2d and 2d x 2d likewise along N or K; 3d x 3d batched: G*M*K*N); + one add per
    computed output element with a bias. Offsets are read when real; on fake/meta tensors the
    groups are assumed to cover the dimension (sum_g m_g = M). fp8 scaling (``_scaled_grouped_mm``)
    is not counted, as for ``_scaled_mm``. Bytes: the default traffic less the weights of the
    groups without rows (2d x 3d: :func:`groups_with_rows`)."""
    a, b = call.args[0], call.args[1]
    offs = named_arg(call, "offs")
    macs, outputs = grouped_mm_macs(a, b, offs)
    bias = outputs if named_arg(call, "bias") is not None else 0
    cost = call.cost(macs=macs, flops=2 * macs + bias)
    if a.dim() != 2 or b.dim() != 3 or call.is_view:
        return cost
    # the weights of the groups without rows are not read (the module's docstring)
    groups = b.shape[0]
    unread = (groups - groups_with_rows(offs, groups, a.shape[0])) * (b.numel() // groups)
    return Cost(cost.macs, cost.flops, cost.bytes_read - unread * b.element_size(),
                cost.bytes_written)


@rule("aten::segment_reduce")
def segment_reduce(call: OpCall) -> Cost:
    """Reduce segments of ``data`` along ``axis`` (sum, prod, max, min, mean): 1 FLOP per data
    element, as every reduction; ``mean`` adds one divide per output element."""
    data = call.args[0]
    reduce = str(call.args[1])
    extra = call.out_numel() if reduce == "mean" else 0
    return call.cost(flops=data.numel() + extra)


@rule("aten::_segment_reduce_backward")
def segment_reduce_backward(call: OpCall) -> Cost:
    """Gradient of a segment reduction, per data element: sum 0 (a broadcast copy), mean 1 (divide),
    max/min 2 (compare with the output, select), prod 2 (output / x, times grad)."""
    data = call.args[2]
    per = {"sum": 0, "mean": 1}.get(str(call.args[3]), 2)
    return call.cost(flops=per * data.numel())


def _expanded(shape: tuple[int, ...], expand: list[int]) -> list[int]:
    dims = list(shape)
    for d in sorted(expand):
        dims.insert(d, 1)
    return dims


@rule("aten::_trilinear")
def trilinear(call: OpCall) -> Cost:
    """out = sum over ``sumdim`` of i1 * i2 * i3 (broadcast after unsqueezing ``expand1..3``); for
    ``nn.Bilinear`` y[n,o] = sum_ij x1[n,i] W[o,i,j] x2[n,j]. Each term is two multiplies and an
    add: T MACs + T multiplies, T = the product of the sizes of every dimension (output and
    summed): for ``nn.Bilinear`` T = N*out*in1*in2, 3T FLOPs. That is what the kernel does (the
    elementwise i1 * i2 per output feature, then a product with i3)."""
    i1, i2, i3 = call.args[0], call.args[1], call.args[2]
    shapes = [_expanded(tuple(t.shape), list(e))
              for t, e in ((i1, call.args[3]), (i2, call.args[4]), (i3, call.args[5]))]
    terms = prod(broadcast_size([s[d] for s in shapes]) for d in range(len(shapes[0])))
    return call.cost(macs=terms, flops=3 * terms)
