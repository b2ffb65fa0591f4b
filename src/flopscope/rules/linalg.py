"""Dense linear algebra (``torch.linalg``): factorizations, solves, inverses, decompositions.

These kernels call LAPACK and have no PyTorch decomposition. They are costed with the standard
operation counts of the LAPACK routine each one runs, leading-order terms, in FLOPs (multiplies
plus adds, as LAPACK Working Note 41 and Golub & Van Loan count them), per matrix; batch
dimensions multiply. Conventions:

- The counts are FLOPs only (``macs = 0``): MACs are reserved for the matmul / convolution /
  attention products, and torch's FlopCounterMode does not count these kernels either.
- Factorizations (LU, Cholesky, QR, LDL^T) and triangular solves are exact to leading order for
  the algorithm LAPACK runs. The eigen and singular value decompositions are iterative: their
  counts are the *standard estimates* of Golub & Van Loan (Matrix Computations, 4th ed., Fig.
  8.6.1 for the SVD, Sec. 8.3 for the symmetric QR algorithm, Sec. 7.5.6 for the Francis QR
  algorithm), not what a given input takes.
- Complex matrices cost 4x the real count (one complex multiply-add = 4 real multiplies and 4 real
  adds).
- Fractions (2/3 n^3 ...) are rounded to the nearest integer per matrix. The helpers below work
  in thirds of a FLOP (every count is a multiple of 1/3), so that the same integer arithmetic
  runs on symbolic sizes (:mod:`flopscope.symbolic`): ``(2 t + 3) // 6`` rounds t/3 to the
  nearest integer (a third is never a tie). Branches on sizes (``min(m, n)``, m >= n) are guards
  of a symbolic count.
- Reading the status tensor (``_linalg_check_errors``) and unpacking factors (``lu_unpack``) are
  bookkeeping: 0 FLOPs.

References: LAPACK Working Note 41 (Installation Guide, operation counts), Table 'Floating point
operation counts for LAPACK drivers'; G. H. Golub and C. F. Van Loan, Matrix Computations.
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, per
from flopscope.rules.registry import rule

# complex matrices and transforms are counted in real operations by these rules themselves
COUNTS_REAL_NUMBERS = True


def _mat(t: torch.Tensor) -> tuple[Any, Any, Any]:
    """(batch, rows, columns) of a (batch of) matrices [..., m, n]."""
    shape = tuple(t.shape)
    return prod(shape[:-2]), shape[-2], shape[-1]


def _total(t: torch.Tensor, thirds: Any, batch: Any) -> Any:
    """A count given in thirds of a FLOP per matrix, rounded to the nearest integer (no ties:
    ``(2 t + 3) // 6``), times the batch, times 4 for complex matrices."""
    return (2 * thirds + 3) // 6 * batch * (4 if t.is_complex() else 1)


def lu_flops(m: Any, n: Any) -> Any:
    """Gaussian elimination with partial pivoting of an m x n matrix (getrf), k = min(m, n):
    2mnk - (m + n)k^2 + 2k^3/3 (square: 2n^3/3), in thirds of a FLOP."""
    k = min(m, n)
    return 3 * (2 * m * n * k - (m + n) * k * k) + 2 * k**3


def _geqrf(m: Any, n: Any) -> Any:
    """Householder QR of an m x n matrix (geqrf): 2mn^2 - 2n^3/3 for m >= n, else 2nm^2 - 2m^3/3
    (thirds)."""
    if m >= n:
        return 6 * m * n * n - 2 * n**3
    return 6 * n * m * m - 2 * m**3


def orgqr_flops(m: Any, q: Any, k: Any) -> Any:
    """Forming q columns of Q (m rows) from k Householder reflectors (orgqr):
    4mqk - 2(m + q)k^2 + 4k^3/3 (square: 4n^3/3), in thirds."""
    return 3 * (4 * m * q * k - 2 * (m + q) * k * k) + 4 * k**3


def ormqr_flops(m: Any, n: Any, k: Any, *, left: bool) -> Any:
    """Applying k reflectors to an m x n matrix (ormqr): 4mnk - 2nk^2 from the left,
    4mnk - 2mk^2 from the right, in thirds."""
    return 3 * (4 * m * n * k - 2 * (n if left else m) * k * k)


def svd_flops(m: Any, n: Any, *, compute_uv: bool, full_matrices: bool) -> Any:
    """Golub-Reinsch SVD of an m x n matrix (Golub & Van Loan Fig. 8.6.1), with m >= n (else
    transposed): singular values only 4mn^2 - 4n^3/3; with thin U (m x n) and V 14mn^2 + 8n^3;
    with full U (m x m) and V 4m^2 n + 8mn^2 + 9n^3; in thirds."""
    m, n = max(m, n), min(m, n)
    if not compute_uv:
        return 12 * m * n * n - 4 * n**3
    if full_matrices:
        return 3 * (4 * m * m * n + 8 * m * n * n + 9 * n**3)
    return 3 * (14 * m * n * n + 8 * n**3)


def eigh_flops(n: Any, *, compute_v: bool) -> Any:
    """Symmetric QR algorithm (Golub & Van Loan Sec. 8.3): eigenvalues only 4n^3/3 (the
    tridiagonal reduction), with eigenvectors 9n^3; in thirds."""
    return 27 * n**3 if compute_v else 4 * n**3


def _rhs(b: torch.Tensor, left: bool) -> Any:
    """Right-hand sides of a solve with B [..., n, k] (left) or [..., k, n] (right)."""
    return (b.shape[-1] if left else b.shape[-2]) if b.dim() >= 2 else 1


@rule("aten::linalg_lu_factor_ex", "aten::linalg_lu")
def lu(call: OpCall) -> Cost:
    """LU factorization with partial pivoting (getrf) of m x n, k = min(m, n):
    2mnk - (m + n)k^2 + 2k^3/3 FLOPs (square: 2n^3/3). ``linalg_lu`` also unpacks P, L, U
    (no arithmetic)."""
    a = call.args[0]
    batch, m, n = _mat(a)
    return call.cost(flops=_total(a, lu_flops(m, n), batch))


@rule("aten::linalg_cholesky_ex")
def cholesky(call: OpCall) -> Cost:
    """Cholesky factorization (potrf) of n x n: n^3/3 FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, n**3, batch))


@rule("aten::linalg_ldl_factor_ex")
def ldl_factor(call: OpCall) -> Cost:
    """LDL^T factorization with Bunch-Kaufman pivoting (sytrf) of n x n: n^3/3 FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, n**3, batch))


