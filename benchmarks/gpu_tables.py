"""The tables of docs/gpu.md, made from the GPU check's JSON (``python -m benchmarks.gpu_tables
docs/gpu``): the numbers in the page come from the files, never typed by hand.

Executed operations are recomputed from each workload's raw counters with the current
:data:`benchmarks.gpu_ncu.TENSOR` list (the first run's own total missed fp16 tensor work: the
device lists ``sm__ops_path_tensor_src_fp16`` without a destination type).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import gpu_ncu
from benchmarks.errors import abs_errors


def _g(x: float) -> str:
    return f"{x / 1e9:,.3f}"


def _mib(x: float) -> str:
    return f"{x / 2**20:,.1f}"


def flops_table(data: dict[str, Any]) -> list[str]:
    lines = ["| workload | counted GFLOP | executed SIMT fp32 | fp64 | fp16 | tensor pipe | "
             "executed / counted | kernels |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in data["rows"]:
        if "raw" not in row:
            lines.append(f"| {row['workload']} | {_g(row['flops'])} | {row.get('error', '-')} "
                         "| | | | | |")
            continue
        ex = gpu_ncu.executed(row["raw"])
        lines.append(f"| {row['workload']} | {_g(row['flops'])} | {_g(ex['fp32'])} | "
                     f"{_g(ex['fp64'])} | {_g(ex['fp16'])} | {_g(ex['tensor_ops'])} | "
                     f"{ex['total'] / row['flops']:.3f} | {int(row['raw']['kernels'])} |")
    return lines


def attention_table(data: dict[str, Any]) -> list[str]:
    lines = ["| backend | causal | backward | flopscope MACs | FlopCounterMode MACs | equal |",
             "|---|---|---|---:|---:|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['backend']} | {r['causal']} | {r['backward']} | "
                         f"{r['error']} | | |")
            continue
        lines.append(f"| {r['backend']} | {r['causal']} | {r['backward']} | {r['macs']:,} | "
                     f"{r['flop_counter_macs']:,} | "
                     f"{'yes' if r['macs'] == r['flop_counter_macs'] else 'NO'} |")
    return lines


def _live_before(predicted: dict[str, Any]) -> int:
    """What the prediction holds live before the step starts: parameters, buffers, inputs and
    (training) the optimizer's state; gradients are set to None between steps."""
    at = predicted["at_peak"]
    return sum(at.get(k, 0) for k in ("parameters", "buffers", "inputs", "optimizer_state"))


def memory_table(data: dict[str, Any]) -> list[str]:
    lines = ["| model | step | predicted peak MiB | measured peak MiB | predicted / measured | "
             "held before, not a tensor of the model MiB | with it: predicted / measured | "
             "shape-only prediction MiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['train']} | {r['error']} | | | | | |")
            continue
        p, m = r["predicted"]["peak_bytes"], r["measured"]
        extra = m["allocated_before"] - _live_before(r["predicted"])
        lines.append(
            f"| {r['model']} | {'AdamW step' if r['train'] else 'inference'} | {_mib(p)} | "
            f"{_mib(m['max_allocated'])} | {p / m['max_allocated']:.3f} | {_mib(extra)} | "
            f"{(p + extra) / m['max_allocated']:.3f} | {_mib(r['predicted_shape_only'])} |")
    return lines


