"""Measured time per module against DeepSpeed's flops profiler (issue 27), in one process.

For resnet50, vit_b_16 and a Llama-style decoder (the cases of ``benchmarks.profile_validation``),
forward at batch 1 on this machine's CPU (one thread), interleaved rounds of:

- DeepSpeed's ``FlopsProfiler`` around one forward (after a warm-up): each module's latency is its
  forward's wall time between DeepSpeed's pre- and post-forward hooks (``__duration__``, the
  attribute the profiler attaches to every module and removes at ``end_profile``), and its FLOPs;
- ``flopscope.profile(model, x, warmup=1, repeat=1)``: each module's span (the ``module::<path>``
  range around its forward, :attr:`flopscope.timing.Timing.modules`) and its counted FLOPs.

Per top-level module: both tools' median latency over the rounds and their run-to-run range; the
latencies agree where the two ranges overlap. Totals: both tools' forward FLOPs, with what
DeepSpeed misses explained (it patches ``torch.nn.functional`` and a few tensor methods: an
operator outside those, attention written as a composite or ``scaled_dot_product_attention``,
is not counted or counted by its own formula).

DeepSpeed is not a dependency: ``DS_BUILD_OPS=0 pip install deepspeed`` (it installs from its
source distribution on a machine without CUDA); without it the benchmark says so and stops.

    python -m benchmarks.profile_deepspeed [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

import flopscope
from benchmarks.profile_validation import _cases


def _deepspeed_run(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   paths: list[str]) -> tuple[dict[str, float], int]:
    """One forward under DeepSpeed's profiler: latency per module path, and the total FLOPs."""
    from deepspeed.profiling.flops_profiler import FlopsProfiler

    modules = dict(model.named_modules())
    prof = FlopsProfiler(model)
    with torch.no_grad():
        model(*args, **kwargs)  # warm-up
        prof.start_profile()
        model(*args, **kwargs)
        prof.stop_profile()
    latency = {p: float(getattr(modules[p], "__duration__", 0.0)) for p in paths}
    total = int(prof.get_total_flops())
    prof.end_profile()
    return latency, total


def _flopscope_run(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   paths: list[str]) -> tuple[dict[str, float], int]:
    """One measured forward through flopscope.profile: each module's span, and the counted FLOPs."""
    report, timing = flopscope.profile(model, *args, warmup=1, repeat=1, **kwargs)
    spans: dict[str, float] = {}
    for path, start, end in timing.modules:
        key = "" if path == "(root)" else path
        if key in paths and key not in spans:  # a module called twice: its first call
            spans[key] = end - start
    return {p: spans.get(p, 0.0) for p in paths}, report.flops


def compare(rounds: int = 5) -> list[dict[str, Any]]:
    """Every case, both tools, ``rounds`` interleaved rounds each."""
    torch.set_num_threads(1)
    out = []
    for name, model, args, kwargs in _cases():
        model.eval()
        paths = [""] + [n for n, _ in model.named_children()]
        if name.startswith("llama"):  # the decoder's own layers, one level down
            paths = [""] + [f"model.layers.{i}" for i in range(4)] + ["model.embed_tokens",
                                                                       "lm_head"]
        elif name == "vit_b_16":
            paths = ["", "conv_proj", "encoder", "heads"] + [
                f"encoder.layers.encoder_layer_{i}" for i in (0, 11)]
        ds: dict[str, list[float]] = {p: [] for p in paths}
        fs: dict[str, list[float]] = {p: [] for p in paths}
        ds_flops = fs_flops = 0
        for _ in range(rounds):
            lat, ds_flops = _deepspeed_run(model, args, kwargs, paths)
            for p in paths:
                ds[p].append(lat[p])
            lat, fs_flops = _flopscope_run(model, args, kwargs, paths)
            for p in paths:
                fs[p].append(lat[p])
        rows = []
        for p in paths:
            d, f = ds[p], fs[p]
            overlap = min(max(d), max(f)) >= max(min(d), min(f))
            rows.append({"module": p or "(root)", "deepspeed_s": statistics.median(d),
                         "deepspeed_range_s": [min(d), max(d)],
                         "flopscope_s": statistics.median(f),
                         "flopscope_range_s": [min(f), max(f)],
                         "ratio": statistics.median(f) / statistics.median(d)
                         if statistics.median(d) else None,
                         "ranges_overlap": overlap})
        out.append({"case": name, "rounds": rounds, "deepspeed_flops": ds_flops,
                    "flopscope_flops": fs_flops, "modules": rows})
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The comparison as Markdown."""
    lines = ["| case | module | DeepSpeed ms (range) | flopscope ms (range) | flopscope / DeepSpeed "
             "| within the spread |", "|---|---|---:|---:|---:|---|"]
    for case in results:
        for r in case["modules"]:
            dl, dh = (x * 1e3 for x in r["deepspeed_range_s"])
            fl, fh = (x * 1e3 for x in r["flopscope_range_s"])
            ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
            lines.append(f"| {case['case']} | `{r['module']}` | {r['deepspeed_s'] * 1e3:.2f} "
                         f"({dl:.2f}-{dh:.2f}) | {r['flopscope_s'] * 1e3:.2f} ({fl:.2f}-{fh:.2f}) "
                         f"| {ratio} | {'yes' if r['ranges_overlap'] else 'no'} |")
    lines += ["", "| case | DeepSpeed GFLOP | flopscope GFLOP |", "|---|---:|---:|"]
    for case in results:
        lines.append(f"| {case['case']} | {case['deepspeed_flops'] / 1e9:.3f} | "
                     f"{case['flopscope_flops'] / 1e9:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_deepspeed",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        import deepspeed.profiling.flops_profiler  # noqa: F401
    except ImportError:
        print("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install deepspeed", file=sys.stderr)
        return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = compare(args.rounds)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    sys.stdout.write(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