@rule("aten::cholesky_solve")
def cholesky_solve(call: OpCall) -> Cost:
    """Solve A X = B given the Cholesky factor of A (potrs), B n x k: two triangular solves,
    2 n^2 k FLOPs."""
    b, factor = call.args[0], call.args[1]
    batch = per(call.output.numel(), b.shape[-2] * b.shape[-1])
    n, k = factor.shape[-1], b.shape[-1]
    return call.cost(flops=_total(b, 3 * 2 * n * n * k, batch))


@rule("aten::cholesky_inverse")
def cholesky_inverse(call: OpCall) -> Cost:
    """Inverse of A from its Cholesky factor (potri: triangular inverse n^3/3 + the product
    L^-T L^-1, n^3/3): 2n^3/3 FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, 2 * n**3, batch))


@rule("aten::triangular_solve", "aten::linalg_solve_triangular")
def triangular_solve(call: OpCall) -> Cost:
    """Triangular solve (trsm) with an n x n triangle: n^2 FLOPs per right-hand side (n^2/2
    multiplies and n^2/2 adds; the n divides are absorbed); B has k right-hand sides."""
    if call.op._schema.name == "aten::triangular_solve":
        b, a, left = call.args[0], call.args[1], True
    else:
        a, b = call.args[0], call.args[1]
        left = bool(named_arg(call, "left", True))
    n = a.shape[-1]
    out = call.output
    batch = per(out.numel(), out.shape[-2] * out.shape[-1])
    return call.cost(flops=_total(b, 3 * n * n * _rhs(out, left), batch))


@rule("aten::_linalg_solve_ex")
def solve(call: OpCall) -> Cost:
    """Solve A X = B (gesv): LU of the n x n matrix A (2n^3/3) + two triangular solves per
    right-hand side (2n^2 each): 2n^3/3 + 2n^2 k FLOPs. A vector B has k = 1."""
    a, b = call.args[0], call.args[1]
    left = bool(named_arg(call, "left", True))
    batch, n, _ = _mat(a)
    k = _rhs(b, left) if b.dim() > 1 and b.dim() == a.dim() else 1
    # the output's batch is the broadcast of A's and B's, never smaller than A's
    solves = per(call.output.numel(), n * k)
    batch = max(batch, solves) if type(batch) is int and type(solves) is int else solves
    return call.cost(flops=_total(a, lu_flops(n, n) + 3 * 2 * n * n * k, batch))


@rule("aten::linalg_lu_solve")
def lu_solve(call: OpCall) -> Cost:
    """Solve from an LU factorization (getrs), B with k right-hand sides: 2n^2 k FLOPs."""
    lu_, b = call.args[0], call.args[2]
    n = lu_.shape[-1]
    left = bool(named_arg(call, "left", True))
    k = _rhs(b, left)
    batch = per(call.output.numel(), n * k)
    return call.cost(flops=_total(b, 3 * 2 * n * n * k, batch))


@rule("aten::linalg_ldl_solve")
def ldl_solve(call: OpCall) -> Cost:
    """Solve from an LDL^T factorization (sytrs), B n x k: two triangular solves (2n^2 k) and the
    block-diagonal solve (n k): 2n^2 k + n k FLOPs."""
    ld, b = call.args[0], call.args[2]
    n, k = ld.shape[-1], b.shape[-1]
    batch = per(call.output.numel(), n * k)
    return call.cost(flops=_total(b, 3 * (2 * n * n * k + n * k), batch))


@rule("aten::linalg_inv_ex")
def inverse(call: OpCall) -> Cost:
    """Matrix inverse as PyTorch computes it: LU of A (getrf, 2n^3/3) and a solve of A X = I
    with the n columns of the identity as right-hand sides (getrs: two triangular solves of n^2
    FLOPs per column, 2n^3): 8n^3/3 FLOPs per matrix.

    Source: ``linalg_inv_ex_out`` in PyTorch's aten/src/ATen/native/BatchLinearAlgebra.cpp fills
    the result with the identity and calls ``linalg_solve_ex_out(A, I)``; it does not run
    LAPACK's getri (LU + inversion from the factors, 2n^3). The 2n^3 figure used before
    under-counted what runs: the valgrind validation (docs/validation.md, float64) measured
    5,720,216 FLOPs for n = 128 (1.364x the 2n^3 count of 4,194,304) and 90,592 for n = 32
    (1.382x of 65,536); 8n^3/3 is 5,592,405 and 87,381 (measured / counted 1.023 and 1.037), the
    rest being lower-order terms (pivoting, the identity fill) leading-order counts leave out.
    ``torch.linalg.inv`` and ``torch.inverse`` reach this operator (they are composite)."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, lu_flops(n, n) + 3 * 2 * n**3, batch))