def time_table(data: dict[str, Any]) -> list[str]:
    lines = ["| resnet50 | wall ms | kernels ms | outside kernels | roofline bound ms (sum) | "
             "calls | unmatched | calls with bound > measured |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["runs"]:
        above = len(r["bound_above_measured"])
        lines.append(
            f"| batch {r['batch']}{', AdamW step' if r['train'] else ', inference'} | "
            f"{r['wall_s'] * 1e3:.2f} | {r['measured_sum_s'] * 1e3:.2f} | "
            f"{r['launch_bound_share']:.0%} | {r['bound_sum_s'] * 1e3:.3f} | {r['calls']} | "
            f"{r['unmatched']} | {above if above < 20 else '20 or more'} |")
    walls = [r for r in data["runs"] if "eager_s" in r]
    if walls:  # runs from the check's second version on: the run's own time, no profiler
        lines += ["", "| resnet50 | eager ms (no profiler) | CUDA graph ms | unmatched by phase |",
                  "|---|---:|---:|---|"]
        for r in walls:
            graph = f"{r['graph_s'] * 1e3:.2f}" if "graph_s" in r else "-"
            lines.append(f"| batch {r['batch']}{', AdamW step' if r['train'] else ''} | "
                         f"{r['eager_s'] * 1e3:.2f} | {graph} | {r['unmatched_by_phase']} |")
    return lines


def calib_table(data: dict[str, Any]) -> list[str]:
    lines = ["| point | measured |", "|---|---:|"]
    gemm = [r for r in data["gemm"] if r["m"] == r["n"] == r["k"]]
    for dtype in ("bfloat16", "float32"):
        best = max((r for r in gemm if r["dtype"] == dtype), key=lambda r: r["tflops"])
        lines.append(f"| best square {dtype} matrix product ({best['m']}^3) | "
                     f"{best['tflops']:.0f} TFLOP/s |")
    for r in data["gemm"]:
        if r["dtype"] == "bfloat16" and r["m"] in (1, 128) and r["n"] == r["k"] == 4096:
            lines.append(f"| bfloat16 {r['m']} x 4096 x 4096 (decode-like) | "
                         f"{r['tflops']:.1f} TFLOP/s |")
    copy = max((r for r in data["stream"] if r["op"] == "copy"), key=lambda r: r["numel"])
    lines.append(f"| copy of {_mib(copy['numel'] * (4 if copy['dtype'] == 'float32' else 2))} "
                 f"MiB ({copy['dtype']}), read + written | {copy['gbps']:,.0f} GB/s |")
    for r in data["host"]:
        if r["op"] in ("add", "linear", "conv2d", "batch_norm", "view"):
            lines.append(f"| host time per eager {r['op']} call | "
                         f"{r['host_s_per_call'] * 1e6:.1f} us |")
    if "module" in data:
        lines.append(f"| host time per nn.Module call, outside its operators | "
                     f"{data['module']['module_call_s'] * 1e6:.1f} us |")
    rotation = [r["rotation_over_alone"] for r in data.get("host_rotation", [])
                if isinstance(r, dict) and "rotation_over_alone" in r]
    if rotation:
        lines.append(f"| host time in rotation / alone, median of {len(rotation)} tiny "
                     f"calls (range) | {statistics.median(rotation):.2f} ({min(rotation):.2f}-"
                     f"{max(rotation):.2f}) |")
    chains = [r for r in data.get("chains", []) if isinstance(r, dict) and "graph_s" in r]
    if chains:
        lines.append(f"| chains of layers: device (CUDA graph) / eager time, median of "
                     f"{len(chains)} | {statistics.median(r['graph_s'] / r['seconds'] for r in chains):.2f} |")
    sized = [r for r in data.get("host_sized", []) if isinstance(r, dict) and "sized_over_tiny" in r]
    if sized:
        grow = [r["sized_over_tiny"] for r in sized]
        lines.append(f"| host time in rotation at a batch-1 model's sizes / tiny, median of "
                     f"{len(grow)} calls (range) | {statistics.median(grow):.2f} ({min(grow):.2f}-"
                     f"{max(grow):.2f}) |")
        more = [f"{r['op']} {r['tiny_kernels']}->{r['sized_kernels']}" for r in sized
                if r["sized_kernels"] != r["tiny_kernels"]]
        lines.append(f"| kernels per call, tiny -> sized, where they differ | "
                     f"{', '.join(more) or 'none'} |")
    big = [r for r in data.get("chains_sized", []) if isinstance(r, dict) and "graph_s" in r]
    if big:
        lines.append(f"| chains at a batch-1 model's sizes: device (CUDA graph) / eager time, "
                     f"median of {len(big)} | "
                     f"{statistics.median(r['graph_s'] / r['seconds'] for r in big):.2f} |")
    small = [r for r in data["stream"] if r["op"] == "add" and r["dtype"] == "float32"
             and "seconds" in r]
    if small and data.get("timing"):
        tiny = min(small, key=lambda r: r["numel"])
        lines.append(f"| device time of the smallest float32 add ({tiny['numel']:,} elements), "
                     f"{data['timing']} | {tiny['seconds'] * 1e6:.2f} us |")
    return lines


def _errors(rows: list[dict[str, Any]], key: str) -> str:
    """``median / p90`` of |ratio - 1| over rows with ``key``, as percentages."""
    e = abs_errors(r[key] for r in rows if key in r)
    if not e["cases"]:
        return "-"
    return f"{e['median_abs_error']:.0%} / {e['p90_abs_error']:.0%} ({e['cases']})"


def _with_device_ratio(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "device_ratio": r["predicted_device_s"] / r["graph_s"]} if "graph_s" in r
            else r for r in rows]


