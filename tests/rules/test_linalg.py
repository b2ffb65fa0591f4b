"""Dense linear algebra: LAPACK operation counts (leading order), batch dimensions multiply."""

from __future__ import annotations

import pytest
import torch

from rules._util import count, op


def _spd(n: int, *batch: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a @ a.mH + n * torch.eye(n, dtype=dtype)


def test_lu_factor_batched() -> None:
    a = torch.randn(2, 6, 6)
    cost = op(count(lambda: torch.linalg.lu_factor(a)), "aten.linalg_lu_factor_ex.default")
    assert cost.flops == 2 * 144  # 2/3 * 6^3 = 144 per matrix
    assert cost.macs == 0  # FLOPs only: MACs are for matmul/conv/attention products


def test_lu_of_a_rectangular_matrix() -> None:
    a = torch.randn(8, 6)
    # k = 6: 2*8*6*6 - (8 + 6)*36 + 2*216/3 = 576 - 504 + 144 = 216
    assert op(count(lambda: torch.linalg.lu_factor(a)), "aten.linalg_lu_factor_ex.default").flops == 216


def test_cholesky_real_and_complex() -> None:
    name = "aten.linalg_cholesky_ex.default"
    assert op(count(lambda: torch.linalg.cholesky(_spd(6))), name).flops == 72  # 6^3 / 3
    spd = _spd(6, dtype=torch.complex64)
    assert op(count(lambda: torch.linalg.cholesky(spd)), name).flops == 4 * 72  # complex: 4x


def test_solve_is_lu_plus_two_triangular_solves_per_rhs() -> None:
    a, b = torch.randn(6, 6), torch.randn(6, 2)
    # LU 144 + 2 * 6^2 * 2 right-hand sides = 144 + 144 = 288
    assert op(count(lambda: torch.linalg.solve(a, b)), "aten._linalg_solve_ex.default").flops == 288


def test_inverse_and_determinant() -> None:
    a = torch.randn(3, 6, 6)
    # LU 2/3 * 216 = 144 + a solve against the 6 columns of I, 2 * 6^2 per column = 432:
    # 576 = 8/3 * 6^3 per matrix (PyTorch's linalg_inv_ex_out is linalg_solve_ex_out(A, I))
    for fn in (torch.linalg.inv, torch.inverse, lambda x: torch.linalg.inv_ex(x).inverse):
        assert op(count(lambda fn=fn: fn(a)), "aten.linalg_inv_ex.default").flops == 3 * 576
    assert op(count(lambda: torch.linalg.det(a)), "aten._linalg_det.default").flops == 3 * (144 + 6)
    slog = op(count(lambda: torch.linalg.slogdet(a)), "aten._linalg_slogdet.default")
    assert slog.flops == 3 * (144 + 12)  # LU + log|u_ii| and their sum


def test_triangular_solve_is_n_squared_per_rhs() -> None:
    a, b = torch.randn(6, 6).triu() + 6 * torch.eye(6), torch.randn(6, 3)
    cost = op(count(lambda: torch.linalg.solve_triangular(a, b, upper=True)),
              "aten.linalg_solve_triangular.default")
    assert cost.flops == 36 * 3  # 6^2 per right-hand side
    right = op(count(lambda: torch.linalg.solve_triangular(a, b.T, upper=True, left=False)),
               "aten.linalg_solve_triangular.default")
    assert right.flops == 36 * 3  # X A = B with B 3 x 6: 3 right-hand sides


def test_cholesky_solve_and_inverse() -> None:
    factor, b = torch.linalg.cholesky(_spd(6)), torch.randn(6, 4)
    assert op(count(lambda: torch.cholesky_solve(b, factor)), "aten.cholesky_solve.default").flops == 2 * 36 * 4
    assert op(count(lambda: torch.cholesky_inverse(factor)), "aten.cholesky_inverse.default").flops == 144


@pytest.mark.parametrize(("mode", "flops"), [
    ("r", 432),  # geqrf of 8 x 6: 2*8*36 - 2*216/3 = 576 - 144
    ("reduced", 432 + 432),  # + orgqr(8, 6, 6): 4*8*6*6 - 2*14*36 + 4*216/3 = 1152 - 1008 + 288
    ("complete", 432 + 672),  # + orgqr(8, 8, 6): 4*8*8*6 - 2*16*36 + 288 = 1536 - 1152 + 288
])
def test_qr(mode: str, flops: int) -> None:
    a = torch.randn(8, 6)
    assert op(count(lambda: torch.linalg.qr(a, mode=mode)), "aten.linalg_qr.default").flops == flops


def test_svd_standard_estimates() -> None:
    a = torch.randn(2, 8, 6)
    name = "aten._linalg_svd.default"
    # thin U, V: 14*8*36 + 8*216 = 4,032 + 1,728 = 5,760 per matrix
    assert op(count(lambda: torch.linalg.svd(a, full_matrices=False)), name).flops == 2 * 5760
    # full U (8 x 8): 4*64*6 + 8*8*36 + 9*216 = 1,536 + 2,304 + 1,944 = 5,784
    assert op(count(lambda: torch.linalg.svd(a, full_matrices=True)), name).flops == 2 * 5784
    # values only: 4*8*36 - 4*216/3 = 1,152 - 288 = 864. (torch.linalg.svdvals asks for U and V
    # whenever a dispatch mode is active, as it may need them for a backward.)
    svd = torch.ops.aten._linalg_svd.default
    assert op(count(lambda: svd(a, compute_uv=False)), name).flops == 2 * 864
    # a wide matrix costs what its transpose does
    assert op(count(lambda: svd(a.mT, compute_uv=False)), name).flops == 2 * 864


def test_eigen_standard_estimates() -> None:
    s = _spd(6)
    assert op(count(lambda: torch.linalg.eigh(s)), "aten._linalg_eigh.default").flops == 9 * 216
    eigh = torch.ops.aten._linalg_eigh.default
    assert op(count(lambda: eigh(s, compute_v=False)), "aten._linalg_eigh.default").flops == 288
    a = torch.randn(6, 6)
    assert op(count(lambda: torch.linalg.eig(a)), "aten.linalg_eig.default").flops == 25 * 216


def test_lstsq_by_qr() -> None:
    a, b = torch.randn(8, 6), torch.randn(8, 2)
    # geqrf 432 + Q^T B (ormqr 8 x 2 with 6 reflectors: 4*8*2*6 - 2*2*36 = 384 - 144 = 240)
    # + triangular solve 6^2 * 2 = 72
    assert op(count(lambda: torch.linalg.lstsq(a, b)), "aten.linalg_lstsq.default").flops == 744


def test_bookkeeping_is_zero() -> None:
    lu, piv = torch.linalg.lu_factor(torch.randn(6, 6))
    cost = op(count(lambda: torch.lu_unpack(lu, piv)), "aten.lu_unpack.default")
    assert (cost.macs, cost.flops) == (0, 0)
    assert cost.bytes_read > 0