@rule("aten::_linalg_det")
def det(call: OpCall) -> Cost:
    """Determinant: LU (2n^3/3) + the product of the n diagonal entries (n): 2n^3/3 + n FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, lu_flops(n, n) + 3 * n, batch))


@rule("aten::_linalg_slogdet")
def slogdet(call: OpCall) -> Cost:
    """Sign and log |det|: LU (2n^3/3) + log |u_ii| and their sum (2n): 2n^3/3 + 2n FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, lu_flops(n, n) + 3 * 2 * n, batch))


@rule("aten::geqrf")
def geqrf(call: OpCall) -> Cost:
    """Householder QR (geqrf) of m x n: 2mn^2 - 2n^3/3 FLOPs for m >= n (2nm^2 - 2m^3/3 for
    m < n); Q stays as reflectors."""
    a = call.args[0]
    batch, m, n = _mat(a)
    return call.cost(flops=_total(a, _geqrf(m, n), batch))


@rule("aten::linalg_qr")
def qr(call: OpCall) -> Cost:
    """QR of m x n, k = min(m, n): geqrf (2mn^2 - 2n^3/3 for m >= n) + forming Q from the k
    reflectors (orgqr, 4mqk - 2(m + q)k^2 + 4k^3/3 with q = k columns for ``reduced``, q = m for
    ``complete``; nothing for ``r``)."""
    a = call.args[0]
    mode = str(named_arg(call, "mode", "reduced"))
    batch, m, n = _mat(a)
    k = min(m, n)
    flops = _geqrf(m, n)
    if mode != "r":
        flops += orgqr_flops(m, m if mode == "complete" else k, k)
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::linalg_householder_product")
def householder_product(call: OpCall) -> Cost:
    """The n first columns of Q = H_1 ... H_k from k reflectors of length m (orgqr):
    4mnk - 2(m + n)k^2 + 4k^3/3 FLOPs."""
    a, tau = call.args[0], call.args[1]
    batch, m, n = _mat(a)
    k = tau.shape[-1]
    return call.cost(flops=_total(a, orgqr_flops(m, n, k), batch))


@rule("aten::ormqr")
def ormqr(call: OpCall) -> Cost:
    """Multiply an m x n matrix C by Q (k reflectors) from geqrf (ormqr): 4mnk - 2nk^2 FLOPs from
    the left, 4mnk - 2mk^2 from the right."""
    tau, c = call.args[1], call.args[2]
    left = bool(named_arg(call, "left", True))
    batch, m, n = _mat(c)
    k = tau.shape[-1]
    return call.cost(flops=_total(c, ormqr_flops(m, n, k, left=left), batch))


