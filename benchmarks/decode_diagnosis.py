"""Where a decode step's prediction error is (issue 29, round 12): one decode step of
:mod:`benchmarks.decode_validation`'s decoders, per operator and per family, predicted against
measured.

- **Predicted**: the decode step's estimate from the shape-only count of the generation on the
  meta device (as ``flopscope generate --shape-only --hardware`` makes it): per operator
  (``Estimate.by_op``) its calls and predicted seconds (host part beside).
- **Measured**: the same model built for real, the prompt and ``step`` decode steps run, then
  the next decode step run again three times on the growing cache (three tokens more), each
  call timed inside the plain step by the calibration's clock
  (:func:`benchmarks.prediction_validation.captured_by_op`, the validation's per-operator
  join), and the plain step's time (the median of five) beside: the step less its calls' sum is
  the time outside every operator (Python, the modules, the cache's own code).

    PYTHONPATH=src:. python -m benchmarks.decode_diagnosis --profile P.json \
        [--workloads llama-style:1:128,gpt2-shaped:8:16] [--output R.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_validation import DECODERS, build
from benchmarks.prediction_validation import call_family, captured_by_op
from flopscope.estimate import get_hardware
from flopscope.estimate.timers import clock


def predicted_by_op(config: Any, batch: int, prompt: int, step: int,
                    hardware: Any) -> tuple[float, dict[str, dict[str, Any]]]:
    """The predicted time of decode step ``step`` (1 the first) and per operator its calls,
    predicted and host seconds and family."""
    from flopscope.estimate.bound import predicted_step_s
    from flopscope.llm import count_generation
    from flopscope.llm.generate import StepLogs

    logs = StepLogs()
    count_generation(build(config, "meta"), prompt_len=prompt, new_tokens=step + 1,
                     batch=batch, shape_only=True, observers=[logs])
    est = logs.estimates(hardware)[step]
    ops = {}
    for op, row in est.by_op.items():
        ops[op] = {"calls": row.calls, "predicted_s": row.predicted_s, "host_s": row.host_s,
                   "family": call_family(op, row.macs, row.flops, row.bytes)}
    return predicted_step_s(est), ops


def measured_by_op(config: Any, batch: int, prompt: int,
                   step: int) -> tuple[float, dict[str, float]]:
    """The plain time of the decode step after ``step - 1`` decode steps (the median of five,
    the cache growing one token each) and its per-operator times (the median of three more)."""
    from transformers import DynamicCache

    from flopscope.llm.kv_cache import cache_keyword, find_cache

    torch.manual_seed(0)
    model = build(config, "cpu")
    now = clock("cpu")[1]
    g = torch.Generator().manual_seed(prompt * 1000 + batch)
    ids = torch.randint(0, int(config.vocab_size), (batch, prompt), generator=g)
    state: dict[str, Any] = {"cache": DynamicCache(config=config), "ids": ids}
    keyword = cache_keyword(model)

    def run() -> None:
        with torch.no_grad():
            out = model(input_ids=state["ids"], use_cache=True, logits_to_keep=1,
                        **{keyword: state["cache"]})
        state["cache"] = find_cache(out) or state["cache"]
        state["ids"] = out.logits[:, -1:].argmax(-1)

    for _ in range(step):  # the prefill and step - 1 decode steps
        run()
    times = []
    for _ in range(5):
        start = now()
        run()
        times.append(now() - start)
    return statistics.median(times), captured_by_op(run)


def diagnose(name: str, config: Any, batch: int, prompt: int, step: int,
             hw: Any) -> dict[str, Any]:
    """One workload's decode step (``config``'s decoder): predicted and measured per operator
    and family."""
    pred_s, ops = predicted_by_op(config, batch, prompt, step, hw)
    plain_s, seen = measured_by_op(config, batch, prompt, step)
    for op, row in ops.items():
        row["measured_s"] = seen.get(op, 0.0)
    for op, seconds in seen.items():
        if op not in ops:
            ops[op] = {"calls": 0, "predicted_s": 0.0, "host_s": 0.0, "family": "not counted",
                       "measured_s": seconds}
    fams: dict[str, dict[str, float]] = {}
    for row in ops.values():
        f = fams.setdefault(row["family"], {"predicted_s": 0.0, "host_s": 0.0,
                                            "measured_s": 0.0, "calls": 0})
        for key in ("predicted_s", "host_s", "measured_s", "calls"):
            f[key] += row[key]
    inside = sum(seen.values())
    return {"model": name, "batch": batch, "prompt": prompt, "step": step,
            "predicted_s": pred_s, "measured_s": plain_s, "ratio": pred_s / plain_s,
            "in_calls_s": inside, "outside_calls_s": plain_s - inside,
            "families": fams, "ops": ops}


def text(r: dict[str, Any], top: int = 12) -> str:
    """The workload's per-family and top per-operator lines."""
    lines = [f"{r['model']}, batch {r['batch']}, prompt {r['prompt']}, decode step {r['step']}: "
             f"measured {r['measured_s'] * 1e3:.2f} ms (in calls {r['in_calls_s'] * 1e3:.2f}, "
             f"outside {r['outside_calls_s'] * 1e3:.2f}), predicted "
             f"{r['predicted_s'] * 1e3:.2f} ms ({r['ratio']:.2f}x)",
             f"  {'family / operator':34s} {'calls':>5s} {'pred ms':>8s} {'host ms':>8s} "
             f"{'meas ms':>8s} {'p/m':>5s}"]
    for key, f in sorted(r["families"].items(), key=lambda kv: -kv[1]["measured_s"]):
        ratio = f["predicted_s"] / f["measured_s"] if f["measured_s"] else 0.0
        lines.append(f"  {key:34s} {f['calls']:5d} {f['predicted_s'] * 1e3:8.3f} "
                     f"{f['host_s'] * 1e3:8.3f} {f['measured_s'] * 1e3:8.3f} {ratio:5.2f}")
    lines.append("  --")
    worst = sorted(r["ops"].items(), key=lambda kv: -abs(kv[1]["measured_s"]
                                                          - kv[1]["predicted_s"]))
    for op, f in worst[:top]:
        ratio = f["predicted_s"] / f["measured_s"] if f["measured_s"] else 0.0
        lines.append(f"  {op[:34]:34s} {f['calls']:5d} {f['predicted_s'] * 1e3:8.3f} "
                     f"{f['host_s'] * 1e3:8.3f} {f['measured_s'] * 1e3:8.3f} {ratio:5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Diagnose the workloads named; print the tables, write the rows as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a calibrated profile file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workloads", default="llama-style:1:128,gpt2-shaped:8:128,"
                        "gpt-neox-shaped:1:512", help="model:batch:prompt, comma-separated")
    parser.add_argument("--step", type=int, default=12, help="the decode step (1 the first)")
    parser.add_argument("--output", help="JSON of every workload")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    hw = get_hardware(opts.profile)
    rows = []
    for spec in opts.workloads.split(","):
        name, batch, prompt = spec.split(":")
        r = diagnose(name, DECODERS[name](), int(batch), int(prompt), opts.step, hw)
        print(text(r), flush=True)
        rows.append(r)
    if opts.output:
        Path(opts.output).write_text(json.dumps(rows, indent=1) + "\n")
    print("done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
