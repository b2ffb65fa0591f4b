"""flex_attention (``torch.nn.attention.flex_attention``): the blocks its kernel computes.

A flex_attention kernel walks a :class:`~torch.nn.attention.flex_attention.BlockMask`: for each
(batch, head, query block) it computes the listed key/value blocks -- *partial* blocks (the
``mask_mod`` is applied inside) and *full* blocks (no mask needed) -- and skips the rest. The
executed work is therefore the computed blocks, each Q_BLOCK x KV_BLOCK scores (clipped to the
sequence lengths), not the dense L_q x L_k. With no BlockMask every block is full: the dense
figure. Where the block counts cannot be read (fake or meta tensors in a shape-only count), the
dense figure is used: an upper bound.

Per score element the conventions of ``attention`` hold: d (Q K^T) + d_v (P V) MACs; scaling 1
and softmax 5 FLOPs. ``score_mod`` / ``mask_mod`` bodies are user code the fused kernel inlines;
they are not counted (they are typically a few FLOPs per score).
"""

from __future__ import annotations

from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import tensor_values
from flopscope.rules.attention import BACKWARD_SCORE_FLOPS, SCALE_FLOPS, SOFTMAX_FLOPS
from flopscope.rules.registry import rule


def _block_total(counts: torch.Tensor | None, b: int, h: int) -> int | None:
    """Sum of a [B_m, H_m, Q_blocks] block-count tensor, broadcast to b x h; None if unreadable."""
    if counts is None:
        return 0
    values = tensor_values(counts)
    if values is None:
        return None
    bm, hm = (counts.shape[0], counts.shape[1]) if counts.dim() >= 3 else (1, 1)
    return sum(values) * (b // max(bm, 1)) * (h // max(hm, 1))


def computed_scores(q: torch.Tensor, k: torch.Tensor, block_mask: tuple[Any, ...]) -> int:
    """Score elements a flex_attention kernel computes: (partial + full) blocks x block area."""
    b, h, l_q, _ = q.shape
    l_k = k.shape[-2]
    q_block, kv_block = int(block_mask[-3]), int(block_mask[-2])
    partial = _block_total(block_mask[2], b, h)
    full = _block_total(block_mask[4], b, h)
    if partial is None or full is None:
        return b * h * l_q * l_k  # block counts not readable (shape-only): the dense bound
    return (partial + full) * min(q_block, l_q) * min(kv_block, l_k)


@rule("higher_order::flex_attention")
def flex_attention(call: OpCall) -> Cost:
    """flex_attention forward: per computed score (the BlockMask's partial + full blocks, each
    Q_BLOCK x KV_BLOCK clipped to the sequence lengths): d + d_v MACs, scale 1 + softmax 5 FLOPs.
    Without readable block counts (shape-only) the dense L_q x L_k figure, an upper bound."""
    q, k, v = call.args[0], call.args[1], call.args[2]
    scores = computed_scores(q, k, call.args[4])
    macs = scores * (q.shape[-1] + v.shape[-1])
    return call.cost(macs=macs, flops=2 * macs + (SCALE_FLOPS + SOFTMAX_FLOPS) * scores)


@rule("higher_order::flex_attention_backward")
def flex_attention_backward(call: OpCall) -> Cost:
    """flex_attention backward: per computed score, recompute S = Q K^T (d), dV += P^T dO (d_v),
    dP = dO V^T (d_v), dQ += dS K (d), dK += dS^T Q (d): 3d + 2d_v MACs, and 6 FLOPs for
    recomputing P and forming dS (as for the fused SDPA backward kernels)."""
    q, k, v = call.args[0], call.args[1], call.args[2]
    scores = computed_scores(q, k, call.args[9])  # (q, k, v, out, lse, dout, dlse, fw, joint, mask)
    macs = scores * (3 * q.shape[-1] + 2 * v.shape[-1])
    return call.cost(macs=macs, flops=2 * macs + BACKWARD_SCORE_FLOPS * scores)
