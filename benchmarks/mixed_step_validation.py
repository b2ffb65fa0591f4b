"""Validate the calibrated prediction of continuous batching's step (``flopscope plan --serve
--batching continuous``) on this machine: predicted / measured per workload.

A serving role's mixed step (:func:`flopscope.plan.serving.simulate_serving`) is one forward in
which every sequence adds ``mixed_chunk(prompt, new_tokens)`` tokens to its cache at the
generation's middle, as a serving engine runs it (:func:`flopscope.llm.engine.engine_step`:
the cache's new positions written into room kept for them, the attention without a mask).

1. ``--profile P.json``: a profile calibrated before the run by flopscope's own calibration
   (``flopscope calibrate --threads N --output P.json``: microbenchmarks only, no decoder).
2. The small decoders of ``benchmarks/decode_validation.py`` (GPT-2-shaped, Llama-style,
   GPT-NeoX-shaped, from configs, random weights, float32) at batch 1 and 8, prompts of 128
   and 512 tokens, 32 new tokens.
3. **Predicted**: the serving role simulated on ``meta`` at tensor parallelism 1 (what the
   planner runs), its mixed step's calls through the profile
   (:func:`flopscope.plan.serve_time.forward_seconds`).
4. **Measured**: the real model's prompt prefilled to the step's starting cache
   (:func:`flopscope.plan.serving.middle`), then the same forward under ``engine_step``, timed
   by the calibration's clock (:func:`flopscope.estimate.timers.clock`), two warm-up runs then
   ``--repeat``, the median.
5. The median and 90th percentile of |predicted / measured - 1| over the workloads.

    PYTHONPATH=src:. python -m benchmarks.mixed_step_validation --profile P.json [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_validation import DECODERS, build
from benchmarks.prediction_validation import ratio_stats
from flopscope.estimate.timers import clock

RESULTS = Path(__file__).parent / "results"


def predicted(config: Any, batch: int, prompt: int, new_tokens: int, hardware: Any
              ) -> dict[str, Any]:
    """The serving role's mixed step on ``hardware``: its predicted seconds and bound."""
    from flopscope.plan.serve_time import forward_seconds
    from flopscope.plan.serving import simulate_serving

    run = simulate_serving(lambda: build(config, "meta"), 1, batch, prompt, new_tokens,
                           hardware)
    assert run.mixed is not None
    return {"predicted_s": forward_seconds(run.mixed.estimate),
            "bound_s": forward_seconds(run.mixed.estimate, bound=True),
            "context": run.mixed.context, "tokens": run.mixed.tokens}


def measured(config: Any, batch: int, prompt: int, new_tokens: int, repeat: int
             ) -> dict[str, Any]:
    """The same step run for real: the median of ``repeat`` timed runs after two warm-ups
    (:func:`benchmarks.gpu_serve.time_step`, on the CPU)."""
    from benchmarks.gpu_serve import time_step
    from flopscope.plan.serving import middle, mixed_chunk

    torch.manual_seed(0)
    step = time_step(build(config, "cpu"), config, batch, middle(prompt, new_tokens),
                     mixed_chunk(prompt, new_tokens), True, repeat, "cpu")
    return {"measured_s": step["measured_s"], "runs_s": step["runs_s"]}


def main(argv: list[str] | None = None) -> int:
    """Predict and measure every workload; print and write the results JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a calibrated profile (JSON)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--output", default=str(RESULTS / "mixed_step_validation.json"))
    opts = parser.parse_args(argv)
    from flopscope.estimate import get_hardware

    torch.set_num_threads(opts.threads)
    hardware = get_hardware(opts.profile)
    rows = []
    for name, make in DECODERS.items():
        config = make()
        for batch in (1, 8):
            for prompt in (128, 512):
                load = os.getloadavg()[0]
                row = {"model": name, "batch": batch, "prompt": prompt,
                       "new_tokens": opts.new_tokens, "load_before": load,
                       **predicted(config, batch, prompt, opts.new_tokens, hardware),
                       **measured(config, batch, prompt, opts.new_tokens, opts.repeat)}
                row["ratio"] = row["predicted_s"] / row["measured_s"]
                rows.append(row)
                print(f"{name:16s} batch {batch} prompt {prompt:4d}: {row['tokens']:5d} tokens "
                      f"on {row['context']:4d} keys, predicted {row['predicted_s'] * 1e3:8.2f} "
                      f"ms, measured {row['measured_s'] * 1e3:8.2f} ms, ratio "
                      f"{row['ratio']:.2f} (bound {row['bound_s'] * 1e3:.2f} ms)", flush=True)
    stats = ratio_stats([r["ratio"] for r in rows])
    print(json.dumps(stats))
    Path(opts.output).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "profile": opts.profile,
        "threads": opts.threads, "repeat": opts.repeat, "clock": clock("cpu")[0],
        "torch": torch.__version__, "rows": rows, "stats": stats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
