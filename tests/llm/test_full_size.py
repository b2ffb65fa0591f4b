"""Full-size Mixtral 8x7B and Mamba-2.8B, counted shape-only from their real configs, against
the published figures (docs/llm.md, "Full-size Mixtral 8x7B and Mamba-2.8B"). Slow tier: about
30 s each here.

    FLOPSCOPE_SLOW=1 .venv/bin/python -m pytest -m slow tests/llm/test_full_size.py
"""

from __future__ import annotations

import os

import pytest

import flopscope
from flopscope.llm.flops import palm_flops_per_token, token_flops
from flopscope.sources import load_model

pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"),
                                 reason="slow tier: set FLOPSCOPE_SLOW=1")]

# mistralai/Mixtral-8x7B-v0.1's config.json = transformers' MixtralConfig defaults: vocab 32000,
# hidden 4096, MLP 14336, 32 layers, 32 heads (d 128), 8 KV heads, 8 experts, top-2, untied
V, H, INTER, LAYERS, HEADS, KV, D, EXPERTS, TOPK = 32000, 4096, 14336, 32, 32, 8, 128, 8, 2


def test_mixtral_8x7b_total_and_active_parameters_and_flops_per_token() -> None:
    T = 4096
    lm = load_model("hf:mixtral", shape_only=True, seq_len=T)
    # one bmm per (token, expert) pair: static shapes, so it runs on meta; the default
    # (grouped_mm) needs bf16 on meta and the eager loop calls nonzero (data-dependent)
    lm.model.set_experts_implementation("batched_mm")
    config = lm.model.config
    assert (config.vocab_size, config.hidden_size, config.intermediate_size,
            config.num_hidden_layers, config.num_local_experts,
            config.num_experts_per_tok) == (V, H, INTER, LAYERS, EXPERTS, TOPK)
    attention = H * H + 2 * H * KV * D + H * H  # q, k, v, o
    expert = 3 * H * INTER  # w1, w2, w3
    router, norms = H * EXPERTS, 2 * H
    total = V * H * 2 + H + LAYERS * (attention + EXPERTS * expert + router + norms)
    active = V * H * 2 + H + LAYERS * (attention + TOPK * expert + router + norms)
    assert sum(p.numel() for p in lm.model.parameters()) == total == 46_702_792_704  # "46.7B"
    assert active == 12_879_925_248  # Mistral's "12.9B active parameters"

    report = flopscope.count(lm.model, lm.inputs, shape_only=True, warn=False)
    assert not report.uncounted
    # per token: every linear a token runs (attention, its 2 experts, the router); the LM head
    # on all T positions (a training-style forward); Q K^T and P V dense over T keys
    linear = LAYERS * (attention + TOPK * expert + router)
    scores = LAYERS * HEADS * T * D * 2
    assert report.macs == T * (linear + V * H) + T * scores == 56_616_258_895_872
    # vs "2 x active" per token: + the attention products (4 L H d T), - the embedding (a
    # lookup, not a product), - the norms' weights (element-wise)
    forward_per_token = 2 * report.macs // T
    assert forward_per_token == 2 * active + 4 * LAYERS * HEADS * D * T - 2 * V * H - 2 * (
        LAYERS * norms + H) == 27_644_657_664

    tf = token_flops(lm.model, seq_len=T)
    # training products = 3 x forward + SDPA's flash backward recomputing Q K^T (L H T^2 d)
    recompute = 2 * LAYERS * HEADS * T * T * D
    assert tf.matmul_flops == 3 * 2 * report.macs + recompute
    # PaLM's 6N + 12 L H Q T with N = active parameters: off by the recomputation, the
    # embedding (6 x V H) and the norms (6 x 65 H)
    palm = palm_flops_per_token(active, LAYERS, HEADS, D, T)
    assert tf.matmul_flops // T - palm == recompute // T - 6 * V * H - 6 * (LAYERS * norms + H)


# state-spaces/mamba-2.8b-hf: d_model 2560, 64 layers, d_inner 5120 (expand 2), state N = 16,
# dt_rank 160, conv 4, vocab 50280, embeddings tied
DM, ML, DI, N, RANK, CONV, MV = 2560, 64, 5120, 16, 160, 4, 50280


def test_mamba_2_8b_parameters_and_selective_scan() -> None:
    T = 64
    config = {"hidden_size": DM, "num_hidden_layers": ML, "intermediate_size": DI,
              "time_step_rank": RANK, "vocab_size": MV}
    lm = load_model("hf:mamba", config=config, shape_only=True, seq_len=T)
    linear = DM * 2 * DI + DI * (RANK + 2 * N) + RANK * DI + DI * DM  # in, x, dt, out proj
    other = (DI * CONV + DI) + DI + DI * N + DI + DM  # conv w+b, dt bias, A_log, D, norm
    params = MV * DM + DM + ML * (linear + other)
    assert sum(p.numel() for p in lm.model.parameters()) == params == 2_768_345_600  # "2.8B"
    report = flopscope.count(lm.model, lm.inputs, shape_only=True, warn=False)
    assert not report.uncounted
    ops = report.by_op()
    # products per token: the linears + the tied LM head (on every position) ...
    assert ops["aten.mm.default"].cost.macs == T * (ML * linear + MV * DM)
    # ... the depthwise conv (transformers pads by CONV - 1 on both sides and slices: T + 3
    # outputs computed) and the scan's output contraction y = C h (D N per token and layer)
    assert ops["aten.convolution.default"].cost.macs == ML * DI * CONV * (T + CONV - 1)
    assert ops["aten.bmm.default"].cost.macs == ML * T * DI * N
    # the selective scan's element-wise work per token and layer (reference path, sequential
    # over T): exp(dt A) D N, multiplies dt A, dt B, (dt B) u, dA h: 4 D N, the add h + dBu: D N;
    # with the contraction 2 D N: 8 D N, against Gu's 9 D N (state-spaces/mamba#110) for the
    # parallel scan; exp also runs once per layer on A_log (D N)
    assert ops["aten.exp.default"].cost.flops == ML * (T * DI * N + DI * N)
    scan = 8 * DI * N
    assert scan * ML == 41_943_040 and 9 * DI * N * ML == 47_185_920
    # both under 1% of 2N per token
    assert 9 * DI * N * ML / (2 * params) < 0.01
