"""Measured time checked (issue 27): ``flopscope.profile`` on resnet50, vit_b_16 and a Llama-style
decoder, forward and forward + backward, on this machine's CPU.

For each case: the rows (every counted call's time and the time outside them) add up to the
measured run's wall time; every call that does work is matched to a profiler event; the counted
work equals ``count()``'s; the achieved FLOP/s of each operator against this machine's measured
peaks. Overhead: the measured runs (``torch.profiler`` with flopscope's region and module ranges)
against the same runs under ``torch.profiler`` alone, interleaved rounds. The trace is loaded by
Holistic Trace Analysis when it is installed (``pip install HolisticTraceAnalysis``).

    python -m benchmarks.profile_validation [--repeat 5] [--rounds 5] [--json FILE]
    python -m benchmarks.profile_validation --overhead-only [--rounds 15]

``--overhead-only`` measures only the overhead, with more rounds (each round: one profiled run and
one run under the profiler alone, in alternating order) and the ratio of each round's pair, and
writes ``benchmarks/results/profile_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import flopscope
from flopscope.estimate import measure_this_machine
from flopscope.estimate.profile import dtype_key
from flopscope.execution.forward import backward as run_backward
from flopscope.timing.display import by_op
from flopscope.timing.trace import measured_trace, write_trace


def _cases() -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    import torchvision
    import transformers

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4,
                                      vocab_size=8000)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config)
    return [
        ("resnet50", torchvision.models.resnet50(), (torch.randn(1, 3, 224, 224),), {}),
        ("vit_b_16", torchvision.models.vit_b_16(), (torch.randn(1, 3, 224, 224),), {}),
        ("llama-4x256 (128 tokens)", llama, (),
         {"input_ids": torch.randint(0, 8000, (1, 128)), "use_cache": False}),
    ]


def _plain_profiler(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    backward: bool) -> float:
    """One run under torch.profiler alone (a region range, no module ranges): its wall time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with torch.no_grad() if not backward else torch.enable_grad():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("plain::region"):
                out = model(*args, **kwargs)
                if backward:
                    run_backward(model, out, None, (args, kwargs), None, alias=True)
    region = next(e for e in prof.events() if e.name == "plain::region")
    for p in model.parameters():
        p.grad = None
    return float(region.time_range.elapsed_us()) / 1e6


def run(repeat: int, rounds: int) -> dict[str, Any]:
    """Every case, forward and forward + backward; see the module docstring."""
    torch.set_num_threads(1)
    hardware = measure_this_machine()
    rows = []
    for name, model, args, kwargs in _cases():
        model.eval()
        for backward in (False, True):
            report, timing = flopscope.profile(model, *args, backward=backward, warmup=2,
                                               repeat=repeat, hardware=hardware, **kwargs)
            with torch.no_grad() if not backward else torch.enable_grad():
                counted = flopscope.count(model, *args, backward=backward, warn=False, **kwargs)
            inside = sum(c.seconds for c in timing.calls)
            peak = hardware.peak(dtype_key(torch.float32) or "fp32", True)
            rates = {op: t.flops_per_s for op, t in by_op(timing).items() if t.flops_per_s}
            fastest = max(rates.items(), key=lambda kv: kv[1]) if rates else ("-", 0.0)
            ours, plains = [], []
            for _ in range(rounds):  # overhead: ours and the profiler alone, interleaved
                _, t = flopscope.profile(model, *args, backward=backward, warmup=0, repeat=1,
                                         **kwargs)
                ours.append(t.wall_s)
                plains.append(_plain_profiler(model, args, kwargs, backward))
            trace_events = None
            try:
                from hta.trace_analysis import TraceAnalysis

                with tempfile.TemporaryDirectory() as folder:
                    write_trace(measured_trace(timing), Path(folder) / "rank-0.json")
                    analysis = TraceAnalysis(trace_dir=folder)
                    trace_events = int(len(analysis.t.get_trace(0)))
            except ImportError:
                pass
            row = {
                "case": name, "backward": backward, "calls": len(timing.calls),
                "wall_s": timing.wall_s, "inside_s": inside, "outside_s": timing.outside_s,
                "rows_sum_error": abs(inside + timing.outside_s - timing.wall_s) / timing.wall_s,
                "spread": timing.spread, "unmatched_work_calls": timing.unmatched,
                "counts_equal_count": report == counted,
                "fastest_op": fastest[0], "fastest_flops_per_s": fastest[1],
                "this_machine_fp32_matrix_peak": peak,
                "overhead_vs_profiler_alone": statistics.median(ours) / statistics.median(plains),
                "hta_events": trace_events,
            }
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__, "repeat": repeat, "rounds": rounds,
            "load": list(__import__("os").getloadavg()), "rows": rows}


def overhead(rounds: int) -> dict[str, Any]:
    """Only the overhead of every case (see the module docstring): per round, a profiled run and a
    run under the profiler alone, the one first alternating; the median of the per-round ratios
    and the ratio of the medians."""
    torch.set_num_threads(1)
    rows = []
    for name, model, args, kwargs in _cases():
        model.eval()
        for backward in (False, True):
            ours, plains = [], []
            flopscope.profile(model, *args, backward=backward, warmup=1, repeat=1, **kwargs)
            _plain_profiler(model, args, kwargs, backward)
            for r in range(rounds):
                pair = []
                for mine in ((True, False) if r % 2 == 0 else (False, True)):
                    if mine:
                        _, t = flopscope.profile(model, *args, backward=backward, warmup=0,
                                                 repeat=1, **kwargs)
                        pair.append(("ours", t.wall_s))
                    else:
                        pair.append(("plain", _plain_profiler(model, args, kwargs, backward)))
                got = dict(pair)
                ours.append(got["ours"])
                plains.append(got["plain"])
            ratios = [a / b for a, b in zip(ours, plains, strict=True)]
            row = {"case": name, "backward": backward, "rounds": rounds,
                   "ours_s": statistics.median(ours), "profiler_alone_s": statistics.median(plains),
                   "ratio_of_medians": statistics.median(ours) / statistics.median(plains),
                   "median_ratio": statistics.median(ratios),
                   "ratios": [round(x, 4) for x in ratios]}
            print(json.dumps({k: v for k, v in row.items() if k != "ratios"}), file=sys.stderr,
                  flush=True)
            rows.append(row)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__, "rounds": rounds,
            "load": list(__import__("os").getloadavg()), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--overhead-only", action="store_true",
                        help="only the overhead against torch.profiler alone")
    args = parser.parse_args(argv)
    results = Path(__file__).parent / "results"
    if args.overhead_only:
        args.json = args.json or results / "profile_overhead.json"
        data = overhead(args.rounds)
    else:
        args.json = args.json or results / "profile_validation.json"
        data = run(args.repeat, args.rounds)
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
