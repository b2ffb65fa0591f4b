"""Reductions, softmax and scans: FLOPs per input element (+ per output for means)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rules._util import count, leaf, op

X = torch.randn(3, 4)  # 12 elements, 3 rows


def test_sum_mean_max() -> None:
    assert op(count(lambda: X.sum()), "aten.sum.default").flops == 12
    assert op(count(lambda: X.mean(1)), "aten.mean.dim").flops == 12 + 3  # adds + 3 divides
    assert op(count(lambda: X.amax(1)), "aten.amax.default").flops == 12


def test_var_std() -> None:
    # mean (1 per input + 1 divide per output), (x - mean)^2 summed (3 per input), / (n - 1)
    assert op(count(lambda: X.var(1)), "aten.var.correction").flops == 4 * 12 + 2 * 3
    assert op(count(lambda: X.std(1)), "aten.std.correction").flops == 4 * 12 + 3 * 3  # + sqrt


def test_softmax_and_log_softmax() -> None:
    x = leaf(3, 4)
    report = count(lambda: F.softmax(x, -1), backward=True)
    assert op(report, "aten._softmax.default").flops == 5 * 12  # max, sub, exp, sum, div
    assert op(report, "aten._softmax_backward_data.default", "backward").flops == 4 * 12
    assert op(count(lambda: F.log_softmax(X, -1)), "aten._log_softmax.default").flops == 5 * 12


def test_logsumexp() -> None:
    # max, subtract, exp, add per input (4 * 12); log and add per output (2 * 3)
    assert op(count(lambda: X.logsumexp(1)), "aten.logsumexp.default").flops == 48 + 6


def test_cumsum_forward_and_backward() -> None:
    x = leaf(3, 4)
    report = count(lambda: x.cumsum(1), backward=True)
    assert op(report, "aten.cumsum.default", "forward").flops == 12  # one add per input element
    # the gradient of a cumsum is a reversed cumsum: another 12
    assert op(report, "aten.cumsum.default", "backward").flops == 12


def test_cross_entropy_is_counted() -> None:
    logits, target = leaf(4, 5), torch.tensor([0, 1, 2, 3])
    report = count(lambda: F.cross_entropy(logits, target), backward=True)
    assert report.uncounted == {}
    # log_softmax 5 * 20; nll_loss: negate + sum per target: 2 * 4; the helper's .sum() of the
    # scalar loss: 1
    assert report.total("forward").flops == 5 * 20 + 2 * 4 + 1
