"""flopscope.plan(mode="serve") / flopscope plan --serve: serving layouts, their memory (weights
and the KV cache from the simulated decode loop), step times, throughput and latency (issue
31)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.cost import Phase
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES, CallLog, Hardware, get_hardware
from flopscope.estimate.bound import call_row, resolve_tf32
from flopscope.plan import ServePlan, serving
from flopscope.plan.build import build_model
from flopscope.plan.display import plan_html, serve_page_data, serve_text
from flopscope.plan.serve_rows import ServeCandidate, serve_layouts
from flopscope.plan.serve_time import forward_seconds, serve_step_time
from flopscope.plan.space import ModelShape
from flopscope.plan.time_words import validated_on
from flopscope.plan.timing import Links
from flopscope.render.html import embedded_data
from flopscope.render.units import human_bytes, seconds
from flopscope.report.records import CommRecord

# the model of tests/plan/test_plan.py: hidden 256, 8 heads of 32, 4 KV heads, MLP 512, 4 layers,
# vocab 512: 2,623,744 parameters
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
PARAMS = 2_623_744
PROMPT, NEW = 64, 8
BUDGET = 64 * 2**20
SERVE = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=PROMPT, mode="serve",
             max_new_tokens=NEW, batches=[1, 4], memory_budget=BUDGET)


def _kv(batch: int, tp: int, context: int) -> int:
    """The KV cache: keys and values x 4 layers x 4 / tp KV heads x 32 x context x 2 bytes."""
    return 2 * 4 * (4 // tp) * 32 * context * 2 * batch


def _flags() -> list[str]:
    return [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]


@pytest.fixture(scope="module")
def served() -> ServePlan:
    plan = flopscope.plan("hf:llama", **SERVE)
    assert isinstance(plan, ServePlan)
    return plan


def _row(plan: ServePlan, label: str, batch: int) -> ServeCandidate:
    (found,) = [c for c in (*plan.ranked, *plan.dropped)
                if c.layout.label == label and c.batch == batch]
    return found


def test_serving_layouts_are_tp_x_pp_x_replicas() -> None:
    # 8 GPUs, 4 heads, 2 KV heads, 3 layers: tp in 1, 2 (4 does not divide 2 KV heads);
    # pp at most 3 layers: tp 1: pp 1, 2 (4, 8 > 3); tp 2: pp 1, 2
    got = serve_layouts(8, ModelShape(layers=3, heads=4, kv_heads=2, intermediate=512))
    assert [(s.tp, s.pp, s.replicas) for s in got] == [(1, 1, 8), (1, 2, 4), (2, 1, 4),
                                                        (2, 2, 2)]
    assert got[-1].label == "TP2 PP2 DP2"


def test_kv_cache_and_weights_follow_the_arithmetic(served: ServePlan) -> None:
    # at the end of the generation the cache holds the prompt and every new token but the
    # last: 64 + 8 - 1 = 71 positions
    end = PROMPT + NEW - 1
    for label, tp in (("TP1 PP1 DP2", 1), ("TP2 PP1 DP1", 2)):
        for batch in (1, 4):
            assert _row(served, label, batch).kv_cache_bytes == _kv(batch, tp, end)
    assert _row(served, "TP1 PP1 DP2", 1).weights_bytes == PARAMS * 2  # bfloat16
    # TP 2: q/k/v/o and gate/up/down halved, per layer (196,608 + 393,216) / 2 = 294,912 and
    # two norms 512: 295,424 x 4 layers, + embedding and head 131,072 each + final norm 256
    assert _row(served, "TP2 PP1 DP1", 1).weights_bytes == 2 * (295_424 * 4 + 2 * 131_072 + 256)
    # PP 2: stage 1 holds layers 2 and 3 (590,336 each), the norm (256) and the head (131,072);
    # stage 0 the embedding and layers 0, 1: 256 fewer
    stage = _row(served, "TP1 PP2 DP1", 1)
    assert stage.weights_bytes == 2 * (2 * 590_336 + 256 + 131_072)
    assert stage.kv_cache_bytes == _kv(1, 1, end) // 2  # two of the four layers


def test_memory_is_the_simulated_decode_loop() -> None:
    """On one GPU the plan's memory is the peak of flopscope.llm.count_generation's loop with
    the weights registered, but for the previous step's logits that loop keeps alive while
    the next step runs (`out` is reassigned after the call): 1 sequence x 1 position x 512
    words x 2 bytes = 1,024 bytes per sequence. A short prompt and a long generation put the
    peak in the last decode step (its cache of 8 + 40 - 1 = 47 positions)."""
    from flopscope import sources
    from flopscope.estimate import MemoryTracker
    from flopscope.llm import count_generation

    plan = flopscope.plan("hf:llama", **{**SERVE, "gpus": 1, "seq_len": 8, "max_new_tokens": 40,
                                         "batches": [1, 3]})
    assert isinstance(plan, ServePlan)
    for batch in (1, 3):
        row = _row(plan, "TP1 PP1 DP1", batch)
        loaded = sources.load_model("hf:llama", seq_len=8, config=CONFIG, shape_only=True,
                                    dtype="bfloat16")
        tracker = MemoryTracker()
        tracker.register(loaded.model.parameters(), "parameters")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            count_generation(loaded.model, prompt_len=8, new_tokens=40, batch=batch,
                             observers=[tracker])
        loop = tracker.profile()
        assert row.peak_where.endswith("(decode)")
        assert row.memory_bytes == loop.peak_bytes - batch * 512 * 2
        assert row.kv_cache_bytes == _kv(batch, 1, 47)


def test_the_largest_batch_fits_and_one_more_does_not(served: ServePlan) -> None:
    largest = [c for c in served.ranked if c.largest]
    assert {c.layout.label for c in largest} == {"TP1 PP1 DP2", "TP1 PP2 DP1", "TP2 PP1 DP1"}
    for c in largest:
        assert c.fits and c.memory_bytes <= BUDGET and c.batch > 4
    top = _row(served, "TP1 PP1 DP2", max(c.batch for c in largest
                                           if c.layout.label == "TP1 PP1 DP2"))
    over = flopscope.plan("hf:llama", **{**SERVE, "gpus": 1, "batches": [top.batch + 1]})
    assert isinstance(over, ServePlan)
    (dropped,) = over.dropped
    assert dropped.batch == top.batch + 1 and not dropped.fits
    assert dropped.reason is not None and dropped.reason.startswith(
        f"batch {top.batch + 1}: peak {human_bytes(dropped.memory_bytes)} is "
        f"{human_bytes(dropped.memory_bytes - BUDGET)} over the {human_bytes(BUDGET)} budget, at ")
    (fits,) = [c for c in over.ranked if c.largest]
    assert fits.batch == top.batch  # one GPU: the same tensor-parallel rank, the same batch
    # two stages (the cache of every sequence, the activations of one micro-batch): the same
    staged = _row(served, "TP1 PP2 DP1", max(c.batch for c in largest
                                             if c.layout.label == "TP1 PP2 DP1"))
    past = flopscope.plan("hf:llama", **{**SERVE, "tp": 1, "pp": 2,
                                         "batches": [staged.batch + 1]})
    assert isinstance(past, ServePlan)
    assert [(c.batch, c.fits) for c in past.dropped] == [(staged.batch + 1, False)]
    assert [c.batch for c in past.ranked if c.largest] == [staged.batch]


def test_throughput_and_latency(served: ServePlan) -> None:
    for c in served.ranked:
        request = c.prefill.total + (NEW - 1) * c.decode.total
        # replicas x batch x new tokens per request, over 2 GPUs
        assert c.tokens_per_s == pytest.approx(c.layout.replicas * c.batch * NEW / request)
        assert c.tokens_per_s_per_gpu == pytest.approx(c.tokens_per_s / 2)
        for t in (c.prefill, c.decode):
            assert t.total == pytest.approx(t.compute + t.tp_comm + t.p2p + t.host_wait)
            assert t.total == pytest.approx(max(t.host, t.device_only))
        assert (c.decode.tp_comm > 0) == (c.layout.tp > 1)
        assert (c.decode.p2p > 0) == (c.layout.pp > 1)
        # at the bound: 64 positions against 1 (predicted, this small model's steps are both
        # the host's launches, about as many: no order between them)
        assert c.prefill_bound is not None and c.decode_bound is not None
        assert c.prefill_bound.compute > c.decode_bound.compute
    speeds = [c.tokens_per_s for c in served.ranked]
    assert speeds == sorted(speeds, reverse=True)
    assert served.best_throughput is served.ranked[0]
    # the shortest decode step; those within 1% of it are a tie, broken by tokens/s
    least = min(c.decode.total for c in served.ranked)
    assert served.best_latency is max(
        (c for c in served.ranked if c.decode.total <= 1.01 * least),
        key=lambda c: c.tokens_per_s)


def test_latencies_within_one_percent_are_a_tie() -> None:
    from flopscope.plan.serve import shortest

    class Row:  # what shortest reads of a row: its tokens/s (and the latency it is given)
        def __init__(self, latency: float, tokens_per_s: float) -> None:
            self.latency, self.tokens_per_s = latency, tokens_per_s

    rows = [Row(0.0100, 100), Row(0.01005, 300), Row(0.0102, 500)]
    # 10.05 ms is within 1% of 10 ms and serves 3 times the tokens/s; 10.2 ms is 2% over
    assert shortest(rows, lambda r: r.latency) is rows[1]  # type: ignore[arg-type]
    assert shortest([], lambda r: 0.0) is None


def test_a_layout_that_fits_no_batch_is_dropped() -> None:
    # 4 MiB: the whole model's 5.0 MiB of weights fit on no GPU alone; TP 2 (2.75 MiB) and
    # two stages (2.5 MiB) fit with one sequence
    plan = flopscope.plan("hf:llama", **{**SERVE, "memory_budget": 4 * 2**20, "batches": None})
    assert isinstance(plan, ServePlan)
    assert [c.layout.label for c in plan.dropped] == ["TP1 PP1 DP2"]
    assert plan.dropped[0].reason is not None and "largest: parameters 5.00 MiB" in \
        plan.dropped[0].reason
    assert {c.layout.label for c in plan.ranked} == {"TP1 PP2 DP1", "TP2 PP1 DP1"}


def test_cli_serve_table_and_json(capsys: pytest.CaptureFixture[str],
                                  served: ServePlan) -> None:
    argv = ["plan", "hf:llama", "--serve", "--gpus", "2", "--hardware", "h100", "--seq-len",
            str(PROMPT), "--max-new-tokens", str(NEW), "--batch", "1,4", "--memory-budget",
            "64MiB", *_flags()]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("Serving plan: hf:llama on 2 x h100-sxm")
    assert "tok/s/GPU" in out and "KV cache" in out and " (max)" in out
    best = served.best_throughput
    assert best is not None and f"Best for throughput: {best.label}:" in out
    assert "Best for latency: " in out
    # why it wins: the best row of another layout, its sequences in flight and request time
    rival = next(c for c in served.ranked if c.layout.label == "TP2 PP1 DP1")
    request = rival.prefill.total + (NEW - 1) * rival.decode.total
    why = out.split("Why it wins")[1]
    assert f"  {rival.label}: {rival.tokens_per_s:,.0f} tokens/s (" in why
    assert f"{rival.batch:,} sequences in flight" in why  # one replica
    assert f"a request {seconds(request)}" in why
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "serve" and data["max_new_tokens"] == NEW
    assert data["best_throughput"] == best.label
    first = data["ranked"][0]
    assert set(first) >= {"tp", "pp", "replicas", "batch", "largest_batch", "weights_bytes",
                          "kv_cache_bytes", "time_to_first_token_s", "latency_per_token_s",
                          "tokens_per_s", "tokens_per_s_per_gpu"}
    # the shipped H100's reference calibration: predicted, the bound beside, the error bar's
    # source and what it was measured on
    assert data["time_model"] == "prediction" and first["time_kind"] == "prediction"
    assert data["prediction"]["validated_on"] == validated_on(get_hardware("h100").calibration)
    assert data["prediction"]["error_bars"]["total"] == get_hardware("h100").calibration\
        .error_bars["total"]
    assert best.decode_bound is not None
    assert first["latency_per_token_bound_s"] == best.decode_bound.total
    assert first["tokens_per_s_bound"] == best.tokens_per_s_bound
    table = out.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("#  layout"))
    assert table[head].endswith("tok/s/GPU  per token (bound)  tok/s/GPU (bound)  "
                                "tok/s/GPU (cont.)")
    # the best row ends with its bound (the latency per token and tokens/s per GPU), then its
    # tokens/s per GPU with continuous batching
    assert best.continuous is not None
    assert table[head + 2].split()[-4:] == [*seconds(best.decode_bound.total).split(),
                                            f"{best.tokens_per_s_per_gpu_bound:,.0f}",
                                            f"{best.continuous.tokens_per_s / 2:,.0f}"]
    cont = first["continuous_batching"]
    assert cont["tokens_per_s"] == best.continuous.tokens_per_s and cont["chunk_tokens"] == 9
    most = max(data["ranked"], key=lambda r: r["continuous_batching"]["tokens_per_s"])
    assert data["best_continuous"] == f"{most['layout']} batch {most['batch']}"
    assert f"Best with continuous batching (chunked prefill, 9 tokens per sequence per step): " \
        f"{data['best_continuous']}: " in out
    note = next(line for line in table if line.startswith("1st token, per token, tok/s: "))
    assert f"+-{100 * data['prediction']['error_bars']['total']:.0f}% (90th percentile" in note
    assert validated_on(get_hardware("h100").calibration) in note


@pytest.mark.parametrize(("argv", "message"), [
    (["--serve", "--global-batch", "8"], "--global-batch does not apply to --serve"),
    (["--serve", "--checkpointing", "none"], "--checkpointing does not apply to --serve"),
    (["--max-new-tokens", "8"], "--max-new-tokens applies to --serve only"),
    (["--batch", "4"], "--batch does not apply to a training plan"),
    (["--serve", "--batch", "4,x"], "expected a whole number, got 'x'"),
])
def test_cli_serve_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                                message: str) -> None:
    assert main(["plan", "hf:llama", "--gpus", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_api_refuses_mixed_options() -> None:
    with pytest.raises(UsageError, match="mode must be 'train' or 'serve', got 'infer'"):
        flopscope.plan("hf:llama", gpus=1, mode="infer")
    with pytest.raises(UsageError, match="max_new_tokens, batches and batching are serving options"):
        flopscope.plan("hf:llama", gpus=1, max_new_tokens=8)
    with pytest.raises(UsageError, match="does not take global_batch"):
        flopscope.plan("hf:llama", gpus=1, mode="serve", global_batch=8, config=CONFIG)


def test_cli_serve_html_explains_why_the_best_wins(capsys: pytest.CaptureFixture[str],
                                                   served: ServePlan, tmp_path: Path) -> None:
    """The serving page carries the table's "Why it wins" (it had the dropped rows' reasons but
    not this): the same lines, and the words they are read by."""
    argv = ["plan", "hf:llama", "--serve", "--gpus", "2", "--hardware", "h100", "--seq-len",
            str(PROMPT), "--max-new-tokens", str(NEW), "--batch", "1,4", "--memory-budget",
            "64MiB", *_flags()]
    page = tmp_path / "serve.html"
    assert main([*argv, "--format", "html", "--output", str(page)]) == 0
    data = embedded_data(page.read_text(encoding="utf-8"))
    assert main(argv) == 0
    text = capsys.readouterr().out
    why = data["explain"]["why"]
    rival = next(c for c in served.ranked if c.layout.label == "TP2 PP1 DP1")
    assert any(line.startswith(f"{rival.label}: {rival.tokens_per_s:,.0f} tokens/s (")
               for line in why)
    assert all(f"\n  {line}\n" in text for line in why)
    assert data["explain"]["why_title"] == (
        "Why it wins (tokens/s = sequences in flight x new tokens / a request's time; the best "
        "of each other layout)")
    assert data["explain"]["why_title"] + ":\n" in text
    # plan_html draws a ServePlan from Python with the same data
    ours = embedded_data(plan_html(served))
    for key in ("seconds", "simulations"):
        ours.pop(key), data.pop(key)
    assert ours == data


def test_a_sweep_page_explains_each_plan(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """A sweep's page draws a point's plan on a click, with the same words as a plan's page."""
    page = tmp_path / "sweep.html"
    assert main(["plan", "hf:llama", "--serve", "--gpus", "1,2", "--hardware", "h100",
                 "--seq-len", str(PROMPT), "--max-new-tokens", str(NEW), "--batch", "1,4",
                 "--memory-budget", "64MiB", *_flags(), "--format", "html", "--output",
                 str(page)]) == 0
    points = embedded_data(page.read_text(encoding="utf-8"))
    assert [p["gpus"] for p in points] == [1, 2]
    two = flopscope.plan("hf:llama", **SERVE)
    assert isinstance(two, ServePlan)
    assert points[1]["plan"]["explain"] == serve_page_data(two)["explain"]
    assert points[1]["plan"]["explain"]["why"]


