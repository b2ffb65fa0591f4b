"""Attention: SDPA kernels, nn.MultiheadAttention (fused and not), the TransformerEncoderLayer fast
path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.cost import OpCall
from flopscope.rules import default_rules
from rules._util import count, leaf, op

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FLASH_BW = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
B, H, LQ, LK, D = 2, 4, 6, 5, 8
SCORES = B * H * LQ * LK  # 240


def test_sdpa_fused_forward_and_backward() -> None:
    q, k, v = leaf(B, H, LQ, D), leaf(B, H, LK, D), leaf(B, H, LK, D)
    report = count(lambda: F.scaled_dot_product_attention(q, k, v), backward=True)
    fwd = op(report, FLASH)
    assert fwd.macs == SCORES * (D + D)  # QK^T and PV: 240 * 16 = 3,840
    assert fwd.flops == 2 * 3840 + (1 + 5) * SCORES  # scale 1 + softmax 5 per score
    bwd = op(report, FLASH_BW, "backward")
    assert bwd.macs == SCORES * (3 * D + 2 * D)  # recompute S, dP, dV, dQ, dK: 9,600
    assert bwd.flops == 2 * 9600 + 6 * SCORES


def test_sdpa_causal_counts_the_dense_kernel() -> None:
    q = leaf(B, H, LQ, D)
    report = count(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), backward=True)
    scores = B * H * LQ * LQ  # 288, no halving for the causal mask
    assert op(report, FLASH).macs == scores * 2 * D  # 4,608
    assert op(report, FLASH_BW, "backward").macs == scores * 5 * D  # 11,520


def test_sdpa_gqa_counts_per_query_head() -> None:
    q, k, v = leaf(B, H, LQ, D), leaf(B, 2, LK, D), leaf(B, 2, LK, D)
    report = count(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), backward=True)
    assert op(report, FLASH).macs == SCORES * 2 * D  # 4 query heads share 2 KV heads: 3,840
    assert op(report, FLASH_BW, "backward").macs == SCORES * 5 * D  # 9,600


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_sdpa_with_mask(mask_dtype: torch.dtype) -> None:
    q, k, v = leaf(B, H, LQ, D), leaf(B, H, LK, D), leaf(B, H, LK, D)
    mask = torch.rand(LQ, LK) > 0.3 if mask_dtype is torch.bool else torch.randn(LQ, LK)
    report = count(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), backward=True)
    assert report.uncounted == {}
    assert report.total("forward").macs == SCORES * 2 * D  # 3,840 whichever kernel ran
    back = report.total("backward").macs
    if FLASH_BW in report.by_op():
        assert back == SCORES * 5 * D  # fused: recomputes S
    else:  # the math form: bmm backward, dP, dV, dQ, dK = 4 products
        assert back == SCORES * 4 * D  # 7,680


# nn.MultiheadAttention(768, 12) on (1, 640, 768): projections 4*N*E^2 + products 2*N^2*E
MHA_MACS = 4 * 640 * 768**2 + 2 * 640**2 * 768  # 1,509,949,440 + 629,145,600 = 2,139,095,040


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval", "eval_no_grad"])
def test_multihead_attention(mode: str, need_weights: bool) -> None:
    mha = nn.MultiheadAttention(768, 12, batch_first=True).train(mode == "train")
    x = torch.randn(1, 640, 768)
    with torch.set_grad_enabled(mode != "eval_no_grad"):
        report = count(lambda: mha(x, x, x, need_weights=need_weights)[0])
    assert report.macs == MHA_MACS == 2_139_095_040
    assert report.uncounted == {}
    if mode == "eval_no_grad":
        assert "aten._native_multi_head_attention.default" in report.by_op()


def test_multihead_attention_fused_flops_equal_unfused() -> None:
    mha = nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x = torch.randn(2, 10, 64)
    for weights in (True, False):
        unfused = count(lambda w=weights: mha(x, x, x, need_weights=w)[0])
        with torch.no_grad():
            fused = count(lambda w=weights: mha(x, x, x, need_weights=w)[0])
        assert "aten._native_multi_head_attention.default" in fused.by_op()
        assert (fused.macs, fused.flops) == (unfused.macs, unfused.flops)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_fast_path(activation: str) -> None:
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, activation=activation).eval()
    x = torch.randn(2, 10, 64)
    unfused = flopscope.count(layer, x)
    with torch.no_grad():
        fused = flopscope.count(layer, x)
    assert "aten._transformer_encoder_layer_fwd.default" in fused.by_op()
    tokens = 2 * 10
    # attention: 4 projections T*E^2 + 2 products B*L^2*E; FFN: 2 * T*E*F
    assert fused.macs == 4 * tokens * 64**2 + 2 * 2 * 10**2 * 64 + 2 * tokens * 64 * 128
    assert (fused.macs, fused.flops) == (unfused.macs, unfused.flops)


# -- variable-length (packed) sequences: the CUDA kernels, costed through an OpCall -------------
# 4 sequences of 32/64/96/128 tokens packed into 320, 8 heads, d = 64
VARLEN_STARTS = [0, 32, 96, 192, 320]
VARLEN_PAIRS = 32**2 + 64**2 + 96**2 + 128**2  # 1,024 + 4,096 + 9,216 + 16,384 = 30,720


def _varlen_call(name: str, device: str = "cpu") -> OpCall:
    heads, d, total = 8, 64, 320
    cum = torch.tensor(VARLEN_STARTS, dtype=torch.int32, device=device)
    op_ = getattr(torch.ops.aten, name).default
    if name == "_flash_attention_forward":
        q = torch.empty(total, heads, d, device=device)
        args = (q, q, q, cum, cum, 128, 128, 0.0, False, False)
    elif name == "_efficient_attention_forward":
        q = torch.empty(1, total, heads, d, device=device)
        args = (q, q, q, None, cum, cum, 128, 128, 0.0, 0)
    elif name == "_flash_attention_backward":
        q = torch.empty(total, heads, d, device=device)
        lse = torch.empty(heads, total, device=device)
        args = (q, q, q, q, q, lse, cum, cum, 128, 128, 0.0, False, q, q)
    else:  # _efficient_attention_backward
        q = torch.empty(1, total, heads, d, device=device)
        lse = torch.empty(1, heads, total, device=device)
        args = (q, q, q, q, None, q, cum, cum, 128, 128, lse, 0.0, q, q, 0, False)
    return OpCall(op_, args, {}, (torch.empty_like(q),))


@pytest.mark.parametrize("name", ["_flash_attention_forward", "_efficient_attention_forward"])
def test_varlen_attention_counts_each_sequence(name: str) -> None:
    call = _varlen_call(name)
    cost = default_rules().find(call.op)(call)
    assert cost.macs == 8 * VARLEN_PAIRS * (64 + 64) == 31_457_280  # not 8 * 320^2 * 128
    assert cost.flops == 2 * cost.macs + (1 + 5) * 8 * VARLEN_PAIRS


@pytest.mark.parametrize("name", ["_flash_attention_backward", "_efficient_attention_backward"])
def test_varlen_attention_backward(name: str) -> None:
    call = _varlen_call(name)
    cost = default_rules().find(call.op)(call)
    assert cost.macs == 8 * VARLEN_PAIRS * (3 * 64 + 2 * 64)  # 78,643,200
    assert cost.flops == 2 * cost.macs + 6 * 8 * VARLEN_PAIRS


def test_varlen_attention_without_offset_values_is_an_upper_bound() -> None:
    call = _varlen_call("_flash_attention_forward", device="meta")
    cost = default_rules().find(call.op)(call)
    # offsets unreadable: min(total_q * max_k, max_q * total_k) = 320 * 128 pairs per head
    assert cost.macs == 8 * 320 * 128 * 128 == 41_943_040
    assert cost.macs < 8 * 320 * 320 * 128  # one packed sequence would be 104,857,600
