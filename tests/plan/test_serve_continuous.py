"""flopscope.plan(mode="serve", batching="continuous") / flopscope plan --serve --batching
continuous: continuous batching with chunked prefill, its rows from the serving role's mixed
step (its memory, the largest batch, its times), against the static plan of the same roles."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import get_hardware
from flopscope.plan import ServePlan, serving
from flopscope.plan.build import build_model
from flopscope.plan.serve_rows import ServeCandidate

CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
PROMPT, NEW = 64, 8
BUDGET = 64 * 2**20
SERVE = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=PROMPT, mode="serve",
             max_new_tokens=NEW, batches=[1, 4], memory_budget=BUDGET)


def _plan(**options: Any) -> ServePlan:
    made = flopscope.plan("hf:llama", **{**SERVE, **options})
    assert isinstance(made, ServePlan)
    return made


@pytest.fixture(scope="module")
def plans() -> tuple[ServePlan, ServePlan]:
    """The same model and devices planned with static and with continuous batching."""
    return _plan(), _plan(batching="continuous")


def _row(plan: ServePlan, label: str, batch: int) -> ServeCandidate:
    (found,) = [c for c in (*plan.ranked, *plan.dropped)
                if c.layout.label == label and c.batch == batch]
    return found


def _largest(plan: ServePlan, label: str) -> ServeCandidate:
    (found,) = [c for c in plan.ranked if c.largest and c.layout.label == label]
    return found


def test_a_continuous_row_is_its_mixed_steps(plans: tuple[ServePlan, ServePlan]) -> None:
    """Each row: the step is the mixed step's time (the static plan's continuous figure of
    the same layout and batch), tokens/s = replicas x batch / a step, the first token after
    max(1, ceil(8 / batch)) steps (a prompt's 64 tokens at the step's 64 x batch / 8)."""
    static, cont = plans
    assert cont.batching == "continuous" and static.batching == "static"
    for c in cont.ranked:
        assert c.continuous is None  # the row is continuous batching's own
        assert c.tokens_per_s == c.layout.replicas * c.batch / c.decode.total
        assert c.prefill.total == pytest.approx(c.decode.total * max(1, -(-NEW // c.batch)))
        assert c.decode_bound is not None and c.tokens_per_s_bound == pytest.approx(
            c.layout.replicas * c.batch / c.decode_bound.total)
    for label in ("TP1 PP1 DP2", "TP2 PP1 DP1", "TP1 PP2 DP1"):
        mine, theirs = _row(cont, label, 4), _row(static, label, 4)
        assert theirs.continuous is not None
        assert mine.decode == theirs.continuous.step
        assert mine.tokens_per_s == theirs.continuous.tokens_per_s
    data = json.loads(json.dumps(cont.to_dict()))
    assert data["batching"] == "continuous" and data["best_continuous"] is None
    assert all(r["continuous_batching"] is None for r in data["ranked"])
    assert data["best_throughput"] == cont.ranked[0].label


def test_continuous_memory_is_the_mixed_steps_peak(plans: tuple[ServePlan, ServePlan]
                                                   ) -> None:
    """One stage: a row's memory is the mixed step's simulated peak (every sequence's cache at
    the generation's middle, one step's activations), below static batching's (the whole
    prompt's activations at once, every sequence's whole cache)."""
    static, cont = plans
    hw = get_hardware("h100")
    build = build_model("hf:llama", PROMPT, "bfloat16", CONFIG)
    run = serving.simulate_serving(lambda: build(1, "none")[0].eval(), 1, 4, PROMPT, NEW, hw)
    assert run.mixed is not None and run.mixed.memory is not None
    mine, theirs = _row(cont, "TP1 PP1 DP2", 4), _row(static, "TP1 PP1 DP2", 4)
    assert mine.memory_bytes == run.mixed.memory.peak_bytes
    assert mine.kv_cache_bytes == run.mixed.kv_bytes
    # the cache after the mixed step: 4 sequences x 74 positions (the prompt's 64, the first
    # token, the step's 9) x 4 layers x 4 key/value heads x 32 x 2 bytes, keys and values
    assert mine.kv_cache_bytes == 4 * 74 * 4 * 4 * 32 * 2 * 2
    assert theirs.memory_bytes == max(run.prefill.memory.peak_bytes,  # type: ignore[union-attr]
                                      run.last.memory.peak_bytes)  # type: ignore[union-attr]
    assert mine.memory_bytes < theirs.memory_bytes


def test_the_continuous_largest_batch_fits_and_one_more_does_not(
        plans: tuple[ServePlan, ServePlan]) -> None:
    """Continuous batching's largest batch fits the budget and one more sequence does not; it
    holds more sequences than static batching's, whose prefill holds a whole prompt's
    activations per sequence."""
    static, cont = plans
    for label in ("TP1 PP1 DP2", "TP2 PP1 DP1", "TP1 PP2 DP1"):
        mine = _largest(cont, label)
        assert mine.fits and mine.memory_bytes <= BUDGET
        assert mine.batch > _largest(static, label).batch
    top = _largest(cont, "TP1 PP1 DP2")
    over = _plan(gpus=1, batches=[top.batch + 1], batching="continuous")
    (dropped,) = over.dropped
    assert dropped.batch == top.batch + 1 and not dropped.fits
    assert dropped.memory_bytes > BUDGET and "(mixed)" in (dropped.reason or "")
    assert _largest(over, "TP1 PP1 DP1").batch == top.batch


def test_batching_is_a_serving_option_with_two_values(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(UsageError, match="batching are serving options"):
        flopscope.plan("hf:llama", gpus=2, config=CONFIG, batching="continuous")
    with pytest.raises(UsageError, match="batching must be one of static, continuous, got "
                                         "'dynamic'"):
        _plan(batching="dynamic")
    assert main(["plan", "hf:llama", "--gpus", "2", "--batching", "continuous"]) == 2
    err = capsys.readouterr().err
    assert "--batching applies to --serve only" in err and "Traceback" not in err


def test_cli_plans_continuous_batching(capsys: pytest.CaptureFixture[str],
                                       plans: tuple[ServePlan, ServePlan]) -> None:
    flags = [f for k, v in CONFIG.items() for f in ("--config", f"{k}={v}")]
    argv = ["plan", "hf:llama", "--serve", "--batching", "continuous", "--gpus", "2",
            "--hardware", "h100", "--seq-len", str(PROMPT), "--max-new-tokens", str(NEW),
            "--batch", "1,4", "--memory-budget", "64MiB", *flags]
    assert main(argv) == 0
    out = capsys.readouterr().out
    best = plans[1].best_throughput
    assert best is not None
    assert out.splitlines()[0].endswith(", continuous batching")
    assert f"Best for throughput: {best.label}: {best.tokens_per_s:,.0f} tokens/s" in out
    assert "  a step: " in out and "tok/s/GPU (cont.)" not in out
    assert "Why it wins (tokens/s = sequences in flight / a step's time" in out
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batching"] == "continuous" and data["best_throughput"] == best.label


def test_an_engine_step_computes_a_decode_step_and_leaves_the_model_and_cache_as_transformers_has_them(
        ) -> None:
    """``engine_step`` on a real model: one new token per sequence gives transformers' own
    logits (the kernel's attention without a mask is the same attention for one query; the
    paged writes the same cache); after it the model attends as before and its cache appends
    by ``cat`` again."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from flopscope.llm.engine import engine_step

    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG)
    model = LlamaForCausalLM(config).eval()
    was = model.config._attn_implementation
    prompt, token = torch.randint(512, (2, 5)), torch.randint(512, (2, 1))
    with torch.no_grad():
        theirs, mine = DynamicCache(config=config), DynamicCache(config=config)
        for cache in (theirs, mine):
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
        want = model(input_ids=token, past_key_values=theirs, use_cache=True).logits
        with engine_step(model, mine, 1, 5):
            got = model(input_ids=token, past_key_values=mine, use_cache=True).logits
        torch.testing.assert_close(got, want)
        assert mine.get_seq_length() == 6 and model.config._attn_implementation == was
        assert all("update" not in vars(layer) for layer in mine.layers)
        again = model(input_ids=token, past_key_values=mine, use_cache=True).logits
        torch.testing.assert_close(
            again, model(input_ids=token, past_key_values=theirs, use_cache=True).logits)
    assert mine.get_seq_length() == theirs.get_seq_length() == 7
