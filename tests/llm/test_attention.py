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
    from flopscope.execution.meta import sdpa_as_cpu

    with sdpa_as_cpu(), flopscope.Counter(observers=[fig], warn=False):
        F.scaled_dot_product_attention(mq, mk, mv, attn_mask=mm)
    tot = fig.total()
    assert tot.model.macs == causal_pairs(t, t) * 16
    assert any("assumed causal" in n for n in tot.notes)


def test_flash2_tiles_and_executed_pairs() -> None:
    from flopscope.llm.pairs import flash2_block_sizes, flash2_executed_pairs

    # PyTorch's flash_fwd_launch_template.h: d = 128 on A100/H100 128 x 64; sm86 causal 64 x 64,
    # non-causal 128 x 32; d = 64 128 x 128; d = 80 rounds up to the 96 kernel
    assert flash2_block_sizes(128, capability=(9, 0)) == (128, 64)
    assert flash2_block_sizes(128, capability=(8, 0)) == (128, 64)
    assert flash2_block_sizes(128, capability=(8, 6)) == (64, 64)
    assert flash2_block_sizes(128, capability=(8, 6), causal=False) == (128, 32)
    assert flash2_block_sizes(64) == (128, 128)
    assert flash2_block_sizes(80, capability=(8, 9)) == (64, 64)
    with pytest.raises(flopscope.UsageError, match="head dims 1 to 192"):
        flash2_block_sizes(256)
    # causal, T = 1024, 128 x 64 tiles: query tile m visits ceil(128 (m + 1) / 64) = 2 (m + 1)
    # key tiles = 128 (m + 1) keys; sum over m = 0..7 of 128 x 128 (m + 1) = 16,384 x 36 =
    # 589,824 = (T + Bm) / 2T = 0.5625 of the dense 1,048,576
    assert flash2_executed_pairs(1024, 1024, block_m=128, block_n=64) == 589_824
    # 64 x 64 tiles (sm86): 4,096 x (1 + ... + 16) = 557,056 = (T + 64) / 2T of dense
    assert flash2_executed_pairs(1024, 1024, block_m=64, block_n=64) == 557_056
    # no mask: dense; a decode step (1 query, bottom-right) sees all 100 keys
    assert flash2_executed_pairs(1024, 1024, block_m=128, block_n=64, causal=False) == 1024**2
    assert flash2_executed_pairs(1, 100, block_m=128, block_n=64) == 100
    # sliding window 256, T = 1024, 128 x 64: tile m visits key tiles from
    # floor((128 m - 256) / 64) = 2m - 4 (at least 0) to 2 (m + 1): 6 tiles = 384 keys once
    # m >= 2; m = 0: 128 keys, m = 1: 256 keys: 128 x (128 + 256 + 6 x 384) = 344,064
    assert flash2_executed_pairs(1024, 1024, block_m=128, block_n=64, window=256) == 344_064
