"""The decode validation's comparison (benchmarks/decode_validation.py) and the words that
quote its figures (flopscope.estimate.decode_validation, plan.time_words, generate)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import decode_validation as dv  # noqa: E402
from benchmarks.prediction_validation import ratio_stats  # noqa: E402

from flopscope.estimate import get_hardware  # noqa: E402
from flopscope.estimate.decode_validation import (  # noqa: E402
    FORWARDS,
    decode_figures,
    serving_validated_on,
    step_words,
)

PROFILE = Path(__file__).parents[1] / "benchmarks" / "results" / "prediction_profile.json"


def _steps(*pairs: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"kind": k, "predicted_s": s} for k, s in pairs]


def test_compare_takes_each_step_s_median_over_the_passes() -> None:
    predicted = _steps(("prefill", 22.0), ("decode", 4.0), ("decode", 5.0), ("decode", 6.0))
    passes = [[10.0, 4.0, 5.0, 6.0], [12.0, 5.0, 5.0, 8.0], [11.0, 6.0, 4.0, 7.0]]
    out = dv.compare(predicted, passes)
    # per step, the median of (10, 12, 11), (4, 5, 6), (5, 5, 4), (6, 8, 7)
    assert out["measured_steps_s"] == [11.0, 5.0, 5.0, 7.0]
    assert out["prefill"] == {"measured_s": 11.0, "predicted_s": 22.0, "ratio": 22.0 / 11.0}
    # decode: median predicted (4, 5, 6) = 5 over median measured (5, 5, 7) = 5
    assert out["decode"] == {"measured_s": 5.0, "predicted_s": 5.0, "ratio": 1.0}
    # the mean: 15 / 3 over 17 / 3
    assert out["decode_mean"]["ratio"] == statistics.fmean([4.0, 5.0, 6.0]) / statistics.fmean(
        [5.0, 5.0, 7.0])
    assert out["first"]["ratio"] == 4.0 / 5.0 and out["last"]["ratio"] == 6.0 / 7.0
    # the cache's growth, first to last decode step: 7 - 5 measured, 6 - 4 predicted
    assert out["growth"] == {"measured_s": 2.0, "predicted_s": 2.0}


def test_compare_of_a_prefill_alone_has_no_decode_figures() -> None:
    out = dv.compare(_steps(("prefill", 3.0)), [[2.0], [4.0]])
    assert out["prefill"]["ratio"] == 3.0 / 3.0 and "decode" not in out and "growth" not in out


def test_compare_refuses_passes_of_another_length_and_a_first_step_not_the_prefill() -> None:
    with pytest.raises(ValueError, match=r"2 predicted steps against passes of \[2, 3\]"):
        dv.compare(_steps(("prefill", 1.0), ("decode", 1.0)), [[1.0, 1.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="the first step is a decode, not the prefill"):
        dv.compare(_steps(("decode", 1.0), ("decode", 1.0)), [[1.0, 1.0]])


def test_summarize_splits_prefill_decode_and_batches() -> None:
    rows = [{"batch": b, **dv.compare(_steps(("prefill", p), ("decode", d), ("decode", d)),
                                      [[1.0, 1.0, 1.0]])}
            for b, p, d in ((1, 1.1, 0.5), (1, 0.9, 0.7), (8, 1.3, 1.2))]
    out = dv.summarize(rows)
    # every measured step is 1.0: the ratios are the predicted seconds
    assert out["prefill"] == ratio_stats([1.1, 0.9, 1.3])
    assert out["decode"] == ratio_stats([0.5, 0.7, 1.2])
    assert out["decode, batch 1"] == ratio_stats([0.5, 0.7])
    assert out["decode, batch 8"] == ratio_stats([1.2])
    # |0.5 - 1|, |0.7 - 1|, |1.2 - 1| = 0.5, 0.3, 0.2: median 0.3, nearest-rank 90th 0.5
    assert out["decode"]["median_abs_error"] == pytest.approx(0.3, abs=1e-12)
    assert out["decode"]["p90_abs_error"] == 0.5


def _tiny() -> Any:
    from benchmarks.models import llama_config

    return llama_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                        use_cache=True)


def test_a_tiny_decoder_s_generation_predicted_and_measured() -> None:
    """One workload end to end on a tiny Llama: the steps the count predicts are the steps
    the loop times, and the prediction is the one ``flopscope generate`` reports."""
    from flopscope.cli.generate import estimate_summary
    from flopscope.llm import count_generation
    from flopscope.llm.generate import StepLogs

    hw = get_hardware(str(PROFILE))
    w = dv.Workload("tiny", 2, 5, 4)
    torch.set_num_threads(1)
    # the first count of a process predicts its prefill 0.03% apart from every later one (a
    # one-time effect, not the benchmark's): count once before the two compared
    dv.predict(_tiny(), w, hw)
    row = dv.one("tiny", _tiny(), w, hw, repeat=2, threads=1)
    assert [p["kind"] for p in row["predicted"]] == ["prefill", "decode", "decode", "decode"]
    # decode step j attends the prompt's 5 keys and j more
    assert [p["context"] for p in row["predicted"]] == [5, 6, 7, 8]
    assert len(row["passes_s"]) == 2 and all(len(p) == 4 for p in row["passes_s"])
    assert all(t > 0 for p in row["passes_s"] for t in p)
    logs = StepLogs()
    result = count_generation(dv.build(_tiny(), "meta"), prompt_len=5, new_tokens=4, batch=2,
                              shape_only=True, observers=[logs])
    summary = estimate_summary(result, logs.estimates(hw))["prediction"]
    assert row["prefill"]["predicted_s"] == summary["prefill_s"]
    assert row["decode_mean"]["predicted_s"] == pytest.approx(summary["decode_step_s"],
                                                              rel=1e-12)
    assert row["prefill"]["ratio"] == row["prefill"]["predicted_s"] / row["prefill"][
        "measured_s"]


def test_a_decode_step_s_diagnosis_splits_the_same_prediction_per_operator() -> None:
    """benchmarks/decode_diagnosis on a tiny Llama: the operators' predictions add up to the
    step's, the operators the count saw were timed in the step, and the step's measured time
    is its calls' plus the time outside them."""
    from benchmarks.decode_diagnosis import diagnose

    hw = get_hardware(str(PROFILE))
    torch.set_num_threads(1)
    r = diagnose("tiny", _tiny(), 2, 5, 2, hw)
    assert r["predicted_s"] == pytest.approx(sum(o["predicted_s"] for o in r["ops"].values()),
                                             rel=1e-9)
    assert r["predicted_s"] == pytest.approx(
        sum(f["predicted_s"] for f in r["families"].values()), rel=1e-9)
    timed = {op for op, o in r["ops"].items() if o["calls"] and o["family"] != "view"}
    assert timed and all(r["ops"][op]["measured_s"] > 0 for op in timed)
    assert r["in_calls_s"] + r["outside_calls_s"] == pytest.approx(r["measured_s"])
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in r["ops"]


