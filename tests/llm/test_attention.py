"""Attention figures: counted (dense), executed (CPU flash kernel blocks) and model (visible
pairs), with the arithmetic written out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flopscope
from flopscope.cost import Phase
from flopscope.llm import (
    AttentionFigures,
    causal_pairs,
    cpu_flash_block_sizes,
    cpu_flash_executed_pairs,
    sliding_window_pairs,
)


def test_pair_formulas() -> None:
    # top-left causal, L_q = L_k = T: T (T + 1) / 2
    assert causal_pairs(1024, 1024) == 1024 * 1025 // 2 == 524_800
    # bottom-right, 4 queries at the end of 10 keys: 7 + 8 + 9 + 10
    assert causal_pairs(4, 10, align="bottom-right") == 34
    # top-left, 4 queries, 10 keys: 1 + 2 + 3 + 4
    assert causal_pairs(4, 10) == 10
    # window 3 over 6 tokens: 1 + 2 + 3 + 3 + 3 + 3
    assert sliding_window_pairs(6, 6, 3) == 15
    with pytest.raises(ValueError, match="align"):
        causal_pairs(2, 2, align="left")


def test_cpu_flash_blocks() -> None:
    assert cpu_flash_block_sizes(1024, 1024) == (256, 512)
    assert cpu_flash_block_sizes(200, 200) == (64, 200)
    assert cpu_flash_block_sizes(100, 100) == (32, 100)
    # L = 1024: query blocks of 256 visit 1, 1, 2, 2 key blocks of 512
    assert cpu_flash_executed_pairs(1024, 1024, causal=True) == 256 * (512 + 512 + 1024 + 1024)
    # L = 100 (key block = 100 = L_k): every query block computes all 100 keys
    assert cpu_flash_executed_pairs(100, 100, causal=True) == 100 * 100
    assert cpu_flash_executed_pairs(7, 9, causal=False) == 63


def _figures(fn, *args, backward: bool = False) -> tuple[flopscope.Report, AttentionFigures]:  # type: ignore[no-untyped-def]
    figures = AttentionFigures()
    with flopscope.Counter(observers=[figures], warn=False) as c:
        out = fn(*args)
        if backward:
            out.sum().backward()
    return c.report, figures


def test_causal_model_and_executed_forward() -> None:
    b, h, t, d = 2, 3, 1024, 16
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    _, fig = _figures(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    tot = fig.total()
    dense = b * h * t * t
    assert tot.counted.macs == dense * 2 * d
    # model = dense x (T + 1) / (2T) per head
    assert tot.model.macs * 2 * t == tot.counted.macs * (t + 1)
    assert tot.executed.macs == b * h * 786_432 * 2 * d
    # FLOPs: 2 MACs + (scale 1 + softmax 5) per score, for each figure's scores
    assert tot.model.flops == 2 * tot.model.macs + 6 * b * h * 524_800


def test_backward_model_drops_recomputed_qk() -> None:
    b, h, t, d = 1, 2, 64, 8
    q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
    _, fig = _figures(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), backward=True)
    bwd = fig.by_phase[Phase.BACKWARD]
    # counted: 3d + 2d_v = 40 MACs per dense score; model: 2d + 2d_v = 32 per visible pair
    assert bwd.counted.macs == b * h * t * t * 40
    assert bwd.model.macs == b * h * causal_pairs(t, t) * 32
    # L = 64 < key block: the kernel computes every key (executed = dense)
    assert bwd.executed.macs == bwd.counted.macs


def test_explicit_sliding_window_mask() -> None:
    t, w, d = 48, 8, 16
    i = torch.arange(t)
    mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)  # transformers' window
    q, k, v = (torch.randn(1, 2, t, d) for _ in range(3))
    _, fig = _figures(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    tot = fig.total()
    assert tot.exact
    assert tot.model.macs == 2 * sliding_window_pairs(t, t, w) * 2 * d
    assert tot.executed.macs == tot.counted.macs  # an explicit mask: every block computed


def test_adjust_reads_the_report_either_way() -> None:
    q, k, v = (torch.randn(1, 1, 256, 8) for _ in range(3))
    report, fig = _figures(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    total = report.total()
    assert fig.adjust(total, "counted") == total
    assert fig.adjust(total, "model").macs == total.macs - fig.total().counted.macs + fig.total().model.macs


def test_shape_only_mask_assumption() -> None:
    t = 32
    fig = AttentionFigures(assume_mask="causal")
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    q, k, v = (torch.randn(1, 1, t, 8) for _ in range(3))
    with torch.device("meta"):
        mq, mk, mv, mm = (x.to("meta") for x in (q, k, v, mask))
    from flopscope._meta import sdpa_as_cpu

    with sdpa_as_cpu(), flopscope.Counter(observers=[fig], warn=False):
        F.scaled_dot_product_attention(mq, mk, mv, attn_mask=mm)
    tot = fig.total()
    assert tot.model.macs == causal_pairs(t, t) * 16
    assert any("assumed causal" in n for n in tot.notes)
