"""Validate the calibrated prediction of generation (prefill and decode steps with a KV cache)
on this machine: predicted / measured per step, per workload.

1. ``--profile P.json``: a profile calibrated before the run by flopscope's own calibration on
   this machine (``flopscope calibrate --threads N --output P.json``: microbenchmarks only, no
   decoder among them); at ``--threads`` (the profile's thread count).
2. Small transformers decoders built from configs (no weights downloaded): GPT-2-shaped,
   Llama-style, GPT-NeoX-shaped; at batch 1 and ``--big-batch``; prompts of ``--prompts``
   tokens; ``--new-tokens`` tokens each (a prefill and ``new_tokens - 1`` decode steps).
3. **Predicted**: ``flopscope.llm.count_generation`` on the same model built on the meta device
   (shape-only: what ``flopscope generate --shape-only --hardware`` and ``flopscope plan
   --serve`` count) with a :class:`~flopscope.llm.generate.StepLogs`, each step's estimate on
   the profile (:func:`flopscope.estimate.bound.predicted_step_s`).
4. **Measured**: the same decode loop run for real (the prompt, then one token per sequence per
   step with a growing ``DynamicCache``, ``logits_to_keep=1``, as the count's loop), each step
   (one call of the model) timed by the calibration's clock (``clock``: at 1 thread the
   thread's CPU time, at more the wall time; the wall time beside), a warm-up pass then
   ``--repeat`` passes; each step's time the median over the passes.
5. Per workload: prefill predicted / measured; decode: the median predicted step over the
   median measured step, the mean over the mean, the first and the last decode step (the cache
   grows), and the growth (last - first) of each. Over the workloads: the median and 90th
   percentile of |ratio - 1| for the prefill and for decode, apart.

    PYTHONPATH=src:. python -m benchmarks.decode_validation --profile P.json [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.prediction_validation import ratio_stats
from flopscope.estimate.regime import parallel_add_s
from flopscope.estimate.timers import clock

RESULTS = Path(__file__).parent / "results"
SHIPPED = Path(__file__).parents[1] / "src" / "flopscope" / "estimate" / "data" / "decode_validation.json"


def gpt2_config() -> Any:
    """GPT-2-shaped (learned positions, LayerNorm, GELU MLP, fused QKV Conv1D, tied head),
    narrower and shallower than the 124M: 4 layers of 512, 8 heads, GPT-2's vocabulary."""
    from transformers import GPT2Config

    return GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=50257, n_positions=1024)


def llama_config() -> Any:
    """Llama-style (RoPE, RMSNorm, SwiGLU, grouped-query attention): 4 layers of 512, MLP 1408,
    8 heads, 2 KV heads, vocabulary 32000."""
    from benchmarks.models import llama_config as base

    return base(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=2, use_cache=True)


def neox_config() -> Any:
    """GPT-NeoX-shaped (Pythia: parallel attention and MLP residuals, partial rotary, fused
    QKV, untied head): 4 layers of 512, 8 heads, vocabulary 50304."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                         num_attention_heads=8, vocab_size=50304, max_position_embeddings=2048)


DECODERS: dict[str, Callable[[], Any]] = {
    "gpt2-shaped": gpt2_config, "llama-style": llama_config, "gpt-neox-shaped": neox_config}


def build(config: Any, device: torch.device | str) -> nn.Module:
    """A causal LM from ``config`` on ``device`` (random weights; eval mode)."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model: nn.Module = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return model.eval()


@dataclass(frozen=True)
class Workload:
    """One generation: a decoder, the sequences, the prompt and the new tokens."""

    model: str
    batch: int
    prompt: int
    new_tokens: int

    @property
    def label(self) -> str:
        return f"{self.model}, batch {self.batch}, prompt {self.prompt}"


def decode_pass(model: nn.Module, batch: int, prompt: int, new_tokens: int,
                timer: Callable[[], float] | None = None) -> list[float]:
    """One generation of ``new_tokens`` after a ``prompt``-token prompt, the loop
    ``count_generation`` counts on meta (a ``DynamicCache``, ``logits_to_keep=1``, the next
    token greedy): the time of each step (one call of ``model``) by ``timer``."""
    from transformers import DynamicCache

    from flopscope.llm.kv_cache import cache_keyword, find_cache

    now = timer or time.perf_counter
    config: Any = model.config
    vocab = int(config.vocab_size)
    g = torch.Generator().manual_seed(prompt * 1000 + batch)
    ids = torch.randint(0, vocab, (batch, prompt), generator=g)
    cache: Any = DynamicCache(config=config)
    keyword = cache_keyword(model)
    times = []
    with torch.no_grad():
        for _ in range(new_tokens):
            start = now()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache})
            times.append(now() - start)
            cache = find_cache(out) or cache
            ids = out.logits[:, -1:].argmax(-1)
    return times


