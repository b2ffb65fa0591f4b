"""CTC loss: the forward (alpha) lattice, 13 FLOPs per cell; the gradient, 20 per cell + 6 per
log-probability."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rules._util import count


def test_ctc_loss_forward_and_backward() -> None:
    log_probs = torch.randn(10, 2, 5).log_softmax(-1).detach().requires_grad_()
    targets = torch.tensor([[1, 2, 3], [4, 1, 0]])
    report = count(lambda: F.ctc_loss(log_probs, targets, [10, 8], [3, 2], reduction="sum"),
                   backward=True)
    stats = report.by_op()
    fwd = sum(s.cost.flops for name, s in stats.items() if name.startswith("aten._ctc_loss."))
    # lattice cells: 10 * (2*3 + 1) + 8 * (2*2 + 1) = 70 + 40 = 110; 13 per cell + 9 per sequence
    assert fwd == 13 * 110 + 9 * 2  # 1,448
    back = sum(s.cost.flops for name, s in report.by_op("backward").items()
               if name.startswith("aten._ctc_loss_backward"))
    assert back == 20 * 110 + 6 * 10 * 2 * 5  # 2,200 + 600 = 2,800


def _grad_op(fn, x: torch.Tensor, name: str) -> int:  # type: ignore[no-untyped-def]
    import flopscope

    with flopscope.Counter(warn=False) as counter:
        fn(x).backward()
    assert counter.report.uncounted == {}
    return counter.report.by_op()[name].cost.flops


def test_multi_margin_loss_backward() -> None:
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.tensor([0, 2, 4, 1])
    name = "aten.multi_margin_loss_backward.default"
    # per sample 3C (z for every class, the final scaling) + (C - 1) x (compare, accumulate):
    # 4 x (15 + 4 x 2) = 92
    assert _grad_op(lambda t: F.multi_margin_loss(t, y), x, name) == 92
    # p = 2 and a weight: + h = 2 g z (2) and x weight[y] (1) per other class: 4 x (15 + 4 x 5)
    w = torch.rand(5)
    assert _grad_op(lambda t: F.multi_margin_loss(t, y, p=2, weight=w), x, name) == 140


def test_multilabel_margin_loss_backward_reads_the_labels() -> None:
    x = torch.randn(4, 5, requires_grad=True)
    t = torch.tensor([[3, 0, -1, 1, 1], [2, 2, 4, -1, 0], [0, 1, 2, 3, 4], [-1, 0, 0, 0, 0]])
    # (label, other class) pairs per row, labels up to the first -1: {3, 0}: 2 x 3 = 6;
    # 2, 2, 4 (two distinct): 3 x 3 = 9; all five classes: 5 x 0; none: 0 -> 15 pairs x 5 FLOPs
    # + the final scaling of 4 x 5 elements = 95
    name = "aten.multilabel_margin_loss_backward.default"
    assert _grad_op(lambda u: F.multilabel_margin_loss(u, t), x, name) == 95


def test_margin_loss_gradients_of_a_0d_input() -> None:
    # a 0-d input is one sample of one class (PyTorch's shape checks): multi-margin 3C + (C - 1)
    # x 2 = 3; multi-label: its one label has no other class (0 pairs) + 1 scaled element = 1
    x = torch.randn((), requires_grad=True)
    assert _grad_op(lambda t: F.multi_margin_loss(t, torch.tensor(0)), x,
                    "aten.multi_margin_loss_backward.default") == 3
    assert _grad_op(lambda t: F.multilabel_margin_loss(t, torch.tensor(0)), x,
                    "aten.multilabel_margin_loss_backward.default") == 1
