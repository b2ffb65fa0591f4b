"""Matrix products: one MAC per term of each sum of products.

``linear``, ``matmul`` and ``einsum`` are composite operators: the dispatcher decomposes them into the
operators below (``t`` + ``addmm``, ``bmm`` ...), which is what flopscope sees and costs.
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, numel
from flopscope.rules.registry import rule


def _bias_flops(call: OpCall, out_elements: int) -> int:
    """One add per output element for ``beta * bias + alpha * product`` (two more for beta/alpha != 1)."""
    extra = 1
    if named_arg(call, "beta", 1) != 1:
        extra += 1
    if named_arg(call, "alpha", 1) != 1:
        extra += 1
    return extra * out_elements


def _product(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """(MACs, m, n) of A[m,k] @ B[k,n]; a sparse factor multiplies only its stored entries:
    nnz(A) * n (or nnz(B) * m)."""
    m, k = a.shape
    n = b.shape[-1]
    if a.layout is not torch.strided:
        return int(a._nnz()) * n, m, n
    if b.layout is not torch.strided:
        return int(b._nnz()) * m, m, n
    return m * n * k, m, n


@rule("aten::mm", "aten::_int_mm", "aten::_scaled_mm", "aten::_scaled_mm_v2")
def mm(call: OpCall) -> Cost:
    """C[m,n] = A[m,k] @ B[k,n]: one MAC per (m, n, k); FLOPs = 2 * MACs. A sparse factor:
    one MAC per (stored entry, column of the other factor)."""
    macs, _, _ = _product(call.args[0], call.args[1])
    return call.cost(macs=macs)


@rule("aten::addmm", "aten::addmm_")
def addmm(call: OpCall) -> Cost:
    """out[m,n] = beta*bias + alpha*(A[m,k] @ B[k,n]): m*n*k MACs; FLOPs = 2*MACs + m*n bias adds
    (+ m*n more per scale factor that is not 1). A sparse factor: see ``mm``. ``addmm_``
    accumulates into its first argument in place, the same arithmetic."""
    macs, m, n = _product(call.args[1], call.args[2])
    return call.cost(macs=macs, flops=2 * macs + _bias_flops(call, m * n))


@rule("aten::_addmm_activation")
def addmm_activation(call: OpCall) -> Cost:
    """act(bias + A[m,k] @ B[k,n]): m*n*k MACs; FLOPs = 2*MACs + m*n (bias) + m*n*act, where act is
    1 for relu and 5 for erf-GELU (9 for tanh-GELU), as in the activation table."""
    a, b = call.args[1], call.args[2]
    m, k = a.shape
    n = b.shape[-1]
    macs = m * n * k
    if named_arg(call, "use_gelu", False):
        act = 9 if named_arg(call, "approximate", "none") == "tanh" else 5  # erf form: see gelu
    else:
        act = 1
    return call.cost(macs=macs, flops=2 * macs + _bias_flops(call, m * n) + act * m * n)


@rule("aten::bmm")
def bmm(call: OpCall) -> Cost:
    """C[b,m,n] = A[b,m,k] @ B[b,k,n]: one MAC per (b, m, n, k)."""
    a, b = call.args[0], call.args[1]
    bs, m, k = a.shape
    n = b.shape[-1]
    return call.cost(macs=bs * m * n * k)


@rule("aten::baddbmm")
def baddbmm(call: OpCall) -> Cost:
    """out[b,m,n] = beta*self + alpha*(A[b,m,k] @ B[b,k,n]): b*m*n*k MACs plus b*m*n adds
    (+ b*m*n per scale factor that is not 1)."""
    a, b = call.args[1], call.args[2]
    bs, m, k = a.shape
    n = b.shape[-1]
    macs = bs * m * n * k
    return call.cost(macs=macs, flops=2 * macs + _bias_flops(call, bs * m * n))


@rule("aten::addbmm")
def addbmm(call: OpCall) -> Cost:
    """out[m,n] = beta*self + alpha*sum_b A[b,m,k] @ B[b,k,n]: b*m*n*k MACs plus m*n adds."""
    a, b = call.args[1], call.args[2]
    bs, m, k = a.shape
    n = b.shape[-1]
    macs = bs * m * n * k
    return call.cost(macs=macs, flops=2 * macs + _bias_flops(call, m * n))


@rule("aten::mv")
def mv(call: OpCall) -> Cost:
    """y[m] = A[m,n] @ x[n]: one MAC per (m, n)."""
    m, n = call.args[0].shape
    return call.cost(macs=m * n)


@rule("aten::addmv")
def addmv(call: OpCall) -> Cost:
    """y[m] = beta*self + alpha*(A[m,n] @ x[n]): m*n MACs plus m adds."""
    m, n = call.args[1].shape
    return call.cost(macs=m * n, flops=2 * m * n + _bias_flops(call, m))


@rule("aten::dot", "aten::vdot")
def dot(call: OpCall) -> Cost:
    """s = sum_i x[i] * y[i]: one MAC per element."""
    return call.cost(macs=call.args[0].numel())


@rule("aten::linear")
def linear(call: OpCall) -> Cost:
    """y[..., n] = x[..., k] @ W[n, k]^T (+ b[n]): one MAC per (output element, k); FLOPs = 2*MACs
    plus one add per output element with a bias. (Seen only where ``linear`` is not decomposed.)"""
    x, w = call.args[0], call.args[1]
    bias = named_arg(call, "bias")
    out = numel(x.shape[:-1]) * w.shape[0]
    macs = out * w.shape[-1]
    return call.cost(macs=macs, flops=2 * macs + (out if bias is not None else 0))


def _matmul_macs(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """MACs of torch.matmul on shapes ``a`` and ``b`` (vectors, matrices, broadcast batches)."""
    if len(a) == 1 and len(b) == 1:
        return a[0]
    if len(b) == 1:  # (..., m, k) @ (k,)
        return numel(a)
    if len(a) == 1:  # (k,) @ (..., k, n)
        return numel(b)
    batch = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return numel(tuple(batch)) * a[-2] * a[-1] * b[-1]


def _product_macs(a: torch.Tensor, b: torch.Tensor) -> int:
    """MACs of ``torch.matmul(a, b)``; on nested tensors the sum over their components."""
    if a.is_nested or b.is_nested:
        parts_a = a.unbind() if a.is_nested else [a] * b.size(0)
        parts_b = b.unbind() if b.is_nested else [b] * a.size(0)
        return sum(_matmul_macs(tuple(x.shape), tuple(y.shape))
                   for x, y in zip(parts_a, parts_b, strict=True))
    return _matmul_macs(tuple(a.shape), tuple(b.shape))


@rule("aten::matmul")
def matmul(call: OpCall) -> Cost:
    """torch.matmul: one MAC per (batch, m, n, k) after broadcasting; on nested tensors the sum
    over their components. (Seen only where ``matmul`` is not decomposed: on nested tensors, whose
    CPU attention fallback multiplies strided nested tensors.)"""
    return call.cost(macs=_product_macs(call.args[0], call.args[1]))


@rule("aten::matmul_backward")
def matmul_backward(call: OpCall) -> Cost:
    """The two gradients of ``C = A @ B`` (nested tensors' backward of ``matmul``, which their
    CPU attention fallback runs): ``dA = dC @ B^T`` and ``dB = A^T @ dC``, each as many MACs as
    the forward product (the same (batch, m, n, k) terms), counted for each gradient that
    ``mask`` asks for; FLOPs = 2 * MACs. On nested tensors: the sum over their components."""
    mask = named_arg(call, "mask", (True, True))
    return call.cost(macs=sum(map(bool, mask)) * _product_macs(call.args[1], call.args[2]))