def _per_call(log: CallLog, hw: Hardware) -> tuple[float, float]:
    """A forward's predicted (device, host) seconds from its calls one by one, on a GPU's
    calibration: the device's sum (each call's prediction less its host part) and the host's,
    summed in the calls' order as the estimate sums them."""
    rows = [call_row(r, hw, *resolve_tf32(None)) for r in log.records]
    host = sum(r.host_s for r in rows)
    return sum(r.predicted_s for r in rows) - host, host


def test_predicted_steps_are_the_predictor_calls_and_the_bound_is_beside(
        served: ServePlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's decode step on the shipped H100 (its reference calibration) is the mean of
    the first and last decode steps' per-call predictions; its prefill the prefill's."""
    hw = get_hardware("h100")
    assert hw.calibration is not None and hw.calibration.device.startswith("cuda")
    logs: list[CallLog] = []

    class Kept(CallLog):  # every forward's log, in order
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            logs.append(self)

    monkeypatch.setattr(serving, "CallLog", Kept)
    build = build_model("hf:llama", PROMPT, "bfloat16", CONFIG)
    run = serving.simulate_serving(lambda: build(1, "none")[0].eval(), 2, 4, PROMPT, NEW, hw)
    # the prefill, the first decode, the catch-up, the last, then continuous batching's mixed
    # step (ceil((64 + 8 - 1) / 8) = 9 tokens per sequence)
    prefill, first, _, last, mixed = logs
    (d1, h1), (d2, h2) = _per_call(first, hw), _per_call(last, hw)
    assert forward_seconds(run.first.estimate) == max(h1, d1)
    c = _row(served, "TP2 PP1 DP1", 4)
    # decode: (first + last) / 2, to the bit: the device's compute and the host's apart
    assert c.decode.kind == c.prefill.kind == "prediction"
    assert (c.decode.compute, c.decode.host) == ((d1 + d2) / 2, (h1 + h2) / 2)
    assert (c.prefill.compute, c.prefill.host) == _per_call(prefill, hw)
    # each step the longer of the host's time and the device's work with its all-reduces
    # (one stage: no sends), the all-reduces on the device's stream while the host issues on
    t = c.decode.tp_comm
    assert t > 0
    assert c.decode.total == (max(h1, d1 + t) + max(h2, d2 + t)) / 2
    assert c.decode.host_wait == pytest.approx(c.decode.total - (c.decode.compute + t))
    # the bound beside it: the roofline times of the same calls
    assert c.decode_bound is not None and c.prefill_bound is not None
    assert c.decode_bound.kind == "bound"
    assert c.decode_bound.compute == (run.first.estimate.total.time_s
                                      + run.last.estimate.total.time_s) / 2
    assert c.decode_bound.tp_comm == c.decode.tp_comm
    request = c.prefill_bound.total + (NEW - 1) * c.decode_bound.total
    assert c.tokens_per_s_bound == pytest.approx(c.layout.replicas * 4 * NEW / request)
    assert c.tokens_per_s_per_gpu_bound == pytest.approx(c.tokens_per_s_bound / 2)
    # continuous batching: the mixed step's calls, a token per sequence per step
    cont = c.continuous
    assert cont is not None and cont.chunk == 9 and cont.step.kind == "prediction"
    assert (cont.step.compute, cont.step.host) == _per_call(mixed, hw)
    assert run.mixed is not None and run.mixed.tokens == 4 * 9
    assert run.mixed.context == PROMPT + 1 + 9  # on the cache after the first token
    assert cont.tokens_per_s == c.layout.replicas * 4 / cont.step.total
    assert cont.step_bound is not None
    assert cont.step_bound.compute == run.mixed.estimate.total.time_s
    assert cont.tokens_per_s_bound == c.layout.replicas * 4 / cont.step_bound.total


def test_the_bound_is_the_datasheet_profiles_plan_to_the_bit(served: ServePlan) -> None:
    """The datasheet H100 (no calibration) plans with the bound alone: its times are the
    calibrated plan's bound beside, to the bit (main's serving plan, before the prediction)."""
    bound = flopscope.plan("hf:llama", **{**SERVE, "hardware": PROFILES["h100-sxm"]})
    assert isinstance(bound, ServePlan)
    assert bound.to_dict()["time_model"] == "roofline lower bound"
    assert bound.to_dict()["prediction"] is None
    # the bound has no host time: nothing is host-bound, no choice without the host
    assert bound.best_latency_without_host is None
    assert bound.to_dict()["best_latency_without_host"] is None
    mine = {c.label: c for c in (*served.ranked, *served.dropped)}
    assert {c.label for c in (*bound.ranked, *bound.dropped)} == set(mine)
    for c in (*bound.ranked, *bound.dropped):
        assert c.decode.kind == "bound" and c.decode_bound is None
        assert c.to_dict()["latency_per_token_bound_s"] is None
        predicted = mine[c.label]
        assert (c.prefill, c.decode) == (predicted.prefill_bound, predicted.decode_bound)
        assert c.tokens_per_s == predicted.tokens_per_s_bound
        assert c.memory_bytes == predicted.memory_bytes


def test_a_host_bound_step_runs_its_collectives_while_the_device_waits() -> None:
    """On a GPU's prediction a serving step is the longer of the host's time and the device's
    work with its all-reduces and sends (the host issues them without waiting: kernels on the
    device's stream); the all-reduces are not added on top of a host-bound step."""
    links = Links.of(get_hardware("h100"), 8, 8)
    # 10 ms of host, 2 ms of device work, no collectives: host-bound by 8 ms
    t = serve_step_time(0.002, (), 0, 1, 1, links, "prediction", host=0.010, calls=1000)
    assert (t.total, t.host_wait, t.device_only, t.calls) == (0.010, 0.010 - 0.002, 0.002, 1000)
    # 1 ms of host: the device's 2 ms, nothing waited
    t = serve_step_time(0.002, (), 0, 1, 1, links, "prediction", host=0.001)
    assert (t.total, t.host_wait) == (0.002, 0.0)
    # one all-reduce of 8 KiB on 8 ranks: its seconds on the device's side, hidden under a
    # host of 10 ms, exposed under a host of 0 (the bound's)
    ar = (CommRecord("m", Phase.FORWARD, "all_reduce", 8, 1, 8192, 14336, "tp"),)
    comm = links.seconds(list(ar), 8)
    assert comm > 0
    t = serve_step_time(0.002, ar, 0, 8, 1, links, "prediction", host=0.010)
    assert (t.tp_comm, t.total, t.host_wait) == (comm, 0.010, 0.010 - (0.002 + comm))
    t = serve_step_time(0.002, ar, 0, 8, 1, links)
    assert (t.total, t.host_wait, t.host) == (0.002 + comm, 0.0, 0.0)


def test_the_best_for_latency_says_it_is_host_bound(served: ServePlan) -> None:
    """The test model's decode step on the shipped H100 is host-bound (a few hundred tiny
    calls): the best row for latency says so, with its host's and device's figures, what takes
    the host's time away, and the best for latency at the device's time alone."""
    best = served.best_latency
    assert best is not None
    d = best.decode
    assert best.host_bound and d.host > d.device_only > 0
    # both decode steps host-bound: each step is its host's time, so their mean is the
    # host's mean to the bit
    assert d.total == d.host
    assert d.calls == best.to_dict()["decode_calls"] > 0
    alone = served.best_latency_without_host
    assert alone is min(served.ranked, key=lambda c: (c.decode.device_only, -c.tokens_per_s))
    text = serve_text(served)
    assert (f"  host-bound: the host issues its {d.calls:,.0f} operator calls in "
            f"{seconds(d.host)} ({seconds(d.host / d.calls)} each), the device's work takes "
            f"{seconds(d.device_only)}: CUDA graphs or torch.compile (mode='reduce-overhead') "
            "take the host's time per call away") in text
    assert alone is not None
    assert (f"  at the device's time alone: {seconds(d.device_only)} per token here; the "
            + ("best for latency stays this layout" if alone is best else
               f"best for latency would be {alone.label}, "
               f"{seconds(alone.decode.device_only)} per token")) in text
    data = served.to_dict()
    assert data["best_latency_without_host"] == alone.label
    (row,) = [r for r in data["ranked"] if f"{r['layout']} batch {r['batch']}" == best.label]
    assert row["host_bound"] is True
    assert row["latency_per_token_without_host_s"] == d.device_only
    assert row["decode_step_s"]["host_wait"] == d.host_wait > 0


def test_prompt_defaults_to_the_sources_token_ids() -> None:
    # without --seq-len the prompt is the source's 128 token ids (given as the input_ids
    # keyword, which the plan did not read: it simulated prompts of 0 tokens and failed inside
    # the model's attention)
    plan = flopscope.plan("hf:llama", gpus=1, hardware="h100", config=CONFIG, mode="serve",
                          max_new_tokens=2, batches=[1], memory_budget=BUDGET)
    assert isinstance(plan, ServePlan)
    assert plan.prompt == 128
    (row,) = [c for c in plan.ranked if c.batch == 1]
    # the cache after the last decode step: 128 + 2 - 1 positions
    assert row.kv_cache_bytes == _kv(1, 1, 129)


def test_a_model_without_llama_style_layers_is_served_without_tensor_parallelism() -> None:
    from flopscope.estimate import PROFILES as profiles
    from flopscope.plan.sweeps import role_tasks

    # Phi-3 fuses its projections (qkv_proj, gate_up_proj): the standard tensor-parallel plan
    # does not apply, so its serving layouts are tp 1 (it failed inside the simulation of the
    # first TP2 role, after the TP1 roles had run)
    phi3 = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=4, pad_token_id=0)
    plan = flopscope.plan("hf:phi3", gpus=2, hardware="h100", config=phi3, mode="serve",
                          seq_len=16, max_new_tokens=2, batches=[1], memory_budget=BUDGET)
    assert isinstance(plan, ServePlan)
    assert {c.layout.label for c in plan.ranked} == {"TP1 PP1 DP2", "TP1 PP2 DP1"}
    assert any(n.startswith("served without tensor parallelism: Phi3DecoderLayer has no "
                            "self_attn.q_proj") for n in plan.notes)
    with pytest.raises(UsageError, match="served without tensor parallelism: --tp 2"):
        flopscope.plan("hf:phi3", gpus=2, hardware="h100", config=phi3, mode="serve", tp=2)
    tasks = role_tasks("hf:phi3", gpus=2, hardware=profiles["h100-sxm"], mode="serve",
                       config=phi3, seq_len=16, batches=[1], max_new_tokens=2)
    assert {t.serve[0] for t in tasks} == {1}