def test_repredicted_compares_the_same_measurements_with_another_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--repredict: a results file's measured steps against a profile's predictions, no timing;
    the run's own profile gives the run's figures, and without its product points the
    prediction of every step changes."""
    hw = get_hardware(str(PROFILE))
    monkeypatch.setitem(dv.DECODERS, "tiny", _tiny)
    torch.set_num_threads(1)
    w = dv.Workload("tiny", 2, 5, 3)
    dv.predict(_tiny(), w, hw)  # the first count of a process (above)
    row = dv.one("tiny", _tiny(), w, hw, repeat=1, threads=1)
    data = {"rows": [row]}
    again = dv.repredicted(data, hw)["rows"][0]
    assert again["measured_steps_s"] == row["measured_steps_s"]
    assert again["decode"]["ratio"] == pytest.approx(row["decode"]["ratio"], rel=1e-9)
    less = dv.repredicted(data, hw, without="mm ")["rows"][0]
    assert all(a != b for a, b in zip(less["predicted_steps_s"], again["predicted_steps_s"],
                                      strict=True))


def test_the_timed_loop_decodes_with_its_cache() -> None:
    """Each timed call after the first feeds one token per sequence: the cache carries the
    prompt (a loop that lost its cache would time prefills of one token, none slower)."""
    ticks = iter(range(100))
    model = dv.build(_tiny(), "cpu")
    times = dv.decode_pass(model, 3, 7, 5, timer=lambda: float(next(ticks)))
    assert times == [1.0] * 5  # two ticks per step: start and end


def _data() -> dict[str, Any]:
    rows = [{"model": m, "batch": b, "prompt": p, "load_before": lb, "load_after": la,
             **dv.compare(_steps(("prefill", 1.0), ("decode", 2.0)), [[1.0, 1.0]])}
            for m, b, p, lb, la in (("a", 1, 16, 1.5, 2.0), ("b", 8, 512, 0.5, 3.0))]
    return {"device_kind": "cpu", "device": "cpu (x86_64)", "calibrated": "2026-11-28T17:38",
            "date": "2026-11-28 18:00 UTC", "threads": 1, "clock": "thread CPU time",
            "rows": rows, "summary": dv.summarize(rows), "load": [0.5, 3.0]}


def test_shipped_figures_and_their_words() -> None:
    shipped = dv.shipped(_data())["cpu"]
    assert shipped["workloads"] == 2 and shipped["models"] == ["a", "b"]
    assert shipped["batches"] == [1, 8] and shipped["prompts"] == [16, 512]
    assert shipped["load"] == [0.5, 3.0] and shipped["date"] == "2026-11-28"
    # prefill 1.0 / 1.0: no error; decode 2.0 / 1.0: 100% on both
    words = step_words(shipped)
    assert words == ("2026-11-28, 1 thread(s), 2 generations of 2 small decoders at batch 1 "
                     "and 8, prompts 16-512, load 0.5-3.0: prefill median error 0%, 90th "
                     "percentile 0%; decode step median error 100%, 90th percentile 100%")
    assert "| a, batch 1, prompt 16 | 1,000.00 ms | 1.00 | 1,000.00 ms | 2.00 |" in dv.tables(
        _data())


def test_serving_words_quote_the_shipped_decode_validation() -> None:
    """A CPU calibration's serving words quote the CPU decode validation; a GPU's the serving
    steps measured on a lent H200 (benchmarks/gpu_serve.py, docs/gpu.md: prefill, decode and
    continuous batching's mixed step)."""
    from flopscope.plan.time_words import compute_note, validated_on

    cpu = decode_figures("cpu")
    assert cpu is not None, "estimate/data/decode_validation.json ships the CPU run"
    mine = serving_validated_on("cpu (x86_64)")
    assert mine == (f"{FORWARDS}; prefill and decode steps with a KV cache measured on a CPU "
                    f"({step_words(cpu)})")
    assert "not on a decode step" not in mine
    cuda = decode_figures("cuda")
    assert cuda is not None and cuda["device"] == "cuda (NVIDIA H200)"
    h100 = get_hardware("h100-sxm").calibration
    assert h100 is not None
    gpu = validated_on(h100)
    assert gpu == (f"{FORWARDS}; prefill and decode steps with a KV cache measured on a GPU "
                   f"({step_words(cuda)})")
    assert "NVIDIA H200" in gpu and "continuous batching's step median error" in gpu
    assert gpu in compute_note(get_hardware("h100-sxm"), serve=True)
    shipped = json.loads((Path(dv.SHIPPED)).read_text())
    assert shipped["cpu"]["source"] == "benchmarks/decode_validation.py"
    assert shipped["cuda"]["source"] == "benchmarks/gpu_serve.py"
    assert f"{100 * shipped['cpu']['decode']['p90_abs_error']:.0f}%" in mine
    assert f"{100 * shipped['cuda']['decode']['p90_abs_error']:.0f}%" in gpu
    # the GPU's figures are those of the measured steps (docs/gpu/serve_predicted.json)
    from benchmarks import gpu_serve

    root = Path(dv.__file__).resolve().parents[1] / "docs" / "gpu"
    made = gpu_serve.shipped(json.loads((root / "serve_predicted.json").read_text()),
                             json.loads((root / "summary.json").read_text()))
    assert made["cuda"] == shipped["cuda"]


@pytest.mark.parametrize("hardware", ["h100-sxm", str(PROFILE)])
def test_generate_says_what_its_prediction_was_validated_on(
        hardware: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``generate --hardware``'s prediction carries the words of its device kind: a shipped
    GPU's the serving steps measured on a lent H200, a CPU calibration's the CPU decode
    validation."""
    from flopscope.cli import main

    cal = get_hardware(hardware).calibration
    assert cal is not None
    words = serving_validated_on(cal.device)
    argv = ["generate", "hf:llama", "--shape-only", "--prompt-len", "8", "--new-tokens", "3",
            "--hardware", hardware, "--config=num_hidden_layers=1", "--config=hidden_size=64",
            "--config=intermediate_size=128", "--config=num_attention_heads=4",
            "--config=num_key_value_heads=2", "--config=vocab_size=256"]
    assert main([*argv, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["prediction"]["validated_on"] == words
    assert main(argv) == 0
    assert f"\n  its error bar: {words}\n" in capsys.readouterr().out
    assert ("measured on a GPU (" in words) == hardware.startswith("h100")
