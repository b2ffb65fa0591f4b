"""Matrix products: one MAC per (output element, reduction index)."""

from __future__ import annotations

import torch
from torch import nn

from rules._util import count, leaf, op


def test_mm() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    cost = op(count(lambda: a @ b), "aten.mm.default")
    assert (cost.macs, cost.flops) == (3 * 5 * 4, 2 * 60)  # 60 MACs
    assert (cost.bytes_read, cost.bytes_written) == ((12 + 20) * 4, 15 * 4)


def test_linear_is_addmm_with_bias_adds() -> None:
    lin, x = nn.Linear(4, 5), torch.randn(3, 4)
    report = count(lambda: lin(x))
    cost = op(report, "aten.addmm.default")
    assert cost.macs == 3 * 5 * 4  # 60
    assert cost.flops == 2 * 60 + 3 * 5  # + one bias add per output element
    assert report.macs == 60


def test_linear_without_bias() -> None:
    lin, x = nn.Linear(4, 5, bias=False), torch.randn(2, 3, 4)
    report = count(lambda: lin(x))
    assert (report.macs, report.flops) == (2 * 3 * 5 * 4, 2 * 120)  # 120 MACs


def test_linear_backward() -> None:
    lin, x = nn.Linear(4, 5), leaf(3, 4)
    report = count(lambda: lin(x), backward=True)
    back = report.total("backward")
    # dX = dY[3,5] @ W[5,4]: 60; dW = dY^T[5,3] @ X[3,4]: 60; db = sum over 3 rows: 15 adds;
    # the .sum() seed's backward is an expand (0)
    assert back.macs == 60 + 60
    assert back.flops == 2 * 120 + 15


def test_bmm_matmul_einsum() -> None:
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    assert op(count(lambda: torch.bmm(a, b)), "aten.bmm.default").macs == 2 * 3 * 5 * 4  # 120
    assert count(lambda: torch.matmul(a, b)).macs == 120
    assert count(lambda: torch.einsum("bij,bjk->bik", a, b)).macs == 120
    assert count(lambda: a @ torch.randn(4, 5)).macs == 2 * 3 * 5 * 4  # folded into one mm: 120


def test_baddbmm_scale_factors() -> None:
    s, a, b = torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    cost = op(count(lambda: torch.baddbmm(s, a, b, beta=0.5, alpha=2.0)), "aten.baddbmm.default")
    # 2*3*5*4 = 120 MACs; per output element (30): add, beta scale, alpha scale = 3
    assert (cost.macs, cost.flops) == (120, 240 + 3 * 30)


def test_addmm_mv_dot() -> None:
    m, v = torch.randn(3, 4), torch.randn(4)
    assert op(count(lambda: torch.mv(m, v)), "aten.mv.default").macs == 3 * 4  # 12
    addmv = op(count(lambda: torch.addmv(torch.randn(3), m, v)), "aten.addmv.default")
    assert (addmv.macs, addmv.flops) == (12, 24 + 3)
    assert op(count(lambda: torch.dot(v, v)), "aten.dot.default").macs == 4
    addmm = op(count(lambda: torch.addmm(torch.randn(3, 5), m, torch.randn(4, 5))),
               "aten.addmm.default")
    assert (addmm.macs, addmm.flops) == (60, 120 + 15)


def test_addmm_in_place() -> None:
    c, a, b = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    cost = op(count(lambda: c.addmm_(a, b)), "aten.addmm_.default")
    # 3*5*4 = 60 MACs, 2*60 + 15 accumulating adds = 135 FLOPs
    assert (cost.macs, cost.flops) == (60, 135)


def test_scaled_mm_v2_float8() -> None:
    a = torch.randn(15, 16).to(torch.float8_e4m3fn)
    b = torch.randn(32, 16).to(torch.float8_e4m3fn).t()
    one = torch.tensor([1.0])
    cost = op(count(lambda: torch.ops.aten._scaled_mm_v2(a, b, [one], [0], [0], [one], [0], [0],
                                                         None, torch.bfloat16)),
              "aten._scaled_mm_v2.default")
    assert (cost.macs, cost.flops) == (15 * 32 * 16, 2 * 15 * 32 * 16)  # 7,680 MACs