@rule("aten::linalg_lstsq")
def lstsq(call: OpCall) -> Cost:
    """Least squares min |A X - B| with A m x n (m >= n) and k right-hand sides, by QR (the
    estimate for every driver): geqrf (2mn^2 - 2n^3/3) + Q^T B (ormqr, 4mkn - 2kn^2) + the
    triangular solve (n^2 k). For m < n the roles of m and n swap (a minimum-norm solution through
    the QR of A^T)."""
    a, b = call.args[0], call.args[1]
    batch, m, n = _mat(a)
    k = b.shape[-1] if b.dim() == a.dim() else 1
    big, small = max(m, n), min(m, n)
    flops = _geqrf(big, small) + ormqr_flops(big, k, small, left=True) + 3 * small * small * k
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::_linalg_svd")
def svd(call: OpCall) -> Cost:
    """SVD of m x n (m >= n, else transposed), the standard Golub-Reinsch estimates (Golub & Van
    Loan Fig. 8.6.1): singular values only 4mn^2 - 4n^3/3; thin U, V 14mn^2 + 8n^3; full U, V
    4m^2 n + 8mn^2 + 9n^3 FLOPs. An estimate: the iterative part depends on the input."""
    a = call.args[0]
    batch, m, n = _mat(a)
    flops = svd_flops(m, n, compute_uv=bool(named_arg(call, "compute_uv", True)),
                      full_matrices=bool(named_arg(call, "full_matrices", False)))
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::_linalg_eigh")
def eigh(call: OpCall) -> Cost:
    """Symmetric/Hermitian eigendecomposition of n x n, the standard estimates of the symmetric QR
    algorithm (Golub & Van Loan Sec. 8.3): eigenvalues only 4n^3/3 (tridiagonal reduction),
    with eigenvectors 9n^3 FLOPs. An estimate: the iterative part depends on the input."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    flops = eigh_flops(n, compute_v=bool(named_arg(call, "compute_v", True)))
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::linalg_eig")
def eig(call: OpCall) -> Cost:
    """General eigendecomposition of n x n (Hessenberg reduction + Francis QR, geev, always with
    eigenvectors here): the standard estimate 25n^3 FLOPs (Golub & Van Loan Sec. 7.5.6: 10n^3 for
    the eigenvalues alone, 25n^3 with the Schur vectors). An estimate: the iterations depend on
    the input."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, 3 * 25 * n**3, batch))


@rule("aten::linalg_pinv")
def pinv(call: OpCall) -> Cost:
    """Pseudo-inverse of m x n (k = min(m, n)) as PyTorch computes it: thin SVD (14 M k^2 + 8k^3,
    M = max(m, n); ``hermitian``: eigh with vectors, 9n^3), the reciprocal of each singular value
    (k), and V diag(1/s) U^H (m n k MACs counted as 2 m n k FLOPs, with the k n scaling)."""
    a = call.args[0]
    batch, m, n = _mat(a)
    k = min(m, n)
    if bool(named_arg(call, "hermitian", False)):
        flops = eigh_flops(n, compute_v=True)
    else:
        flops = svd_flops(m, n, compute_uv=True, full_matrices=False)
    flops += 3 * (k + k * n + 2 * m * n * k)
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::linalg_polar")
def polar(call: OpCall) -> Cost:
    """Polar decomposition A = U H of n x n through the thin SVD A = W S V^H (14n^3 + 8n^3), then
    U = W V^H (2n^3) and H = V S V^H (scaling n^2, product 2n^3): 26n^3 + n^2 FLOPs."""
    a = call.args[0]
    batch, m, n = _mat(a)
    k = min(m, n)
    flops = svd_flops(m, n, compute_uv=True, full_matrices=False) + 3 * 2 * m * n * k
    flops += 3 * (k * n + 2 * n * n * k)
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::linalg_matrix_sqrth")
def matrix_sqrth(call: OpCall) -> Cost:
    """Square root of a symmetric positive semi-definite n x n matrix through its eigendecomposition
    A = V L V^T (9n^3), sqrt of the n eigenvalues (n), V sqrt(L) V^T (scaling n^2, product 2n^3):
    11n^3 + n^2 + n FLOPs."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    flops = eigh_flops(n, compute_v=True) + 3 * (n + n * n + 2 * n**3)
    return call.cost(flops=_total(a, flops, batch))


@rule("aten::linalg_matrix_exp")
def matrix_exp(call: OpCall) -> Cost:
    """Matrix exponential of n x n by a degree-18 Taylor polynomial evaluated with 5 matrix
    products (Bader, Blanes and Casas 2019, the highest order PyTorch uses) and no squaring:
    10n^3 FLOPs. An estimate: the kernel picks a lower degree for small norms and adds
    value-dependent squarings (2n^3 each) for large ones; neither is known from shapes."""
    a = call.args[0]
    batch, n, _ = _mat(a)
    return call.cost(flops=_total(a, 3 * 5 * 2 * n**3, batch))


@rule("aten::_linalg_check_errors", "aten::lu_unpack")
def linalg_bookkeeping(call: OpCall) -> Cost:
    """Reading the LAPACK status (``_linalg_check_errors``) and unpacking P, L, U from a packed LU
    (``lu_unpack``): no arithmetic, 0 FLOPs; bytes are counted."""
    return call.cost()
