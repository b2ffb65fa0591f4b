"""cdist / pdist: 3 FLOPs per (pair, coordinate) + a root per pair, or the matrix-product path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rules._util import count, op

CDIST = "aten._cdist_forward.default"


def test_cdist_direct() -> None:
    x1, x2 = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    # 2*5*4 = 40 pairs: 3 coordinates x (subtract, square, add) + sqrt = 10
    assert op(count(lambda: torch.cdist(x1, x2)), CDIST).flops == 400
    assert op(count(lambda: torch.cdist(x1, x2, p=1)), CDIST).flops == 40 * 9  # no root for p = 1
    assert op(count(lambda: torch.cdist(x1, x2, p=3)), CDIST).flops == 400


def test_cdist_matrix_product_path() -> None:
    x1, x2 = torch.randn(30, 4), torch.randn(20, 4)  # more than 25 rows: |x|^2 + |y|^2 - 2 x.y
    cost = op(count(lambda: torch.ops.aten._cdist_forward(x1, x2, 2.0, None)), CDIST)
    assert cost.macs == 600 * (4 + 2)  # [30, 6] @ [6, 20]
    # norms and -2 scaling 3*30*4 + 2*20*4 = 520, clamp and sqrt 2 * 600
    assert cost.flops == 2 * 3600 + 520 + 1200
    direct = op(count(lambda: torch.ops.aten._cdist_forward(x1, x2, 2.0, 2)), CDIST)
    assert (direct.macs, direct.flops) == (0, 600 * 13)  # "donot_use_mm": 4 coordinates x 3 + 1


def test_pdist_and_cdist_backward() -> None:
    x = torch.randn(5, 3, requires_grad=True)
    report = count(lambda: F.pdist(x), backward=True)
    assert op(report, "aten._pdist_forward.default").flops == 10 * 10  # 10 pairs x (3*3 + 1)
    # p = 2: 4 per (pair, coordinate) + one divide per pair
    assert op(report, "aten._pdist_backward.default", "backward").flops == 10 * (4 * 3 + 1)
    x1, x2 = torch.randn(5, 3, requires_grad=True), torch.randn(4, 3)
    back = count(lambda: torch.cdist(x1, x2), backward=True)
    assert op(back, "aten._cdist_backward.default", "backward").flops == 20 * 13
