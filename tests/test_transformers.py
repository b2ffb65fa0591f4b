"""BERT, GPT-2 and Llama built from transformers configs (tiny sizes; never pretrained weights).

Every op is counted (forward and backward, train and eval), real == shape-only == meta, the MACs
of a tiny Llama are derived by hand, and ``2 * macs`` equals torch's FlopCounterMode.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopscope

transformers = pytest.importorskip("transformers")

V, D, LAYERS, HEADS, KV_HEADS, FFN, B, L = 100, 32, 2, 4, 2, 64, 2, 8
HEAD_DIM = D // HEADS  # 8


def _config(name: str, attn: str = "sdpa") -> Any:
    if name == "gpt2":
        kw: dict[str, Any] = dict(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    else:
        kw = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FFN, max_position_embeddings=64)
        if name == "llama":
            kw["num_key_value_heads"] = KV_HEADS
    config = transformers.AutoConfig.for_model(name, **kw)
    config._attn_implementation = attn
    return config


def _model(name: str, attn: str = "sdpa", meta: bool = False) -> nn.Module:
    config = _config(name, attn)
    cls = transformers.AutoModelForMaskedLM if name == "bert" else transformers.AutoModelForCausalLM
    if meta:
        with torch.device("meta"):
            return cls.from_config(config)  # type: ignore[no-any-return]
    return cls.from_config(config)  # type: ignore[no-any-return]


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))


def _key(report: flopscope.Report) -> tuple[int, int, int, int]:
    return (report.macs, report.flops, report.bytes_read, report.bytes_written)


# (train, backward): eval forward, eval forward+backward, train forward+backward; the eager
# attention path only in training (its ops are a subset of what the SDPA runs already cover).
SDPA_CASES = [(False, False), (False, True), (True, True)]
CASES = [(name, "sdpa", train, backward) for name in ("bert", "gpt2", "llama")
         for train, backward in SDPA_CASES]
CASES += [(name, "eager", True, True) for name in ("bert", "gpt2", "llama")]


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str, bool], nn.Module]:
    return {(name, attn, meta): _model(name, attn, meta)
            for name in ("bert", "gpt2", "llama") for attn in ("sdpa", "eager")
            for meta in (False, True)}


@pytest.mark.parametrize(("name", "attn", "train", "backward"), CASES)
def test_all_counted_and_real_equals_shape_only_equals_meta(
    models: dict[tuple[str, str, bool], nn.Module], name: str, attn: str, train: bool,
    backward: bool,
) -> None:
    model, meta_model, ids = models[name, attn, False], models[name, attn, True], _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)  # nothing uncounted or opaque
        real = flopscope.count(model, ids, backward=backward, train=train)
        fake = flopscope.count(model, ids, backward=backward, train=train, shape_only=True)
        meta = flopscope.count(meta_model, ids, backward=backward, train=train)
    assert real.uncounted == {} == fake.uncounted == meta.uncounted
    assert _key(real) == _key(fake) == _key(meta)
    assert real.macs > 0
    if backward:
        assert real.total("backward").macs > 0


# Hand-derived MACs of the tiny Llama (B=2, L=8 -> T = 16 tokens; D=32, 4 heads of 8, 2 KV heads,
# FFN 64, vocab 100). Embeddings, RMS norms, RoPE, SiLU and softmax do no MACs.
T = B * L  # 16
Q_PROJ = T * D * D  # 16*32*32 = 16,384
KV_PROJ = T * D * (KV_HEADS * HEAD_DIM)  # 16*32*16 = 8,192 each for k and v
O_PROJ = T * D * D  # 16,384
MLP = 3 * T * D * FFN  # gate, up, down: 3 * 16*32*64 = 98,304
ATTN = 2 * B * HEADS * L * L * HEAD_DIM  # QK^T and PV, per query head: 2 * 2*4*8*8*8 = 8,192
PER_LAYER = Q_PROJ + 2 * KV_PROJ + O_PROJ + MLP + ATTN  # 155,648
LM_HEAD = T * D * V  # 16*32*100 = 51,200
LLAMA_MACS = LAYERS * PER_LAYER + LM_HEAD  # 2*155,648 + 51,200 = 362,496


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama_macs_by_hand(attn: str) -> None:
    report = flopscope.count(_model("llama", attn), _ids())
    assert report.macs == LLAMA_MACS == 362_496
    by_module = report.by_module()
    layer = by_module["model.layers.0"].inclusive.macs
    assert layer == PER_LAYER == 155_648
    assert by_module["model.layers.0.self_attn"].inclusive.macs == Q_PROJ + 2 * KV_PROJ + O_PROJ + ATTN
    assert by_module["model.layers.0.mlp"].inclusive.macs == MLP
    assert by_module["lm_head"].inclusive.macs == LM_HEAD
    assert by_module["model.embed_tokens"].inclusive.macs == 0
    ops = report.by_op()
    if attn == "sdpa":  # the fused CPU kernel carries the two attention products
        fused = ops["aten._scaled_dot_product_flash_attention_for_cpu.default"]
        assert fused.calls == LAYERS
        assert fused.cost.macs == LAYERS * ATTN
    else:  # eager: q @ k^T and p @ v as matmuls (bmm)
        assert ops["aten.bmm.default"].cost.macs == LAYERS * ATTN


def _flop_counter_total(model: nn.Module, ids: torch.Tensor, backward: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        out = model(ids)
        if backward:
            out.logits.sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama_meta_matches_flop_counter_mode(attn: str) -> None:
    model = _model("llama", attn, meta=True)
    ids = _ids().to("meta")
    forward = flopscope.count(model, ids)
    assert 2 * forward.macs == _flop_counter_total(model, ids, backward=False) == 2 * LLAMA_MACS
    both = flopscope.count(model, ids, backward=True)
    theirs = _flop_counter_total(model, ids, backward=True)
    if attn == "eager":
        assert 2 * both.macs == theirs
    else:
        # On meta, FlopCounterMode sees SDPA's unfused math form, whose backward is 4 products per
        # score; flopscope counts the fused CPU kernel flopscope would run on a real device, whose
        # backward also recomputes S = QK^T (5 products, FlopCounterMode's own formula for the
        # fused kernels): the difference is exactly that recompute, B*H*L*L*d per layer.
        recompute = LAYERS * B * HEADS * L * L * HEAD_DIM  # 2 * 4,096
        assert 2 * both.macs == theirs + 2 * recompute


# Built under torch.device("meta"), these still make a few tensors on the CPU (hubert's
# masked_spec_embed, ImageGPT's layer-norm weights: torch.Tensor(n) ignores the default device).
TINY_MIXED = {
    "hubert": (dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                    num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, vocab_size=8),
               "input_values", (1, 400)),
    "imagegpt": (dict(vocab_size=17, n_positions=16, n_embd=16, n_layer=1, n_head=2),
                 "input_ids", (1, 16)),
}


@pytest.mark.parametrize("name", sorted(TINY_MIXED))
def test_built_on_meta_with_a_few_cpu_tensors_counts_like_the_real_model(name: str) -> None:
    settings, key, shape = TINY_MIXED[name]
    config = transformers.AutoConfig.for_model(name, **settings)
    inputs = {key: torch.randint(0, 16, shape) if key == "input_ids" else torch.randn(shape)}
    real = transformers.AutoModel.from_config(config).eval()
    with torch.device("meta"):
        meta = transformers.AutoModel.from_config(config).eval()
    assert any(not t.is_meta for t in meta.parameters())  # the case: a meta model, not all meta
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        reports = [flopscope.count(real, **inputs), flopscope.count(meta, **inputs),
                   flopscope.count(real, shape_only=True, **inputs)]
    assert len({(r.macs, r.flops) for r in reports}) == 1
    assert reports[0].macs > 0


def test_a_counter_around_a_meta_mistral_counts_what_the_cpu_runs() -> None:
    """Sliding-window attention (a mask SDPA takes): a Counter around forward + backward of a
    meta-built Mistral counts the CPU's fused kernels, as count() and a real run do."""
    config = transformers.MistralConfig(vocab_size=V, hidden_size=D, intermediate_size=FFN,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                        num_key_value_heads=KV_HEADS, sliding_window=4,
                                        max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    ids = _ids()
    real = transformers.MistralForCausalLM(config)
    with torch.device("meta"):
        meta = transformers.MistralForCausalLM(config)
    reports = []
    for model, inputs in ((real, ids), (meta, ids.to("meta"))):
        with flopscope.Counter(model) as counter:
            model(inputs).logits.sum().backward()
        reports.append(counter.report)
    assert (reports[1].macs, reports[1].flops) == (reports[0].macs, reports[0].flops)
    assert reports[1].macs == flopscope.count(meta, ids, backward=True).macs
    assert "aten.bmm.default" not in reports[1].by_op()  # not SDPA's math form
