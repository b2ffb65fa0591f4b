"""Attention: every kernel variant of scaled_dot_product_attention, and the fused fast paths of
``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``.

Conventions (per element of the score matrix S = Q K^T, shape [B, H, L_q, L_k]):
the two products are MACs (d and d_v per score); scaling = 1 FLOP; softmax = 5 FLOPs (see
``softmax``); an additive mask = 1 FLOP; dropout in training = 1 FLOP. A causal mask is counted
as the dense kernel's work (no halving), as torch's FlopCounterMode does.
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, tensor_values
from flopscope.rules.registry import rule

SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide (see reduction.softmax)
SCALE_FLOPS = 1
# Backward of attention per score element: recompute P (scale, subtract logsumexp, exp) = 3,
# dS = P * (dP - rowsum(dO * O)) = 2, scale dS = 1.
BACKWARD_SCORE_FLOPS = 6


def _bhsd(shape: tuple[int, ...], layout: str) -> tuple[int, int, int, int]:
    if len(shape) == 3:  # unbatched / packed (varlen) inputs: [S, H, D]
        s, h, d = shape if layout == "bshd" else (shape[1], shape[0], shape[2])
        return 1, h, s, d
    if layout == "bshd":
        b, s, h, d = shape
    else:
        b, h, s, d = shape
    return b, h, s, d


# (cumulative query offsets, cumulative key offsets, max query length, max key length) argument
# names of the variable-length kernels
_FLASH_VARLEN = ("cum_seq_q", "cum_seq_k", "max_q", "max_k")
_EFFICIENT_VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def varlen_pairs(starts_q: list[int] | None, starts_k: list[int] | None, total_q: int,
                 total_k: int, max_q: object, max_k: object) -> int:
    """(query, key) pairs of packed sequences, per head: sum_b L_q,b * L_k,b from the cumulative
    offsets when their values are known; otherwise the upper bound min(total_q * max_k,
    max_q * total_k) (each L_q,b <= max_q and L_k,b <= max_k), never more than total_q * total_k."""
    if starts_q is not None and starts_k is not None and len(starts_q) == len(starts_k):
        return sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in
                   zip(starts_q, starts_q[1:], starts_k, starts_k[1:], strict=False))
    bound = total_q * total_k
    if isinstance(max_q, int) and isinstance(max_k, int) and max_q > 0 and max_k > 0:
        bound = min(bound, total_q * max_k, max_q * total_k)
    return bound


def _scores(call: OpCall, q: torch.Tensor, k: torch.Tensor, layout: str,
            varlen: tuple[str, str, str, str] | None) -> tuple[int, int, int]:
    """(score elements, query head dim d, heads) of one attention call; packed variable-length
    sequences (``cum_seq_q``/``cu_seqlens_q`` given) count each sequence's L_q x L_k block."""
    b, h, s_q, d = _bhsd(tuple(q.shape), layout)
    _, _, s_k, _ = _bhsd(tuple(k.shape), layout)
    if varlen is not None:
        cum_q, cum_k = named_arg(call, varlen[0]), named_arg(call, varlen[1])
        if cum_q is not None and cum_k is not None:
            pairs = varlen_pairs(tensor_values(cum_q), tensor_values(cum_k), b * s_q, b * s_k,
                                 named_arg(call, varlen[2]), named_arg(call, varlen[3]))
            return h * pairs, d, h
    return b * h * s_q * s_k, d, h


def _forward(call: OpCall, first: int, layout: str, *, mask: bool, dropout: float,
             varlen: tuple[str, str, str, str] | None = None) -> Cost:
    q, k, v = call.args[first], call.args[first + 1], call.args[first + 2]
    scores, d, _ = _scores(call, q, k, layout, varlen)
    d_v = _bhsd(tuple(v.shape), layout)[3]
    macs = scores * (d + d_v)
    per_score = SCALE_FLOPS + SOFTMAX_FLOPS + (1 if mask else 0) + (1 if dropout > 0 else 0)
    return call.cost(macs=macs, flops=2 * macs + per_score * scores)


