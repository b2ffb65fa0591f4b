"""Generation step by step: prefill = the model's forward at P tokens with logits of the last
token only; decode step j = the hand formula at one query and P + j keys; KV-cache bytes."""

from __future__ import annotations

import json

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.llm import StepCounter, count_generation
from flopscope.llm.kv_cache import cache_keyword, find_cache
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
            # the cache under the keyword this transformers release takes (5.24: ``cache``)
            out = model(input_ids=nxt, use_cache=True,
                        **{cache_keyword(model): find_cache(out)})
    r = steps.result
    assert [s.kind for s in r.steps] == ["prefill", "decode", "decode"]
    assert r.steps[2].context == 7
    assert r.between.flops == 0 or r.between.macs == 0  # argmax: no products
    assert sum((s.cost for s in r.steps), r.between) == r.report.total()


class _ToyDecoder(torch.nn.Module):
    """A one-layer decoder without transformers, in either cache API: ``legacy`` takes
    ``past_key_values`` (a tuple of per-layer (keys, values)) and ``cache_position`` and returns a
    dict; otherwise it takes ``cache`` (an object with ``get_seq_length``) and ``position_ids``
    and returns a tuple. Keys and values: (batch, 1 head, length, 4)."""

    def __init__(self, legacy: bool) -> None:
        super().__init__()
        self.legacy = legacy
        self.kv = torch.nn.Linear(4, 8, bias=False)

    def step(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        k, v = self.kv(x).unsqueeze(1).chunk(2, dim=-1)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        return x, (k, v)

    def forward(self, x: torch.Tensor, **kw: object) -> object:
        if self.legacy:
            past = kw.get("past_key_values")
            out, kv = self.step(x, past[0] if past else None)  # type: ignore[index]
            return {"logits": out, "past_key_values": (kv,)}
        cache = kw.get("cache")
        assert isinstance(cache, _ToyCache)
        out, cache.kv = self.step(x, cache.kv)
        return out, cache


class _ToyCache:
    def __init__(self) -> None:
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def get_seq_length(self) -> int:
        return 0 if self.kv is None else int(self.kv[0].shape[2])

    @property
    def layers(self) -> list[object]:
        if self.kv is None:
            return []
        return [type("L", (), {"keys": self.kv[0], "values": self.kv[1]})()]


@pytest.mark.parametrize("legacy", [True, False], ids=["past_key_values", "cache"])
def test_step_kind_from_cache_object_and_positions(legacy: bool) -> None:
    """A step's kind comes from the cache object the model is given and its tokens' positions,
    whatever the keywords are called; the context from the cache it returns."""
    model = _ToyDecoder(legacy)
    x = torch.zeros(2, 5, 4)
    with StepCounter(model, warn=False) as steps, torch.no_grad():
        if legacy:
            out = model(x, cache_position=torch.arange(5))
            for t in (5, 6):
                out = model(x[:, :1], past_key_values=out["past_key_values"],
                            cache_position=torch.tensor([t]))
        else:
            cache = _ToyCache()
            for t in (0, 5, 6):
                n = 5 if t == 0 else 1
                model(x[:, :n], cache=cache, position_ids=torch.arange(t, t + n).expand(2, n))
    r = steps.result
    assert [s.kind for s in r.steps] == ["prefill", "decode", "decode"]
    assert [s.context for s in r.steps] == [5, 6, 7]
    # keys + values of 2 sequences, 1 head, 4 wide, float32: 2 * 2 * 4 * 4 B = 64 B per position
    assert [s.kv_read for s in r.steps] == [5 * 64, 6 * 64, 7 * 64]
    assert [s.kv_written for s in r.steps] == [5 * 64, 64, 64]


def test_static_cache_steps_by_positions() -> None:
    """A static cache is full length from the first step: the positions tell prefill from
    decode."""
    model = load_model("hf:llama", config=TINY).model
    ids = torch.zeros(2, 5, dtype=torch.long)
    with StepCounter(model, warn=False) as steps, torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                       min_new_tokens=3, do_sample=False, pad_token_id=0,
                       cache_implementation="static")
    assert [s.kind for s in steps.result.steps] == ["prefill", "decode", "decode"]


def test_generate_prints_no_deprecation_warning(recwarn: pytest.WarningsRecorder,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Neither the steps nor the cache lookup use a keyword transformers has deprecated."""
    import logging

    # transformers logs a deprecation once per process (an lru_cache): forget earlier ones
    clear = getattr(getattr(logging.Logger, "warning_once", None), "cache_clear", None)
    if clear is not None:
        clear()
    for shape_only in (False, True):
        model = load_model("hf:llama", config=TINY, shape_only=shape_only).model
        with caplog.at_level(logging.WARNING):
            count_generation(model, prompt_len=4, new_tokens=3)
    assert not [w for w in recwarn if "deprecated" in str(w.message)]
    assert "deprecated" not in caplog.text


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


def test_cli_generate_hardware_estimates_each_step(capsys: pytest.CaptureFixture[str]) -> None:
    """``generate --hardware NAME`` without a measured time: each step's roofline (a lower
    bound), as ``count --hardware`` gives; the prefill's equals the roofline of the same forward
    counted on its own."""
    from flopscope.estimate import roofline

    argv = ["generate", "hf:llama", "--shape-only", "--prompt-len", "16", "--new-tokens", "3",
            "--hardware", "h100-sxm", "--format", "json"] + [f"--config={k}={v}"
                                                              for k, v in TINY.items()]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    steps = data["steps"]
    for step in steps:
        est = step["estimate"]
        assert est["kind"] == "lower bound"
        assert est["time_s"] == max(est["compute_s"], est["memory_s"]) > 0
    assert [s["estimate"]["bound"] for s in steps[1:]] == ["memory", "memory"]  # decode
    model = load_model("hf:llama", config=TINY, shape_only=True).model
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    _, alone = roofline(model, input_ids=ids, logits_to_keep=1, use_cache=True,
                        hardware="h100-sxm", warn=False)
    assert steps[0]["estimate"]["time_s"] == pytest.approx(alone.total.time_s, rel=1e-9)
    summary = data["estimate"]
    assert summary["prefill_s"] == steps[0]["estimate"]["time_s"]
    assert summary["decode_step_s"] == pytest.approx(
        (steps[1]["estimate"]["time_s"] + steps[2]["estimate"]["time_s"]) / 2)
    assert main([a for a in argv if a not in ("--format", "json")]) == 0
    out = capsys.readouterr().out
    assert "est. time" in out and "roofline on h100-sxm (a lower bound" in out


@pytest.mark.parametrize(("source", "message"), [
    ("hf:bert", "attention is not causal"),
    ("torchvision:resnet18", "not a generation model"),
])
def test_cli_generate_refuses_models_that_cannot_decode(
        source: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = ["--config=num_hidden_layers=1"] if source.startswith("hf:") else []
    assert main(["generate", source, "--prompt-len", "8", "--new-tokens", "2", *config]) == 2
    err = capsys.readouterr().err
    assert message in err and "--seq-len" not in err and len(err.strip().splitlines()) == 1