def predict_summary(folder: Path) -> list[str]:
    """The errors of each prediction file in the folder: whole eager step (predicted step,
    host and device overlapping, against the eager time) and device alone (predicted device
    time against the CUDA graph's replay), on the cases seen before the model changed and on
    the held-out ones."""
    lines = ["| prediction | profile made from | step vs eager: seen | held out | device vs CUDA graph: "
             "seen | held out |", "|---|---|---:|---:|---:|---:|"]
    for path in sorted(folder.glob("predict*.json")):
        data = json.loads(path.read_text())
        rows = _with_device_ratio([r for r in data["rows"] if "ratio" in r])
        seen = [r for r in rows if not r.get("held_out")]
        held = [r for r in rows if r.get("held_out")]
        made = data.get("profile_made_from", data["profile"])
        lines.append(f"| {path.name} | {made} | {_errors(seen, 'ratio')} | "
                     f"{_errors(held, 'ratio')} | {_errors(seen, 'device_ratio')} | "
                     f"{_errors(held, 'device_ratio')} |")
        for base, what in _BASELINES.items():  # the same cases and measured times
            loop = [{"ratio": r[base]["ratio"], "held_out": r.get("held_out")} for r in rows
                    if "ratio" in r.get(base, {})]
            if loop:
                lines.append(f"| {path.name}, {base} | {what} | "
                             f"{_errors([r for r in loop if not r['held_out']], 'ratio')} | "
                             f"{_errors([r for r in loop if r['held_out']], 'ratio')} | - | - |")
    return lines


def repeat_table(folder: Path, first: str, later: tuple[str, ...]) -> list[str]:
    """The same cases measured again (the eager and the CUDA graph's times of ``later`` files
    against ``first``'s, the same models, batches and steps): how far a measurement moves between
    sessions and within one, the floor under any prediction's error against it. Each row:
    the median later / first time (range), and median / p90 of |ratio - 1|."""
    def times(name: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        rows = json.loads((folder / name).read_text())["rows"]
        return {(r["model"], r["batch"], r["train"], r["dtype"]): r for r in rows if "eager_s" in r}

    def cell(ratios: list[float]) -> str:
        e = abs_errors(ratios)
        return (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}); "
                f"{e['median_abs_error']:.0%} / {e['p90_abs_error']:.0%} ({e['cases']})")

    lines = ["| measured again | against | eager: later / first (range); abs(ratio - 1) median "
             "/ p90 | CUDA graph: the same |", "|---|---|---|---|"]
    names = (first, *later)
    loaded = {name: times(name) for name in names}  # each file read once
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ta, tb = loaded[a], loaded[b]
            both = [k for k in ta if k in tb]
            graph = [tb[k]["graph_s"] / ta[k]["graph_s"] for k in both
                     if "graph_s" in ta[k] and "graph_s" in tb[k]]
            lines.append(f"| {b} | {a} | {cell([tb[k]['eager_s'] / ta[k]['eager_s'] for k in both])}"
                         f" | {cell(graph)} |")
    return lines


# benchmarks/gpu_predict.py's predictions beside the full profile's
_BASELINES = {"loop_host": "the same calib without its mixed-operator host times",
              "rotation_only": "the same calib without its chains",
              "tiny_chains": "the same calib without its chains at model sizes"}


