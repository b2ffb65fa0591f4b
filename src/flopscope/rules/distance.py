"""Pairwise distances: ``torch.cdist`` (``_cdist_forward``) and ``F.pdist`` (``_pdist_forward``), with
their gradients. No decomposition exists for these kernels.

Direct evaluation of the p-norm distance between two M-vectors: per coordinate a subtract, the
|d|^p term (p = 2: a square; p = 1: an absolute value; p = inf: absolute value and max; p = 0: a
non-zero test) and the accumulation = 3 FLOPs; then one root per pair (p not in {0, 1, inf}).
These are FLOPs, not MACs (a difference is not a product).

``cdist`` with p = 2 takes the matrix-product path when asked (``compute_mode=
"use_mm_for_euclid_dist"``) or by default when either set has more than 25 rows: |x|^2 + |y|^2 -
2 x.y, computed as one product of the [P, M+2] and [M+2, R] augmented matrices (P*R*(M+2) MACs),
the row norms (square + add: 2 per element of x1 and x2), the -2 scaling (1 per element of x1), a
clamp and a square root per pair (2). That is what the kernel runs.

Sizes are used as they are (no ``int()``), so symbolic sizes give formulas; the kernel's choice
of path (more than 25 rows) is a branch on a size, recorded as a guard of a symbolic count.
"""

from __future__ import annotations

from math import inf, prod

from flopscope.cost import Cost, OpCall
from flopscope.rules.registry import rule


def _root(p: float) -> int:
    return 0 if p in (0.0, 1.0, inf) else 1


def _uses_mm(p: float, mode: int | None, rows1: int, rows2: int) -> bool:
    """The kernel's choice: p = 2 and mode 1, or mode 0/None with more than 25 rows on a side."""
    return p == 2.0 and (mode == 1 or (mode in (None, 0) and (rows1 > 25 or rows2 > 25)))


@rule("aten::_cdist_forward")
def cdist(call: OpCall) -> Cost:
    """cdist of x1 [B, P, M] and x2 [B, R, M]: directly, 3 FLOPs per (pair, coordinate) + 1 root per
    pair (p not 0/1/inf): B*P*R*(3M + root); on the matrix-product path (p = 2, > 25 rows or
    ``use_mm``): B*P*R*(M+2) MACs + B*(3 P M + 2 R M) (norms, scaling) + 2 B*P*R (clamp, sqrt)."""
    x1, x2, p = call.args[0], call.args[1], float(call.args[2])
    mode = call.args[3] if len(call.args) > 3 else call.kwargs.get("compute_mode")
    rows1, m = x1.shape[-2], x1.shape[-1]
    rows2 = x2.shape[-2]
    batch = prod(call.output.shape[:-2])
    pairs = batch * rows1 * rows2
    if _uses_mm(p, mode, rows1, rows2):
        macs = pairs * (m + 2)
        extra = batch * (3 * rows1 * m + 2 * rows2 * m) + 2 * pairs
        return call.cost(macs=macs, flops=2 * macs + extra)
    return call.cost(flops=pairs * (3 * m + _root(p)))


@rule("aten::_pdist_forward")
def pdist(call: OpCall) -> Cost:
    """pdist of x [N, M]: N(N-1)/2 pairs, 3 FLOPs per (pair, coordinate) + 1 root per pair (p not
    0/1/inf)."""
    x, p = call.args[0], float(call.args[1]) if len(call.args) > 1 else 2.0
    n, m = x.shape[0], x.shape[1]
    pairs = n * (n - 1) // 2
    return call.cost(flops=pairs * (3 * m + _root(p)))


def _grad_per_coordinate(p: float) -> int:
    """d dist / d x_i times grad, accumulated into x1 and x2: p = 1: sign(d) * g, two adds (3);
    p = 2: d * (g / dist) (subtract, multiply, two adds: 4, the divide is per pair); otherwise
    d * |d|^(p-2) * g / dist^(p-1) (subtract, abs, pow, two multiplies, two adds: 7)."""
    if p == 1.0:
        return 3
    if p == 2.0:
        return 4
    return 7


@rule("aten::_cdist_backward")
def cdist_backward(call: OpCall) -> Cost:
    """Gradient of cdist (x1 [B, P, M], x2 [B, R, M]): per (pair, coordinate) 3 (p = 1), 4 (p = 2)
    or 7 (other p) FLOPs (difference, derivative of |d|^p, times grad, accumulated), plus one
    divide per pair for p not 1 (grad / dist^(p-1))."""
    x1, x2, p = call.args[1], call.args[2], float(call.args[3])
    rows1, m = x1.shape[-2], x1.shape[-1]
    batch = prod(x1.shape[:-2])
    pairs = batch * rows1 * x2.shape[-2]
    return call.cost(flops=pairs * (_grad_per_coordinate(p) * m + (0 if p == 1.0 else 1)))


@rule("aten::_pdist_backward")
def pdist_backward(call: OpCall) -> Cost:
    """Gradient of pdist (x [N, M]): as ``_cdist_backward`` over the N(N-1)/2 pairs."""
    x, p = call.args[1], float(call.args[2])
    n, m = x.shape[0], x.shape[1]
    pairs = n * (n - 1) // 2
    return call.cost(flops=pairs * (_grad_per_coordinate(p) * m + (0 if p == 1.0 else 1)))
