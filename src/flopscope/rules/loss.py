"""Losses whose kernels have no decomposition: connectionist temporal classification (``_ctc_loss``
and its gradient), fused linear + cross-entropy, and the gradients of the multi-class and
multi-label margin losses (their forwards decompose into counted element-wise operators;
cross-entropy, NLL, MSE, L1 and BCE are in the reduction family).

CTC (Graves et al., 2006) runs the forward algorithm in log space over a lattice of T time steps x
(2S + 1) extended target positions per sequence (the S labels interleaved with blanks). Each
lattice cell is log_alpha[t, s] = logsumexp(up to 3 predecessors) + log p_t(l'_s): max (2
compares), 3 subtracts, 3 exps, 2 adds, a log and adding the max back (12), + the emission (1) =
13 FLOPs. Each sequence ends with the 2-term logsumexp of the last two cells and a negation (9).
Sequence lengths are read from the ``int[]`` arguments, or from the length tensors when they are
real; on fake/meta tensors every sequence is taken at its full padded length (T, S_max). Sizes
are used as they are (no ``int()``): symbolic sizes give formulas.
"""

from __future__ import annotations

from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, tensor_values
from flopscope.rules.registry import rule

CELL_FLOPS = 13  # 3-term logsumexp (12) + the emission log-probability (1)
FINISH_FLOPS = 9  # 2-term logsumexp of the last two cells (8) + negate (1)
# gradient per lattice cell: the beta recursion (13) + alpha + beta (1) + the 2-term logsumexp that
# accumulates it into its label's total (6); per log_probs element: exp(lp) - exp(total + nll - lp)
# scaled by the incoming gradient: add, subtract, 2 exps, subtract, multiply (6)
BACKWARD_CELL_FLOPS = 20
BACKWARD_ELEMENT_FLOPS = 6


def _lengths(arg: Any) -> list[Any] | None:
    """Per-sequence lengths from an int list or a real tensor; ``None`` when unknown (fake or
    meta tensors)."""
    if isinstance(arg, (list, tuple)):
        return [v if isinstance(v, torch.SymInt) else int(v) for v in arg]
    return tensor_values(arg)


def lattice_cells(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any) -> Any:
    """sum over sequences of T_n * (2 S_n + 1); unknown lengths are the full padded ones (T,
    S_max), and when both are unknown that is batch * T * (2 S_max + 1) (no per-sequence list,
    so a symbolic batch size stays a symbol)."""
    steps, batch = log_probs.shape[0], log_probs.shape[1] if log_probs.dim() == 3 else 1
    s_max = targets.shape[-1] if targets.dim() == 2 else targets.numel()
    t_n, s_n = _lengths(input_lengths), _lengths(target_lengths)
    if t_n is None and s_n is None:
        return batch * steps * (2 * s_max + 1)
    if t_n is None:
        t_n = [steps] * len(s_n)  # type: ignore[arg-type]
    if s_n is None:
        s_n = [s_max] * len(t_n)
    return sum(t * (2 * s + 1) for t, s in zip(t_n, s_n, strict=False))


@rule("aten::_ctc_loss")
def ctc_loss(call: OpCall) -> Cost:
    """CTC forward algorithm: 13 FLOPs per lattice cell (3-term logsumexp 12 + emission 1), over
    sum_n T_n * (2 S_n + 1) cells, + 9 per sequence (final 2-term logsumexp and negation)."""
    log_probs, targets = call.args[0], call.args[1]
    cells = lattice_cells(log_probs, targets, call.args[2], call.args[3])
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    return call.cost(flops=CELL_FLOPS * cells + FINISH_FLOPS * batch)


@rule("aten::_ctc_loss_backward")
def ctc_loss_backward(call: OpCall) -> Cost:
    """CTC gradient: the backward (beta) recursion and the per-label accumulation of alpha + beta,
    20 FLOPs per lattice cell, then the gradient of every log-probability, exp(lp) -
    exp(total + nll - lp) times the incoming gradient, 6 FLOPs per element of log_probs."""
    log_probs, targets = call.args[1], call.args[2]
    cells = lattice_cells(log_probs, targets, call.args[3], call.args[4])
    return call.cost(flops=BACKWARD_CELL_FLOPS * cells + BACKWARD_ELEMENT_FLOPS * log_probs.numel())