def predict_table(data: dict[str, Any]) -> list[str]:
    lines = ["| model | batch | step | dtype | held out | eager ms | predicted step ms (host, "
             "device) | predicted / eager | CUDA graph ms | predicted device / graph |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in _with_device_ratio(data["rows"]):
        head = (f"| {r['model']} | {r['batch']} | {'AdamW' if r['train'] else 'forward'} | "
                f"{r['dtype']} | {'yes' if r.get('held_out') else ''} |")
        if "error" in r:
            lines.append(f"{head} {r['error']} | | | | |")
            continue
        graph = (f"{r['graph_s'] * 1e3:.2f} | {r['device_ratio']:.2f}" if "graph_s" in r
                 else "- | -")
        lines.append(f"{head} {r['eager_s'] * 1e3:.2f} | {r['predicted_step_s'] * 1e3:.2f} "
                     f"({r['predicted_host_s'] * 1e3:.2f}, {r['predicted_device_s'] * 1e3:.2f}) | "
                     f"{r['ratio']:.2f} | {graph} |")
    return lines


def serve_table(data: dict[str, Any]) -> list[str]:
    """The serving steps measured on the GPU against their prediction
    (``benchmarks/gpu_serve.py``), and the errors per kind of step."""
    lines = [f"Predicted with `--hardware {data['hardware']}` ({data['calibration']}).", "",
             "| model | batch | prompt, new | step | measured ms | device ms | predicted ms "
             "(device) | bound ms | predicted / measured | predicted device / device |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    ratios: dict[str, list[dict[str, Any]]] = {}
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | | {r['error']} | | | | | | |")
            continue
        for step in ("prefill", "first", "last", "mixed"):
            x = r[step]
            ratios.setdefault(step, []).append(x)
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['prompt']}, {r['new_tokens']} | {step} | "
                f"{x['measured_s'] * 1e3:.2f} | {x.get('measured_device_s', 0) * 1e3:.2f} | "
                f"{x['predicted_s'] * 1e3:.2f} ({x['predicted_device_s'] * 1e3:.2f}) | "
                f"{x['bound_s'] * 1e3:.2f} | {x['ratio']:.2f} | "
                f"{x.get('device_ratio', float('nan')):.2f} |")
    lines += ["", "| steps | predicted / measured: median / 90th percentile of abs(ratio - 1) | "
              "device alone |", "|---|---:|---:|"]
    groups = {**ratios, "all": [x for v in ratios.values() for x in v]}
    for name, rows in groups.items():
        lines.append(f"| {name} | {_errors(rows, 'ratio')} | {_errors(rows, 'device_ratio')} |")
    return lines


def render(folder: Path) -> str:
    """Every table, each under its part's name."""
    out: list[str] = []
    summary = json.loads((folder / "summary.json").read_text())
    out.append(f"Device: {summary['device']} (driver {summary.get('driver', '?')}), torch "
               f"{summary['torch']}, CUDA {summary['cuda']}, {summary['date']}.")
    for run in summary.get("runs", []):
        parts = ", ".join(f"{k} {v}" for k, v in run["parts"].items())
        out.append(f"- {run['date']}: {parts} ([{run['log']}](gpu/{run['log']}))"
                   + (f"; kept: {run['kept']}" if "kept" in run else ""))
    for name, table in (("flops", flops_table), ("attention", attention_table),
                        ("memory", memory_table), ("time", time_table), ("calib", calib_table),
                        ("predict", predict_table), ("serve_predicted", serve_table)):
        path = folder / f"{name}.json"
        if path.exists():
            out += ["", f"#### {name.removesuffix('_predicted')}", "",
                    *table(json.loads(path.read_text()))]
    if any(folder.glob("predict*.json")):
        out += ["", "#### prediction errors (median / 90th percentile of |predicted / measured "
                "- 1|, cases)", "", *predict_summary(folder)]
    again = tuple(sorted(p.name for p in folder.glob("predict_run*_shipped.json")))
    if again and (folder / "predict.json").exists():
        out += ["", "#### the same cases measured again", "",
                *repeat_table(folder, "predict.json", again)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/gpu")))
