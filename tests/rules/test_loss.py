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
