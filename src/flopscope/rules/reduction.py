"""Reductions, softmax, cumulative operators and losses.

Conventions: reducing n elements costs one FLOP per *input* element (n - 1 adds/compares, rounded
up to n so the count is independent of how the reduction is split); a mean adds one divide per
output element.
"""

from __future__ import annotations

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import register_table, rule

register_table([
    (["aten::sum", "aten::nansum", "aten::prod", "aten::amax", "aten::amin", "aten::max",
      "aten::min", "aten::argmax", "aten::argmin", "aten::any", "aten::all", "aten::aminmax",
      "aten::count_nonzero", "aten::cumsum", "aten::cumsum_", "aten::cumprod", "aten::cumprod_",
      "aten::cummax", "aten::cummin", "aten::_cummax_helper", "aten::_cummin_helper",
      "aten::trace"],
     1, "Reduction or scan over n elements (sum, prod, max, min, argmax, any, cumsum ...): 1 FLOP "
        "per input element."),
    (["aten::logcumsumexp"],
     3, "logcumsumexp: exp, add, log per input element: 3 FLOPs."),
], of="input")


@rule("aten::mean", "aten::nanmean")
def mean(call: OpCall) -> Cost:
    """mean over n elements: n adds per output (1 per input element) + 1 divide per output element."""
    return call.cost(flops=call.args[0].numel() + call.out_numel())


@rule("aten::var", "aten::std", "aten::var_mean", "aten::std_mean")
def var(call: OpCall) -> Cost:
    """variance of n elements: mean (1 per input + 1 divide per output), then (x - mean)^2 summed
    (subtract, square, add: 3 per input), divide by n - correction (1 per output); std adds a square
    root per output: 4 FLOPs per input element + 2 (var) or 3 (std) per output element."""
    out = call.output.numel()
    per_out = 3 if "std" in call.op._schema.name else 2
    return call.cost(flops=4 * call.args[0].numel() + per_out * out)


@rule("aten::linalg_vector_norm", "aten::norm", "aten::frobenius_norm")
def vector_norm(call: OpCall) -> Cost:
    """p-norm: |x|^p per element and a sum (2 per input element; for p = 2 a square and an add), one
    root per output element."""
    return call.cost(flops=2 * call.args[0].numel() + call.out_numel())


@rule("aten::logsumexp")
def logsumexp(call: OpCall) -> Cost:
    """log(sum(exp(x - max))) + max: max, subtract, exp, add = 4 per input element; log and add = 2
    per output element."""
    return call.cost(flops=4 * call.args[0].numel() + 2 * call.out_numel())


@rule("aten::_softmax", "aten::softmax", "aten::_safe_softmax", "aten::_log_softmax",
      "aten::log_softmax", "aten::_masked_softmax")
def softmax(call: OpCall) -> Cost:
    """softmax along a dim: max (1), subtract (1), exp (1), sum (1), divide (1) = 5 FLOPs per element.
    log_softmax: max, subtract, exp, sum, subtract log-sum = 5 (the log is per row and not counted)."""
    return call.cost(flops=5 * call.args[0].numel())


@rule("aten::_softmax_backward_data", "aten::_log_softmax_backward_data",
      "aten::_masked_softmax_backward")
def softmax_backward(call: OpCall) -> Cost:
    """softmax': dx = y * (g - sum(g * y)): multiply, sum, subtract, multiply = 4 FLOPs per element.
    log_softmax': dx = g - exp(y) * sum(g): sum, exp, multiply, subtract = 4."""
    return call.cost(flops=4 * call.out_numel())


def _reduced_by(call: OpCall) -> int:
    reduction = named_arg(call, "reduction", 1)
    return 1 if reduction in (1, 2) else 0


@rule("aten::nll_loss_forward", "aten::nll_loss2d_forward", "aten::nll_loss_nd", "aten::nll_loss")
def nll_loss(call: OpCall) -> Cost:
    """NLL loss: gather -log p of the target (a negate) per target element, weighted (+1 with class
    weights), summed (+1 per target element with mean/sum reduction)."""
    n = call.args[1].numel()
    weighted = named_arg(call, "weight") is not None
    per = 1 + int(weighted) + _reduced_by(call)
    return call.cost(flops=per * n)


@rule("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(call: OpCall) -> Cost:
    """NLL loss gradient: scatter -w/N into the target position: 1 FLOP per target element (+1 with
    class weights)."""
    n = call.args[2].numel()
    return call.cost(flops=(1 + int(named_arg(call, "weight") is not None)) * n)


@rule("aten::mse_loss", "aten::l1_loss", "aten::smooth_l1_loss", "aten::huber_loss")
def regression_loss(call: OpCall) -> Cost:
    """(x - y)^2 or |x - y| (2) summed (1): 3 FLOPs per element (+ 1 divide for a mean);
    smooth-L1/Huber are counted the same (their branch is a select)."""
    return call.cost(flops=3 * call.args[0].numel() + 1)


@rule("aten::mse_loss_backward", "aten::l1_loss_backward", "aten::smooth_l1_loss_backward",
      "aten::huber_loss_backward")
def regression_loss_backward(call: OpCall) -> Cost:
    """2 * (x - y) * g / N: subtract, multiply, multiply = 3 FLOPs per element."""
    return call.cost(flops=3 * call.out_numel())


@rule("aten::binary_cross_entropy", "aten::binary_cross_entropy_with_logits")
def bce(call: OpCall) -> Cost:
    """-(y log p + (1-y) log(1-p)): 2 logs, 1 sub, 2 mul, 1 add, 1 negate = 7 FLOPs per element, +1
    for the reduction sum (with logits: sigmoid folded into a log-sum-exp of the same size)."""
    return call.cost(flops=8 * call.args[0].numel())


@rule("aten::binary_cross_entropy_backward", "aten::binary_cross_entropy_with_logits_backward")
def bce_backward(call: OpCall) -> Cost:
    """g * (p - y) / (p (1 - p)) (or g * (sigmoid(x) - y) with logits): 5 FLOPs per element."""
    return call.cost(flops=5 * call.out_numel())
