"""Generation step by step: prefill = the model's forward at P tokens with logits of the last
token only; decode step j = the hand formula at one query and P + j keys; KV-cache bytes."""

from __future__ import annotations

import json

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.llm import StepCounter, count_generation
from flopscope.sources import load_model

transformers = pytest.importorskip("transformers")

# tiny Llama: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, MLP 128, vocab 100
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
# 7B-shaped Llama (Llama-2-7B: 32 layers, 4096 hidden, 32 heads, MLP 11008, vocab 32000)
SEVEN_B = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 11008,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}


def linear_macs_per_token(c: dict[str, int]) -> int:
    """q, k, v, o projections + gate/up/down, per layer, per token."""
    h, heads, kv, inter = (c["hidden_size"], c["num_attention_heads"],
                           c["num_key_value_heads"], c["intermediate_size"])
    d = h // heads
    return c["num_hidden_layers"] * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter)


def decode_macs(c: dict[str, int], keys: int, batch: int = 1) -> int:
    """One query token attending to `keys` keys: linears + attention (d + d_v per score per
    head) + the LM head of that token."""
    d = c["hidden_size"] // c["num_attention_heads"]
    attention = c["num_hidden_layers"] * c["num_attention_heads"] * keys * 2 * d
    return batch * (linear_macs_per_token(c) + attention + c["hidden_size"] * c["vocab_size"])


def kv_bytes(c: dict[str, int], tokens: int, itemsize: int, batch: int = 1) -> int:
    d = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * d * tokens * itemsize * batch


@pytest.mark.parametrize("shape_only", [False, True])
def test_tiny_llama_steps(shape_only: bool) -> None:
    p, n, b = 8, 4, 2
    model = load_model("hf:llama", config=TINY, shape_only=shape_only).model
    result = count_generation(model, prompt_len=p, new_tokens=n, batch=b)
    assert [s.kind for s in result.steps] == ["prefill", "decode", "decode", "decode"]
    assert [s.tokens for s in result.steps] == [b * p, b, b, b]
    # prefill = the model's own forward at P tokens, last token's logits only
    ref_model = load_model("hf:llama", config=TINY).model
    ids = torch.zeros(b, p, dtype=torch.long)
    ref = flopscope.count(ref_model, input_ids=ids, logits_to_keep=1, use_cache=True, warn=False)
    assert result.steps[0].cost.macs == ref.macs
    # = b * (8 * 36,864 linear + 2 layers * 4 heads * 8 * 8 * 32 attention / b... ) by hand:
    # linears 2 * (4096 + 2*2048 + 4096 + 24576) = 73,728 per token; attention 2*4*8*8*32 = 16,384
    # per sequence; LM head 64*100 = 6,400 per sequence: 2 * (8*73,728 + 16,384 + 6,400) = 1,225,216
    assert result.steps[0].cost.macs == 1_225_216
    for j, step in enumerate(result.steps[1:], start=1):
        # decode step j: one query, P + j keys; j = 1: 2 * (73,728 + 2*4*9*32 + 6,400) = 164,864
        assert step.context == p + j
        assert step.cost.macs == decode_macs(TINY, p + j, b)
        assert step.kv_read == kv_bytes(TINY, p + j, 4, b)  # float32
        assert step.kv_written == kv_bytes(TINY, 1, 4, b)
    assert result.steps[1].cost.macs == 164_864
    assert result.steps[0].kv_written == result.steps[0].kv_read == kv_bytes(TINY, p, 4, b)


def test_seven_b_shape_only_decode() -> None:
    p, n = 512, 3
    model = load_model("hf:llama", config=SEVEN_B, shape_only=True, dtype="bfloat16").model
    result = count_generation(model, prompt_len=p, new_tokens=n)
    for j, step in enumerate(result.steps[1:], start=1):
        assert step.cost.macs == decode_macs(SEVEN_B, p + j)
        # bf16: 2 * 32 * 32 * 128 * (512 + j) * 2 bytes = 524,288 * (512 + j)
        assert step.kv_read == 524_288 * (p + j) == kv_bytes(SEVEN_B, p + j, 2)
        assert step.kv_written == 524_288
    # prefill: causal attention, model FLOPs = dense * (T + 1) / (2T) of the attention part
    pre = result.steps[0]
    dense_attention = pre.attention_counted_flops
    assert pre.attention_model_flops * 2 * p == dense_attention * (p + 1)


def test_own_decode_loop_with_step_counter() -> None:
    model = load_model("hf:llama", config=TINY).model
    ids = torch.zeros(1, 5, dtype=torch.long)
    with StepCounter(model, warn=False) as steps, torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(2):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    r = steps.result
    assert [s.kind for s in r.steps] == ["prefill", "decode", "decode"]
    assert r.steps[2].context == 7
    assert r.between.flops == 0 or r.between.macs == 0  # argmax: no products
    assert sum((s.cost for s in r.steps), r.between) == r.report.total()


def test_cli_generate_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hf:llama", "--shape-only", "--prompt-len", "16", "--new-tokens", "3",
            "--format", "json"] + [f"--config={k}={v}" for k, v in TINY.items()]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["steps"]) == 3
    for key in ("tokens", "macs", "flops", "bytes_read", "bytes_written", "kv_read", "kv_written"):
        assert key in data["steps"][0]
    assert data["steps"][1]["macs"] == decode_macs(TINY, 17)
    assert data["summary"]["decode"]["steps"] == 2


def test_cli_generate_refuses_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hf:llama", "--prompt-len", "4", "--new-tokens", "2",
                 "--input", "1x4:int64"]) == 2
    assert "--input" in capsys.readouterr().err


def test_shape_only_needs_meta() -> None:
    model = load_model("hf:llama", config=TINY).model
    with pytest.raises(flopscope.UsageError, match="meta device"):
        count_generation(model, prompt_len=4, new_tokens=2, shape_only=True)