def measure(model: nn.Module, w: Workload, repeat: int, threads: int) -> dict[str, Any]:
    """Each step's time over a warm-up pass then ``repeat`` passes: by the calibration's clock
    (``steps_s``: a list per pass) and the wall time (``walls_s``), and each pass's minor page
    faults."""
    now = clock("cpu")[1]  # torch is at ``threads`` threads already
    decode_pass(model, w.batch, w.prompt, w.new_tokens, now)
    steps, walls, faults = [], [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall_start = time.perf_counter()
        steps.append(decode_pass(model, w.batch, w.prompt, w.new_tokens, now))
        walls.append(time.perf_counter() - wall_start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"steps_s": steps, "pass_wall_s": walls, "page_faults": faults}


def predict(config: Any, w: Workload, hardware: Any) -> list[dict[str, Any]]:
    """Each step's prediction, as ``flopscope generate --shape-only --hardware`` makes it:
    the kind, the keys attended, the predicted seconds, their host part, the bound, the calls
    and the predicted seconds per family."""
    from flopscope.estimate.bound import predicted_step_s
    from flopscope.llm import count_generation
    from flopscope.llm.generate import StepLogs

    model = build(config, "meta")
    logs = StepLogs()
    result = count_generation(model, prompt_len=w.prompt, new_tokens=w.new_tokens,
                              batch=w.batch, shape_only=True, observers=[logs])
    out = []
    for step, est in zip(result.steps, logs.estimates(hardware), strict=True):
        out.append({"kind": step.kind, "context": step.context,
                    "predicted_s": predicted_step_s(est), "host_s": est.total.host_s,
                    "bound_s": est.total.time_s,
                    "calls": sum(int(f.calls) for f in est.by_family.values()),
                    "families_s": {name: f.predicted_s for name, f in est.by_family.items()}})
    return out


def compare(predicted: Sequence[dict[str, Any]],
            measured: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Predicted against measured steps of one generation.

    Args:
        predicted: one dict per step (``kind``, ``predicted_s``), the prefill first.
        measured: one list of step times per pass.

    Returns:
        The measured step times (the median over the passes), the prefill's and the decode
        steps' figures and their predicted / measured ratios: ``decode`` the median step,
        ``decode_mean`` the mean, ``first`` and ``last`` decode steps, and the growth from the
        first to the last (seconds, each).
    """
    if any(len(p) != len(predicted) for p in measured):
        raise ValueError(f"{len(predicted)} predicted steps against passes of "
                         f"{[len(p) for p in measured]}")
    steps = [statistics.median(p[i] for p in measured) for i in range(len(predicted))]
    pred = [float(p["predicted_s"]) for p in predicted]
    if predicted[0]["kind"] != "prefill":
        raise ValueError(f"the first step is a {predicted[0]['kind']}, not the prefill")
    out: dict[str, Any] = {"measured_steps_s": steps, "predicted_steps_s": pred,
                           "prefill": {"measured_s": steps[0], "predicted_s": pred[0],
                                       "ratio": pred[0] / steps[0]}}
    dec = [i for i, p in enumerate(predicted) if p["kind"] == "decode"]
    if not dec:
        return out
    m, p = [steps[i] for i in dec], [pred[i] for i in dec]
    figures = {"decode": (statistics.median(p), statistics.median(m)),
               "decode_mean": (statistics.fmean(p), statistics.fmean(m)),
               "first": (p[0], m[0]), "last": (p[-1], m[-1])}
    for key, (guess, seen) in figures.items():
        out[key] = {"measured_s": seen, "predicted_s": guess, "ratio": guess / seen}
    out["growth"] = {"measured_s": m[-1] - m[0], "predicted_s": p[-1] - p[0]}
    return out


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the workloads: :func:`~benchmarks.prediction_validation.ratio_stats` of the
    prefill's ratios, of the decode steps' (the median step's; the mean's; the first and last
    steps'), and of decode per batch size."""
    out = {"prefill": ratio_stats([r["prefill"]["ratio"] for r in rows])}
    with_decode = [r for r in rows if "decode" in r]
    for key in ("decode", "decode_mean", "first", "last"):
        if with_decode:
            out[key] = ratio_stats([r[key]["ratio"] for r in with_decode])
    for batch in sorted({r["batch"] for r in with_decode}):
        out[f"decode, batch {batch}"] = ratio_stats(
            [r["decode"]["ratio"] for r in with_decode if r["batch"] == batch])
    return out


def one(name: str, config: Any, w: Workload, hardware: Any, repeat: int,
        threads: int) -> dict[str, Any]:
    """One workload: predicted and measured steps and their comparison, with the load."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    predicted = predict(config, w, hardware)
    torch.manual_seed(0)
    model = build(config, "cpu")
    seen = measure(model, w, repeat, threads)
    row = {"model": name, "batch": w.batch, "prompt": w.prompt, "new_tokens": w.new_tokens,
           **compare(predicted, seen["steps_s"]), "passes_s": seen["steps_s"],
           "pass_wall_s": seen["pass_wall_s"], "page_faults": seen["page_faults"],
           "predicted": predicted, "load_before": load, "load_after": os.getloadavg()[0],
           "seconds_taken": time.perf_counter() - start}
    text = (f"{w.label:38s} prefill {row['prefill']['measured_s'] * 1e3:8.2f} ms "
            f"pred {row['prefill']['ratio']:5.2f}x")
    if "decode" in row:
        text += (f" | decode {row['decode']['measured_s'] * 1e3:7.2f} ms pred "
                 f"{row['decode']['ratio']:5.2f}x (first {row['first']['ratio']:5.2f}x, last "
                 f"{row['last']['ratio']:5.2f}x)")
    print(f"{text}  load {load:.1f}", file=sys.stderr, flush=True)
    return row


def shipped(data: dict[str, Any]) -> dict[str, Any]:
    """The figures ``flopscope``'s words quote (``estimate/data/decode_validation.json``), from
    a results JSON: per device kind, the date, threads, clock, workloads, models, the load
    and the prefill's and decode steps' error statistics."""
    rows = data["rows"]
    loads = [x for r in rows for x in (r["load_before"], r["load_after"])]
    return {data["device_kind"]: {
        "date": data["date"][:10], "measured": data["date"], "calibrated": data["calibrated"],
        "device": data["device"],
        "threads": data["threads"], "clock": data["clock"], "workloads": len(rows),
        "models": sorted({r["model"] for r in rows}),
        "batches": sorted({r["batch"] for r in rows}),
        "prompts": sorted({r["prompt"] for r in rows}),
        "load": [min(loads), max(loads)],
        "prefill": data["summary"]["prefill"], "decode": data["summary"]["decode"],
        "source": "benchmarks/decode_validation.py"}}


def tables(data: dict[str, Any]) -> str:
    """The markdown tables of docs/prediction.md from a results JSON."""
    lines = [f"Clock: {data['clock']}, {data['threads']} thread(s); profile calibrated "
             f"{data['calibrated']}; measured {data['date']}; load {data['load'][0]:.1f}-"
             f"{data['load'][1]:.1f}.", "",
             "| workload | prefill measured | predicted / measured | decode step measured "
             "(median) | predicted / measured | first | last | growth measured / predicted | "
             "load |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        d = r.get("decode")
        dec = (f"{d['measured_s'] * 1e3:,.2f} ms | {d['ratio']:.2f} | {r['first']['ratio']:.2f}"
               f" | {r['last']['ratio']:.2f} | {r['growth']['measured_s'] * 1e3:,.2f} / "
               f"{r['growth']['predicted_s'] * 1e3:,.2f} ms" if d else "- | - | - | - | -")
        lines.append(f"| {r['model']}, batch {r['batch']}, prompt {r['prompt']} | "
                     f"{r['prefill']['measured_s'] * 1e3:,.2f} ms | {r['prefill']['ratio']:.2f} "
                     f"| {dec} | {r['load_before']:.1f} |")
    lines += ["", "| set | n | median abs. error | 90th percentile | median predicted / measured "
              "|", "|---|---:|---:|---:|---:|"]
    for key, s in data["summary"].items():
        lines.append(f"| {key} | {s['n']} | {100 * s['median_abs_error']:.1f}% | "
                     f"{100 * s['p90_abs_error']:.1f}% | {s['median_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def repredicted(data: dict[str, Any], hardware: Any, *,
                without: str | None = None) -> dict[str, Any]:
    """A results JSON's measured steps against another profile's predictions (no timing): the
    same measurements, so two profiles' (or a profile's with and without some points)
    predictions compare without the runs' noise. ``without``: leave out the calibration points
    whose ``what`` holds it."""
    import dataclasses

    cal = hardware.calibration
    if without and cal is not None:
        points = tuple(p for p in cal.points if without not in p.what)
        hardware = dataclasses.replace(hardware, calibration=dataclasses.replace(
            cal, points=points))
    rows = []
    for r in data["rows"]:
        w = Workload(r["model"], r["batch"], r["prompt"], r["new_tokens"])
        rows.append({"model": r["model"], "batch": r["batch"], "prompt": r["prompt"],
                     **compare(predict(DECODERS[r["model"]](), w, hardware), r["passes_s"])})
    return {"summary": summarize(rows), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Predict and measure every workload; write the results JSON (and, with ``--ship``, the
    figures flopscope's words quote)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="a calibrated profile of this machine (JSON)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per workload")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--prompts", default="16,128,512", help="prompt lengths")
    parser.add_argument("--big-batch", type=int, default=8, help="the batch beside batch 1")
    parser.add_argument("--models", help="a comma-separated subset of " + ",".join(DECODERS))
    parser.add_argument("--output", default=str(RESULTS / "decode_validation.json"))
    parser.add_argument("--tables", action="store_true",
                        help="print the markdown tables of --output's results and stop")
    parser.add_argument("--ship", action="store_true",
                        help="write --output's summary to " + str(SHIPPED.relative_to(
                            SHIPPED.parents[4])) + " (the figures the words quote) and stop")
    parser.add_argument("--repredict", metavar="PROFILE",
                        help="predict --output's measured steps from PROFILE (no timing) and "
                             "print the summary")
    parser.add_argument("--without", help="with --repredict: leave out the profile's points "
                        "whose description holds this")
    opts = parser.parse_args(argv)
    if opts.repredict:
        from flopscope.estimate import get_hardware

        torch.set_num_threads(opts.threads)
        again = repredicted(json.loads(Path(opts.output).read_text()),
                            get_hardware(opts.repredict), without=opts.without)
        print(json.dumps({"profile": opts.repredict, "without": opts.without,
                          "measured": opts.output, **again}, indent=1))
        return 0
    if opts.tables:
        print(tables(json.loads(Path(opts.output).read_text())), end="")
        return 0
    if opts.ship:
        data = json.loads(Path(opts.output).read_text())
        have = json.loads(SHIPPED.read_text()) if SHIPPED.exists() else {}
        SHIPPED.write_text(json.dumps({**have, **shipped(data)}, indent=1) + "\n")
        return 0
    if not opts.profile:
        parser.error("--profile is required (flopscope calibrate --threads N --output P.json)")
    import transformers

    from flopscope.estimate import get_hardware

    hw = get_hardware(opts.profile)
    cal = hw.calibration
    if cal is None:
        parser.error(f"{opts.profile} has no calibration (flopscope calibrate makes one)")
    if cal.threads != opts.threads:
        print(f"warning: the profile was calibrated at {cal.threads} thread(s), run at "
              f"{opts.threads}", file=sys.stderr)
    torch.set_num_threads(opts.threads)
    names = opts.models.split(",") if opts.models else list(DECODERS)
    prompts = [int(x) for x in opts.prompts.split(",")]
    probe = parallel_add_s()
    rows = []
    for name in names:
        config = DECODERS[name]()
        for batch in (1, opts.big_batch):
            for prompt in prompts:
                rows.append(one(name, config, Workload(name, batch, prompt, opts.new_tokens),
                                hw, opts.repeat, opts.threads))
    loads = [x for r in rows for x in (r["load_before"], r["load_after"])]
    out = {"threads": opts.threads, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "clock": clock("cpu")[0],
           "profile": opts.profile, "calibrated": cal.date, "device": cal.device,
           "device_kind": "cuda" if cal.device.startswith("cuda") else "cpu",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "repeat": opts.repeat, "cpu_count": os.cpu_count(), "parallel_add_s": probe,
           "load": [min(loads), max(loads)],
           "note": f"{opts.threads} torch thread(s) on a shared 2-core machine; each step's "
                   "measured time the median over the passes by the clock (1 thread: the "
                   "thread's CPU time), the wall time of each pass beside",
           "summary": summarize(rows), "rows": rows}
    Path(opts.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