def _fused_linear_ce(call: OpCall, with_grads: bool) -> Cost:
    """Shared by the two chunked linear + cross-entropy operators (see their docstrings)."""
    x, w = call.args[0], call.args[1]
    bias = call.args[3]
    rows, vocab, dim = x.numel() // x.shape[-1], w.shape[0], w.shape[-1]
    logits = rows * vocab
    macs = logits * dim
    flops = 2 * macs + (logits if bias is not None else 0) + 5 * logits  # logits, log-softmax
    if with_grads:
        grads = [call.args[12], call.args[13], call.args[14]]  # input, weight, bias gradients
        flops += 2 * logits  # d logits = softmax - one-hot: divide, subtract
        for wanted, extra_macs in zip(grads[:2], (macs, macs), strict=True):
            if wanted:
                flops += 2 * extra_macs
                macs += extra_macs
        if grads[2] and bias is not None:
            flops += logits  # bias gradient: a column sum
    return call.cost(macs=macs, flops=flops)


@rule("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy(call: OpCall) -> Cost:
    """F.linear_cross_entropy (mean/sum reduction), chunked over the batch: logits = x W^T (+ b)
    for N rows, V classes, D features: N*V*D MACs (+ N*V bias adds); log-softmax 5 per logit. The
    operator computes the gradients in the same pass: d logits 2 per logit, and for each gradient
    asked for, d input = d logits W and d W = d logits^T x, N*V*D MACs each (d b: N*V adds)."""
    return _fused_linear_ce(call, with_grads=True)


@rule("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_no_reduction(call: OpCall) -> Cost:
    """F.linear_cross_entropy with reduction='none': the logits (N*V*D MACs, + N*V bias adds) and
    log-softmax (5 per logit); its gradients are recomputed in backward by the same operator."""
    return _fused_linear_ce(call, with_grads=False)


def _rows_and_classes(x: Any) -> tuple[Any, Any]:
    """(samples, classes) of a margin loss's input: ``[C]`` is one sample, ``[N, C]`` N, and a
    0-d input one sample of one class (as PyTorch's shape checks take it)."""
    if x.dim() == 0:
        return 1, 1
    return (1, x.shape[0]) if x.dim() == 1 else (x.shape[0], x.shape[1])


@rule("aten::multi_margin_loss_backward")
def multi_margin_loss_backward(call: OpCall) -> Cost:
    """Gradient of the multi-class margin loss (PyTorch's CPU kernel, LossMultiMargin.cpp), for N
    samples of C classes, with every margin taken as active (whether ``z > 0`` depends on values;
    the count is the bound): per (sample, class) z = margin - x[y] + x[d] (2, computed for all C);
    per class other than the target a compare (1), h = 2 g z for p = 2 (2; p = 1: h = g, 0), times
    weight[y] when a weight is given (1), and accumulating -h into the target's gradient (1); then
    every element times the incoming gradient (1). Per sample: 3C + (C - 1)(2 + 2[p=2] + [weight])."""
    x = call.args[1]
    rows, classes = _rows_and_classes(x)
    p = named_arg(call, "p", 1)
    weighted = named_arg(call, "weight") is not None
    per_other = 2 + (2 if p == 2 else 0) + (1 if weighted else 0)
    return call.cost(flops=rows * (3 * classes + (classes - 1) * per_other))


def _labels(target: Any, rows: Any) -> tuple[Any, Any]:
    """(labels, (label, other class) pairs) of a multi-label target ``[N, C]`` (each row's labels
    until the first -1): read from a real target; on fake/meta tensors one label per sample."""
    values = tensor_values(target)
    classes = target.shape[-1] if target.dim() else 1
    if values is None:
        return rows, rows * (classes - 1)
    labels = pairs = 0
    for n in range(len(values) // classes if classes else 0):
        row = values[n * classes:(n + 1) * classes]
        got = row.index(-1) if -1 in row else classes
        labels += got
        pairs += got * (classes - len(set(row[:got])))
    return labels, pairs


@rule("aten::multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(call: OpCall) -> Cost:
    """Gradient of the multi-label margin loss (PyTorch's CPU kernel, LossMultiLabelMargin.cpp),
    for N samples of C classes, with every margin taken as active (the bound): for each of a
    sample's labels y (its target row up to the first -1) and each class d that is not one of its
    labels, z = 1 - x[y] + x[d] (2), a compare (1) and the two gradient updates -g at y, +g at d
    (2): 5 per (label, other class) pair; then every element times the incoming gradient (1).
    Labels are read from a real target; on fake/meta tensors each sample is taken to have one."""
    x, target = call.args[1], call.args[2]
    rows, classes = _rows_and_classes(x)
    _, pairs = _labels(target, rows)
    return call.cost(flops=5 * pairs + rows * classes)