def _backward(call: OpCall, layout: str, varlen: tuple[str, str, str, str] | None = None) -> Cost:
    q, k, v = call.args[1], call.args[2], call.args[3]
    scores, d, _ = _scores(call, q, k, layout, varlen)
    d_v = _bhsd(tuple(v.shape), layout)[3]
    # recompute S = Q K^T (d), dP = dO V^T (d_v), dV = P^T dO (d_v), dQ = dS K (d), dK = dS^T Q (d)
    macs = scores * (3 * d + 2 * d_v)
    return call.cost(macs=macs, flops=2 * macs + BACKWARD_SCORE_FLOPS * scores)


def _has(call: OpCall, name: str) -> bool:
    return named_arg(call, name) is not None


@rule("aten::_scaled_dot_product_flash_attention_for_cpu")
def sdpa_flash_cpu(call: OpCall) -> Cost:
    """O = softmax(scale * Q K^T + mask) V with Q [B,H,L_q,d], K [B,H_kv,L_k,d], V [B,H_kv,L_k,d_v]:
    B*H*L_q*L_k*(d + d_v) MACs (grouped-query heads are counted per query head); FLOPs = 2*MACs +
    (1 scale + 5 softmax + 1 if masked + 1 if dropout) per score element."""
    return _forward(call, 0, "bhsd", mask=_has(call, "attn_mask"),
                    dropout=float(named_arg(call, "dropout_p", 0.0)))


@rule("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_fused_attention_overrideable")
def sdpa_flash(call: OpCall) -> Cost:
    """As ``_scaled_dot_product_flash_attention_for_cpu`` (GPU flash kernel, layout [B,H,L,d])."""
    return _forward(call, 0, "bhsd", mask=_has(call, "attn_bias"),
                    dropout=float(named_arg(call, "dropout_p", 0.0)))


@rule("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention")
def sdpa_efficient(call: OpCall) -> Cost:
    """As ``_scaled_dot_product_flash_attention_for_cpu`` (memory-efficient / cuDNN kernels)."""
    return _forward(call, 0, "bhsd", mask=_has(call, "attn_bias"),
                    dropout=float(named_arg(call, "dropout_p", 0.0)))