def test_pipeline_stages_keep_a_micro_batch_each_in_flight(served: ServePlan) -> None:
    from flopscope.estimate.bound import Row
    from flopscope.plan.serve_time import ServeTime, forward_parts, micro_batch, row_seconds

    # TP1 PP2 at batch 4: two micro-batches of 2 sequences in flight, one per stage; a round
    # (each sequence one token) is each stage running both micro-batches, so the slower stage's
    # time twice: the whole model's forward at batch 2 times the stages' pace (1 were they
    # even), the prefill a micro-batch's and the slower stage's again for the second's; the
    # memory is the whole batch's (before, the batch passed the stages in turn: the forward at
    # batch 4)
    assert micro_batch(4, 2) == 2 and micro_batch(5, 2) == 3 and micro_batch(1, 4) == 1
    hw = get_hardware("h100")
    build = build_model("hf:llama", PROMPT, "bfloat16", CONFIG)
    run = serving.simulate_serving(lambda: build(1, "none")[0].eval(), 1, 2, PROMPT, NEW, hw)
    links = Links.of(hw, 2, 8)

    def step(s: serving.ServeStep) -> ServeTime:
        compute, host = forward_parts(s.estimate)
        return serve_step_time(compute, s.communication, s.boundary_bytes, 1, 2, links,
                               "prediction", host=host, calls=s.estimate.total.calls)

    def pace(s: serving.ServeStep) -> float:
        """2 x the slower stage's time over the two stages' sum: the first stage the embedding
        (and the model's own calls) and layers 0-1, the second layers 2-3, the norm, the head."""
        before, l0, l1, l2, l3, after = s.parts
        times = []
        for parts in ((before, l0, l1), (l2, l3, after)):
            row = Row()
            for part in parts:
                row.add(part)
            times.append(row_seconds(row, s.estimate))
        return 2 * max(times) / sum(times)

    # every call of a forward is in one part; the head's in the last stage's
    for s in (run.prefill, run.first, run.last):
        assert sum(p.calls for p in s.parts) == s.estimate.total.calls
        assert sum(p.flops for p in s.parts) == s.estimate.total.flops
        assert s.parts[-1].flops >= s.estimate.by_module["lm_head"].flops > 0
    assert pace(run.first) > 1  # the stages are uneven: the head is the second's
    c = _row(served, "TP1 PP2 DP1", 4)
    assert c.to_dict()["micro_batch"] == 2 and _row(served, "TP1 PP1 DP2", 4).to_dict()[
        "micro_batch"] == 4
    assert c.decode == ServeTime.mean(step(run.first).scaled(pace(run.first)),
                                      step(run.last).scaled(pace(run.last)))
    # the first micro-batch's prefill, then the second's a slower stage's prefill behind
    assert c.prefill.total == pytest.approx((1 + pace(run.prefill) / 2) * step(run.prefill).total,
                                            rel=1e-12)
    assert c.tokens_per_s == pytest.approx(4 * NEW / (c.prefill.total + (NEW - 1) * c.decode.total),
                                           rel=1e-12)
    # the KV cache of all 4 sequences, half the layers on the fuller stage:
    # 2 layers x 2 (keys, values) x 4 KV heads x 32 x (64 + 8 - 1) x 2 bytes x 4
    assert c.kv_cache_bytes == _kv(4, 1, PROMPT + NEW - 1) // 2
    # the stage's peak: its weights, its layers' cache of the 4 sequences, and the activations
    # of one micro-batch (the batch-2 role's rest above its weights and cache at that step),
    # at the fuller of the prefill and the last decode step
    def rest(s: serving.ServeStep) -> int:
        assert s.memory is not None
        return s.memory.peak_bytes - run.weight_bytes - s.kv_bytes

    assert c.memory_bytes == c.weights_bytes + max(
        _kv(4, 1, PROMPT) // 2 + rest(run.prefill), _kv(4, 1, PROMPT + NEW - 1) // 2 + rest(run.last))


def test_the_largest_batch_with_micro_batches_is_exact() -> None:
    import math

    from flopscope.plan.serve_memory import _most

    # the memory above batch 1: the cache kv per sequence, the activations act per sequence
    # of one micro-batch of ceil(B / pp); the largest batch within the room, against every B
    def brute(room: int, kv: int, act: int, pp: int) -> int:
        return max([b for b in range(1, 301)
                    if kv * (b - 1) + act * (math.ceil(b / pp) - 1) <= room], default=0)

    for pp in (1, 2, 3, 4, 8):
        for kv in ((0,) if pp == 1 else (0, 1, 7, 40)):
            for act in (0, 3, 25, 64):
                for room in (-1, 0, 5, 99, 640, 2047):
                    assert _most(room, kv, act, pp, 300) == brute(room, kv, act, pp), (
                        room, kv, act, pp)
    # 2 stages, 100 bytes of cache and 60 of activations per sequence, 1,000 bytes of room:
    # B = 7 (micro-batches of 4): 600 + 180 = 780; B = 8: 700 + 180 = 880; B = 9: 800 + 240
    assert _most(1000, 100, 60, 2, 300) == 8


def test_a_gpt2_is_served_without_tensor_parallelism_and_its_tied_head_counted_once() -> None:
    # GPT-2's layers are transformer.h (no Llama projections; its config has no intermediate
    # size): served at tp 1. Parameters: wte 512 x 64 (32,768, the head tied to it), wpe 256 x 64
    # (16,384), per layer ln_1 128 + c_attn 64 x 192 + 192 + attn c_proj 64 x 64 + 64 + ln_2 128
    # + c_fc 64 x 256 + 256 + mlp c_proj 256 x 64 + 64 = 49,984, 2 layers, ln_f 128: 149,248,
    # 2 bytes each. A simulated rank counted the tied head twice (Module.to_empty unties
    # weights: a new parameter per name), 65,536 bytes more
    gpt2 = dict(vocab_size=512, n_positions=256, n_embd=64, n_layer=2, n_head=4)
    plan = flopscope.plan("hf:gpt2", gpus=2, hardware="h100", config=gpt2, mode="serve",
                          seq_len=16, max_new_tokens=2, batches=[1], memory_budget=BUDGET)
    assert isinstance(plan, ServePlan)
    rows = {c.layout.label: c for c in plan.ranked if c.batch == 1}
    assert set(rows) == {"TP1 PP1 DP2", "TP1 PP2 DP1"}
    assert rows["TP1 PP1 DP2"].weights_bytes == 2 * 149_248
    # two stages: the first the embeddings and layer 0, the second layer 1, ln_f and the head
    # (a copy of wte): 32,768 + 16,384 + 49,984 and 49,984 + 128 + 32,768
    assert rows["TP1 PP2 DP1"].weights_bytes == 2 * max(99_136, 82_880)
    assert any(n.startswith("served without tensor parallelism: GPT2Block has no")
               for n in plan.notes)


def test_the_mixed_step_sits_at_the_generations_middle_and_moves_no_other_step() -> None:
    """Continuous batching's mixed step, last: every sequence adds ceil((64 + 32 - 1) / 32) = 3
    tokens to the cache's first 65 + (32 - 3 - 3) // 2 = 78 positions, its keys centred on the
    loop's mean context 64 + 31 / 2 (78 before it, 81 after); the decode steps see 65 and 95
    keys; its per-token work (the MLP's products and activation) is 3 times a decode step's to
    the FLOP."""
    hw = get_hardware("h100")
    build = build_model("hf:llama", PROMPT, "bfloat16", CONFIG)
    run = serving.simulate_serving(lambda: build(1, "none")[0].eval(), 2, 4, PROMPT, 32, hw)
    assert run.mixed is not None
    assert (run.first.context, run.mixed.context, run.last.context) == (65, 81, 95)
    assert run.mixed.tokens == 4 * 3
    mlp = [s.estimate.by_module["model.layers.0.mlp"].flops
           for s in (run.first, run.mixed, run.last)]
    # a TP2 rank's MLP per token: gate, up (256 -> 256 each) and down (256 -> 256), 2 x 3 x
    # 256 x 256 = 393,216 FLOPs, SiLU (5 FLOPs) and the product (1) of 256 elements, 1,536
    assert mlp == [4 * 394_752, 12 * 394_752, 4 * 394_752]
    assert serving.mixed_chunk(64, 32) == 3 and serving.mixed_chunk(64, 1) == 64
    # its attention is a serving engine's: no mask built, no copy of the cache per query
    # group (transformers' SDPA path with a mask copies each layer's keys and values,
    # aten.clone; the decode steps need neither); the keys and values read once: a rank's 2
    # key/value heads x 81 keys x 32 x 2 bytes, keys and values, 4 sequences, 4 layers (with
    # transformers' own path: 4 query heads' worth)
    ops = run.mixed.estimate.by_op
    assert "aten.clone.default" not in ops and "aten.clone.default" not in (
        run.last.estimate.by_op)
    (attention,) = [r for op, r in ops.items() if "scaled_dot_product" in op]
    assert attention.calls == 4
    q = 4 * 4 * 3 * 32 * 2  # the queries: 4 sequences x 4 heads x 3 tokens x 32, bfloat16
    lse = 4 * 4 * 3 * 4  # the kernel's log-sum-exp per query and head, float32
    assert attention.bytes == 4 * (2 * (4 * 2 * 81 * 32 * 2) + 2 * q + lse)  # + the output
    # and its cache's writes are a paged cache's: the 3 new positions of each layer's keys and
    # values copied into room kept for them (4 sequences x 2 heads x 3 x 32 x 2 bytes = 1,536;
    # a copy's bytes are its inputs', the destination and the source, and its output's: 3 x),
    # where the decode steps' DynamicCache appends by cat, a copy of the whole layer's cache
    last = run.last.estimate.by_op
    assert ops["aten.copy_.default"].calls == 8 and "aten.copy_.default" not in last
    assert ops["aten.copy_.default"].bytes == 8 * 3 * 1_536
    assert ops["aten.cat.default"].calls == last["aten.cat.default"].calls - 8


def test_a_decoder_is_found_by_its_layers_not_their_attribute_name() -> None:
    """GPT-NeoX keeps its layers at ``gpt_neox.layers``, none of the usual paths: the layer
    list is the shallowest module list as long as the config's layers, so it is served (at
    tp 1: its fused projections take no standard plan), with stages too."""
    from flopscope.distributed.repeat import layer_list

    neox = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4)
    build = build_model("hf:gpt_neox", 64, "bfloat16", neox)
    found = layer_list(build(1, "none")[0])
    assert found is not None and found[0] == "gpt_neox.layers" and len(found[1]) == 2
    plan = flopscope.plan("hf:gpt_neox", gpus=2, hardware="h100", seq_len=64, mode="serve",
                          max_new_tokens=16, batches=[1], memory_budget=256 * 2**20,
                          config=neox)
    assert isinstance(plan, ServePlan)
    assert {c.layout.label for c in plan.ranked} == {"TP1 PP1 DP2", "TP1 PP2 DP1"}
    one, two = _row(plan, "TP1 PP1 DP2", 1), _row(plan, "TP1 PP2 DP1", 1)
    assert two.weights_bytes < one.weights_bytes  # each stage holds its own layers