@rule("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
def flash_forward(call: OpCall) -> Cost:
    """As ``_scaled_dot_product_flash_attention_for_cpu``; these kernels take [B,L,H,d] layouts.
    Variable-length (packed) sequences, given by cumulative offsets (``cum_seq_q``/``cum_seq_k``,
    ``cu_seqlens_q``/``cu_seqlens_k``): the sum over sequences of L_q,b * L_k,b score elements per
    head, not one sequence of the packed length (4 sequences of 32/64/96/128 tokens, 8 heads,
    d = 64: 8 * 30,720 * 128 = 31,457,280 MACs, not 8 * 320^2 * 128). The offsets are values:
    read when the tensors are real; on fake/meta tensors the count is the upper bound
    H * min(total_q * max_k, max_q * total_k) (exact when every sequence has the maximum length)."""
    varlen = _FLASH_VARLEN if "cum_seq_q" in _names(call) else _EFFICIENT_VARLEN
    return _forward(call, 0, "bshd", mask=_has(call, "bias"),
                    dropout=float(named_arg(call, "dropout_p", 0.0)), varlen=varlen)


def _names(call: OpCall) -> frozenset[str]:
    return frozenset(a.name for a in call.op._schema.arguments)


@rule("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
      "aten::_scaled_dot_product_flash_attention_backward",
      "aten::_scaled_dot_product_efficient_attention_backward",
      "aten::_scaled_dot_product_cudnn_attention_backward",
      "aten::_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_backward(call: OpCall) -> Cost:
    """Gradient of attention: five products per score element — recompute S = Q K^T (d), dP = dO V^T
    (d_v), dV = P^T dO (d_v), dQ = dS K (d), dK = dS^T Q (d): B*H*L_q*L_k*(3d + 2d_v) MACs (as
    torch's FlopCounterMode); plus 6 FLOPs per score element (recompute P: scale, subtract
    logsumexp, exp; dS = P * (dP - rowsum): 2; scale dS: 1)."""
    return _backward(call, "bhsd")


@rule("aten::_flash_attention_backward", "aten::_efficient_attention_backward")
def flash_backward(call: OpCall) -> Cost:
    """As ``_scaled_dot_product_flash_attention_for_cpu_backward``, for [B,L,H,d] layouts; packed
    variable-length sequences count per sequence, as in ``_flash_attention_forward``."""
    varlen = _FLASH_VARLEN if "cum_seq_q" in _names(call) else _EFFICIENT_VARLEN
    return _backward(call, "bshd", varlen)


def mha_cost(
    batch: int, l_q: int, l_k: int, embed: int, heads: int, *, qkv_bias: bool, out_bias: bool,
    masked: bool, need_weights: bool,
) -> tuple[int, int]:
    """(MACs, FLOPs) of multi-head attention with embed dim E and H heads.

    In-projection: B*L_q*E*E (q) + 2*B*L_k*E*E (k, v) MACs; the two attention products:
    2*B*L_q*L_k*E MACs; out-projection: B*L_q*E*E MACs. FLOPs = 2*MACs + biases (one add per
    projected element) + (softmax 5 + mask 1) per score element + the 1/sqrt(d) scaling +
    averaging the returned weights over heads (one add per score element, one divide per averaged
    element). The scaling is what the kernel does: with ``need_weights`` it scales q (one multiply
    per element of q: B*L_q*E), without it calls the SDPA kernel (one multiply per score element,
    see ``sdpa_flash_cpu``); so the fused and the unfused module give the same count.
    """
    scores = batch * heads * l_q * l_k
    macs = batch * l_q * embed * embed + 2 * batch * l_k * embed * embed
    macs += 2 * batch * l_q * l_k * embed
    macs += batch * l_q * embed * embed
    flops = 2 * macs + (SOFTMAX_FLOPS + (1 if masked else 0)) * scores
    flops += SCALE_FLOPS * (batch * l_q * embed if need_weights else scores)
    if qkv_bias:
        flops += batch * (l_q + 2 * l_k) * embed
    if out_bias:
        flops += batch * l_q * embed
    if need_weights:
        flops += scores + batch * l_q * l_k
    return macs, flops


def _blE(t_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(t_shape) == 2:
        return 1, t_shape[0], t_shape[1]
    return t_shape[0], t_shape[1], t_shape[2]


@rule("aten::_native_multi_head_attention")
def native_mha(call: OpCall) -> Cost:
    """The fused ``nn.MultiheadAttention`` fast path (eval, no grad): see ``mha_cost``: in-projection
    B*(L_q + 2 L_k)*E^2, attention 2*B*L_q*L_k*E, out-projection B*L_q*E^2 MACs."""
    q, k = call.args[0], call.args[1]
    batch, l_q, embed = _blE(tuple(q.shape))
    _, l_k, _ = _blE(tuple(k.shape))
    heads = int(call.args[4])
    macs, flops = mha_cost(
        batch, l_q, l_k, embed, heads,
        qkv_bias=named_arg(call, "qkv_bias") is not None,
        out_bias=named_arg(call, "proj_bias") is not None,
        masked=named_arg(call, "mask") is not None,
        need_weights=bool(named_arg(call, "need_weights", True)),
    )
    return call.cost(macs=macs, flops=flops)


LAYER_NORM_AFFINE_FLOPS = 8  # see normalization.layer_norm: 6 per element + weight + bias


@rule("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer(call: OpCall) -> Cost:
    """The fused ``nn.TransformerEncoderLayer`` fast path (eval, no grad): self-attention as
    ``mha_cost`` + feed-forward B*L*E*F MACs per linear (two linears) + two layer norms (8 FLOPs per
    element) + two residual adds (1 per element) + FFN biases + activation (relu 1, erf-GELU 5 per
    element of the hidden layer)."""
    src = call.args[0]
    batch, length, embed = _blE(tuple(src.shape))
    heads = int(call.args[2])
    ffn = int(named_arg(call, "ffn_weight_1").shape[0])
    macs, flops = mha_cost(
        batch, length, length, embed, heads,
        qkv_bias=named_arg(call, "qkv_bias") is not None,
        out_bias=named_arg(call, "proj_bias") is not None,
        masked=named_arg(call, "mask") is not None,
        need_weights=False,
    )
    tokens = batch * length
    ffn_macs = 2 * tokens * embed * ffn
    act = 5 if named_arg(call, "use_gelu", False) else 1
    flops += 2 * ffn_macs + tokens * ffn * (1 + act) + tokens * embed  # biases + activation
    flops += 2 * LAYER_NORM_AFFINE_FLOPS * tokens * embed + 2 * tokens * embed  # norms, residuals
    return call.cost(macs=macs + ffn_macs, flops=flops)
