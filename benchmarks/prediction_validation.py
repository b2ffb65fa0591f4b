"""Validate the calibrated prediction (issue 29) on this machine: predicted / measured time.

1. Calibrate first (``flopscope.estimate.calibrate`` on the ``this-machine`` profile at
   ``--threads``): microbenchmarks only, none of the models below. The profile is written to
   ``--profile`` before any model runs; recalibrated before every ``--recalibrate-every``
   torchvision models and before the training steps (the machine's load drifts: calibration,
   not tuning; the error bars go into the first profile).
2. Forward (batch 1) of every torchvision classifier of at most 2 GMACs and of the earlier set
   (resnet50, vit_b_16, convnext_tiny, densenet121), and a training step (forward, backward,
   AdamW) of BERT-base, GPT-2 and a Llama-style decoder (128 tokens). The prediction is the sum
   of every call's predicted time as ``flopscope.profile`` counts them, the bound the sum of their
   roofline bounds.
3. Measured: the median of ``--repeat`` plain runs (no profiler) by the calibration's clock
   (``flopscope.estimate.timers.clock``: at 1 thread the thread's CPU time, what the core
   spent whatever else the shared machine ran; at 2 threads the wall time), the wall time beside.
4. Per family: the calls' predicted time summed per model and family against their time inside a
   plain run (a dispatch mode reads the clock around each kernel: no profiler events).
5. Host-bound checks: a 50-layer MLP of width 16 at batch 1 (host-bound), a 2048^3 product (not).
6. The error bars (90th percentile over the models of |predicted / measured - 1|, per family of
   the family's summed time, and ``total`` of the whole models) go into the profile.

    PYTHONPATH=src:. python -m benchmarks.prediction_validation [--threads 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

import flopscope
from benchmarks.errors import quantile
from flopscope.estimate import calibrate, measure_this_machine
from flopscope.estimate import heap as flopscope_heap
from flopscope.estimate.call_record import is_convolution
from flopscope.estimate.families import family_of
from flopscope.estimate.profile import SPECIAL_FUNCTIONS, Hardware
from flopscope.estimate.regime import check as regime_check
from flopscope.estimate.regime import parallel_add_s as parallel_probe
from flopscope.estimate.roofline import CallLog
from flopscope.estimate.timers import clock

RESULTS = Path(__file__).parent / "results"
VISION = ["resnet18", "resnet50", "mobilenet_v3_large", "mobilenet_v2", "efficientnet_b0",
          "vit_b_16", "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1",
          "densenet121", "mnasnet1_0", "googlenet", "alexnet"]
_SPECIAL_BASES = {("_" + f if f.endswith("softmax") else f) for f in SPECIAL_FUNCTIONS}


def call_family(op: str, macs: int, flops: int, nbytes: int) -> str:
    """The prediction family of a counted call (its operator, MACs, FLOPs and bytes moved)."""
    base = op.split(".")[1] if op.count(".") >= 1 else op
    special = base.rstrip("_") in _SPECIAL_BASES
    return family_of(op, int(macs), int(flops), int(nbytes), special, is_convolution(op))


def cost_family(op: str, cost: Any) -> str:
    """:func:`call_family` of one counted call's cost (bytes read and written together)."""
    return call_family(op, cost.macs, cost.flops, cost.bytes_read + cost.bytes_written)


def _step(model: nn.Module, args: tuple[Any, ...], train: bool) -> Any:
    """The forward under ``no_grad``, or the training step ``profile(train=True)`` measures
    (zero_grad, the summed outputs backpropagated, AdamW's step; the model's weights change,
    it is not used after)."""
    from flopscope.execution.training import default_loss

    if train:
        model.train()
        opt = torch.optim.AdamW(model.parameters())

        def run() -> None:
            opt.zero_grad(set_to_none=True)
            default_loss(model(*args)).backward()
            opt.step()
    else:
        def run() -> None:
            with torch.no_grad():
                model(*args)
    return run


def plain_runs(run: Any, repeat: int,
               faults: list[int] | None = None) -> tuple[list[float], list[float]]:
    """(times by the calibration's clock, wall times) of ``repeat`` runs without the profiler,
    after two warm-up runs: at one thread the clock is the thread's CPU time (what the core
    spent, not the time other processes held it), at more the wall clock. ``faults`` (when
    given) receives each run's minor page faults, the process's (every thread's)."""
    import resource

    now = clock("cpu")[1]
    for _ in range(2):
        run()
    times, walls = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start, wall = now(), time.perf_counter()
        run()
        times.append(now() - start)
        walls.append(time.perf_counter() - wall)
        if faults is not None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return times, walls


def captured_by_op(run: Any, runs: int = 3) -> dict[str, float]:
    """Seconds per operator of one run (the median run's per-call times summed per operator),
    each call timed by the calibration's clock inside a plain run (a dispatch mode reads the
    clock around the kernel: no profiler events)."""
    from benchmarks.prediction_diagnosis import Capture

    taken = []
    for _ in range(runs):
        mode = Capture(keep=False)
        with mode:
            run()
        taken.append(mode)
    best = sorted(taken, key=lambda m: sum(m.times))[len(taken) // 2]
    out: dict[str, float] = {}
    for op, seconds in zip(best.ops, best.times, strict=True):
        out[op] = out.get(op, 0.0) + seconds
    return out


def one(name: str, kind: str, model: nn.Module, args: tuple[Any, ...], hw: Hardware,
        repeat: int, train: bool) -> dict[str, Any]:
    """One model: measured (plain runs), prediction and bound (``flopscope.profile``'s counted
    calls), per family (the calls' predicted time against their time in a plain run)."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    _, timing = flopscope.profile(model, *args, train=train, hardware=hw, repeat=2,
                                  warmup=1)
    predicted = sum(c.bound.predicted_s for c in timing.calls if c.bound is not None)
    host = sum(c.bound.host_s for c in timing.calls if c.bound is not None)
    bound = sum(c.bound.time_s for c in timing.calls if c.bound is not None)
    op_family: dict[str, str] = {}
    fams: dict[str, dict[str, float]] = {}
    for c in timing.calls:
        if c.bound is None:
            continue
        fam = op_family.setdefault(c.op, cost_family(c.op, c.cost))
        f = fams.setdefault(fam, {"calls": 0, "predicted_s": 0.0, "measured_s": 0.0,
                                  "bound_s": 0.0})
        f["calls"] += 1
        f["predicted_s"] += c.bound.predicted_s
        f["bound_s"] += c.bound.time_s
    # the same calls predicted by the points alone (the calibration without its chains), to
    # show what the chains' factor did in the same run
    alone = (dataclasses.replace(hw, calibration=dataclasses.replace(hw.calibration, chains=()))
             if hw.calibration is not None else hw)
    _, again = flopscope.profile(model, *args, train=train, hardware=alone, repeat=1, warmup=0)
    points_only = sum(c.bound.predicted_s for c in again.calls if c.bound is not None)
    # and with the page faults of a fresh process's heap (round 11: before, the heap's replay
    # started empty; now flopscope.profile starts it from this process's heap): the same
    # calibration, the rule before
    with mock.patch.object(flopscope_heap, "this_process", return_value=None):
        _, again = flopscope.profile(model, *args, train=train, hardware=hw, repeat=1, warmup=0)
    fresh = sum(c.bound.predicted_s for c in again.calls if c.bound is not None)
    # and as rounds 7-10 validated it: flopscope.profile did not replay the heap (only an
    # allocation of at least mmap_bytes faulted); the training steps only (forwards: no fault)
    old_rule = None
    if train:
        with mock.patch.object(CallLog, "simulate_faults", return_value=None):
            _, again = flopscope.profile(model, *args, train=train, hardware=hw, repeat=1,
                                         warmup=0)
        old_rule = sum(c.bound.predicted_s for c in again.calls if c.bound is not None)
    run = _step(model, args, train)
    probe = parallel_probe()  # this process's regime now, against the calibration's (round 11)
    calibrated_probe = hw.calibration.parallel_add_s if hw.calibration is not None else 0.0
    page_faults: list[int] = []
    times, walls = plain_runs(run, repeat, page_faults)
    for op, seconds in captured_by_op(run).items():
        fam = op_family.get(op)
        if fam is not None:
            fams[fam]["measured_s"] += seconds
    for f in fams.values():
        f["ratio"] = f["predicted_s"] / f["measured_s"] if f["measured_s"] else float("nan")
    measured = statistics.median(times)
    row = {"model": name, "kind": kind, "measured_s": measured, "measured_min_s": min(times),
           "measured_wall_s": statistics.median(walls), "profile_wall_s": timing.wall_s,
           "predicted_s": predicted, "host_s": host, "bound_s": bound,
           "ratio": predicted / measured, "ratio_to_min": predicted / min(times),
           "predicted_points_only_s": points_only, "ratio_points_only": points_only / measured,
           "predicted_fresh_heap_s": fresh, "ratio_fresh_heap": fresh / measured,
           "predicted_old_rule_s": old_rule,
           "ratio_old_rule": old_rule / measured if old_rule is not None else None,
           "ratio_to_wall": predicted / statistics.median(walls),
           "bound_holds": min(times) >= bound, "calls": len(timing.calls),
           "page_faults": statistics.median(page_faults), "parallel_add_s": probe,
           "calibration_parallel_add_s": calibrated_probe,
           "regime": (("differs" if regime_check(calibrated_probe, probe)["differs"]
                       else "as calibrated") if calibrated_probe else "not measured"),
           "load_before": load, "load_after": os.getloadavg()[0],
           "seconds_taken": time.perf_counter() - start, "families": fams}
    print(f"{name:22s} measured {measured * 1e3:9.2f} ms (wall {statistics.median(walls) * 1e3:9.2f}) "
          f"predicted {predicted * 1e3:9.2f} ms ({predicted / measured:5.2f}x; points alone "
          f"{points_only / measured:5.2f}x; fresh heap {fresh / measured:5.2f}x; old rule "
          f"{(old_rule or 0) / measured:5.2f}x)  bound "
          f"{bound * 1e3:9.2f} ms  faults {statistics.median(page_faults):.0f}  add 2^16 {probe * 1e6:.1f} us  load {load:.1f}", file=sys.stderr, flush=True)
    return row


def host_checks(hw: Hardware, repeat: int) -> list[dict[str, Any]]:
    """The MLP of 50 tiny layers (host-bound) and one large product (not)."""
    out = []
    torch.manual_seed(0)
    mlp = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(16, 16), nn.ReLU())])
    gemm = nn.Linear(2048, 2048, bias=False)
    for name, model, x, expect in (("mlp 50 x width 16, batch 1", mlp, torch.randn(1, 16), True),
                                   ("linear 2048 x 2048, 2048 rows", gemm,
                                    torch.randn(2048, 2048), False)):
        _, est = flopscope.estimate.roofline(model, x, hardware=hw)
        device = est.total.predicted_s - est.total.host_s
        row = one(name, "host check", model, (x,), hw, repeat, False)
        row.update({"host_bound": est.total.host_s > device, "expected_host_bound": expect,
                    "host_over_device": est.total.host_s / device if device else None})
        out.append(row)
    return out


def ratio_stats(values: list[float]) -> dict[str, float]:
    """Of predicted / measured ratios: their count, the median and 90th percentile (nearest
    rank) of |ratio - 1|, and the median ratio."""
    errors = [abs(v - 1) for v in values]
    return {"n": len(values), "median_abs_error": statistics.median(errors),
            "p90_abs_error": quantile(errors, 0.9), "median_ratio": statistics.median(values)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and 90th percentile of |predicted / measured - 1|, per kind and per family."""
    stats = ratio_stats
    models = [r for r in rows if r["kind"] != "host check"]
    out: dict[str, Any] = {"all models": stats([r["ratio"] for r in models]),
                           "all models, against the fastest run": stats(
                               [r["ratio_to_min"] for r in models]),
                           "all models, against the wall time": stats(
                               [r["ratio_to_wall"] for r in models])}
    if all("ratio_points_only" in r for r in models):
        out["all models, the points alone (no chains)"] = stats(
            [r["ratio_points_only"] for r in models])
    if all("ratio_fresh_heap" in r for r in models):
        out["all models, page faults of a fresh process's heap (the rule before round 11)"] = (
            stats([r["ratio_fresh_heap"] for r in models]))
    for regime in ("as calibrated", "differs"):  # the process's regime against the calibration's
        chosen = [r["ratio"] for r in models if r.get("regime") == regime]
        if chosen:
            out[f"all models, regime {regime}"] = stats(chosen)
    for kind in sorted({r["kind"] for r in rows}):
        out[kind] = stats([r["ratio"] for r in rows if r["kind"] == kind])
    families: dict[str, list[float]] = {}
    for r in rows:
        if r["kind"] == "host check":
            continue
        for fam, f in r["families"].items():
            if f["measured_s"] > 0 and f["predicted_s"] > 0:
                families.setdefault(fam, []).append(f["ratio"])
    out["families"] = {fam: stats(v) for fam, v in sorted(families.items())}
    return out


def tables(data: dict[str, Any]) -> str:
    """The markdown tables of docs/prediction.md from a results JSON."""
    lines = [f"Clock: {data.get('clock', 'wall')}, {data['threads']} thread(s); calibration "
             f"{data['calibration_s']:.0f} s of wall time ({data.get('calibration_cpu_s', 0):.0f}"
             " s of CPU time).", "",
             "| model | run | measured (median) | fastest | wall (median) | predicted | "
             "predicted / measured | points alone / measured | bound | host part | load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        alone = f"{r['ratio_points_only']:.2f}" if "ratio_points_only" in r else "-"
        lines.append(
            f"| {r['model']} | {r['kind']} | {r['measured_s'] * 1e3:,.1f} ms | "
            f"{r['measured_min_s'] * 1e3:,.1f} ms | {r['measured_wall_s'] * 1e3:,.1f} ms | "
            f"{r['predicted_s'] * 1e3:,.1f} ms | {r['ratio']:.2f} | {alone} | "
            f"{r['bound_s'] * 1e3:,.1f} ms"
            f"{'' if r['bound_holds'] else ' (above!)'} | {r['host_s'] * 1e3:,.2f} ms | "
            f"{r['load_before']:.1f} |")
    lines += ["", "| set | n | median abs. error | 90th percentile | median predicted / measured |",
              "|---|---:|---:|---:|---:|"]
    summary = data["summary"]
    for key, s in summary.items():
        if key.startswith("families"):
            continue
        lines.append(f"| {key} | {s['n']} | {100 * s['median_abs_error']:.0f}% | "
                     f"{100 * s['p90_abs_error']:.0f}% | {s['median_ratio']:.2f} |")
    lines += ["", "| family | models | median abs. error | 90th percentile | median predicted / "
              "measured |", "|---|---:|---:|---:|---:|"]
    for fam, s in summary["families"].items():
        lines.append(f"| {fam} | {s['n']} | {100 * s['median_abs_error']:.0f}% | "
                     f"{100 * s['p90_abs_error']:.0f}% | {s['median_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, dict[str, Any]]], path: Path) -> bool:
    """Predicted against measured (log-log), one marker per run, the line y = x and the band of
    the first run's 90th-percentile error; ``False`` without matplotlib."""
    from benchmarks.plotting import counted_vs_measured_axes, pyplot, save

    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 6))
    rows = [(label, r) for label, data in runs for r in data["rows"]]
    values = [v for _, r in rows for v in (r["measured_s"] * 1e3, r["predicted_s"] * 1e3)]
    lo, hi = counted_vs_measured_axes(
        ax, values, title="predicted vs measured, this machine (docs/prediction.md)",
        xlabel="measured (median of plain runs: 1 thread CPU time, 2 threads wall), ms",
        ylabel="predicted (calibrated model), ms")
    band = runs[0][1]["summary"]["all models"]["p90_abs_error"]
    ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)],
                    [lo * (1 + band), hi * (1 + band)], color="0.85", alpha=0.6,
                    label=f"+-{100 * band:.0f}% (90th percentile, {runs[0][0]})")
    markers = {"forward (torchvision, batch 1)": "o", "training step (AdamW, 128 tokens)": "s",
               "host check": "^"}
    for i, (label, data) in enumerate(runs):
        for kind, marker in markers.items():
            pts = [r for r in data["rows"] if r["kind"] == kind]
            ax.scatter([r["measured_s"] * 1e3 for r in pts], [r["predicted_s"] * 1e3 for r in pts],
                       marker=marker, color=f"C{i}", alpha=0.75, s=28,
                       label=f"{kind}, {label}")
    for r in runs[0][1]["rows"]:
        ax.annotate(r["model"].split(",")[0], (r["measured_s"] * 1e3, r["predicted_s"] * 1e3),
                    fontsize=6, xytext=(3, -3), textcoords="offset points")
    ax.legend(fontsize=6, loc="upper left")
    save(plt, fig, path)
    return True


def main(argv: list[str] | None = None) -> int:
    """Calibrate, then validate; write the results JSON and the profile with its error bars."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two small models only")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--models", help="a comma-separated subset of the models (a shorter run)")
    parser.add_argument("--recalibrate-every", type=int, default=6, metavar="N",
                        help="recalibrate before every N torchvision models (and before the "
                             "training steps): the load drifts; 0: never")
    parser.add_argument("--profile", default=str(RESULTS / "prediction_profile.json"))
    parser.add_argument("--output", default=str(RESULTS / "prediction_validation.json"))
    parser.add_argument("--tables", action="store_true",
                        help="print the markdown tables of --output's results and stop")
    parser.add_argument("--plot", metavar="PNG",
                        help="draw predicted vs measured of --output's results (and of its "
                             "_2threads_chains file, when there) and stop")
    opts = parser.parse_args(argv)
    if opts.plot:
        runs = [("1 thread", json.loads(Path(opts.output).read_text()))]
        for suffix, label in (("_2threads_chains", "2 threads, real-time priority"),):
            other = Path(opts.output).with_name(Path(opts.output).stem + suffix + ".json")
            if other.exists():
                runs.append((label, json.loads(other.read_text())))
        return 0 if plot(runs, Path(opts.plot)) else 1
    if opts.tables:
        print(tables(json.loads(Path(opts.output).read_text())))
        return 0
    torch.set_num_threads(opts.threads)
    from benchmarks.models import torchvision_benches, transformer_benches

    probes: list[float] = []

    def calibrated() -> tuple[Hardware, float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        hw = calibrate(measure_this_machine(), threads=opts.threads)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert hw.calibration is not None
        probes.append(hw.calibration.parallel_add_s)  # the calibration's regime (rounds 10-11)
        return hw, wall, cpu

    hw, calibration_s, calibration_cpu_s = calibrated()
    first = hw
    Path(opts.profile).write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
    print(f"calibrated in {calibration_s:.0f} s ({calibration_cpu_s:.0f} s CPU)", file=sys.stderr,
          flush=True)
    rows: list[dict[str, Any]] = []
    device = torch.device("cpu")
    names = ["resnet18", "mobilenet_v3_large"] if opts.quick else None
    chosen = set(opts.models.split(",")) if opts.models else None
    vision = [b for b in torchvision_benches(names)  # every one of <= 2 GMACs, and VISION
              if (b.device == "cpu" or b.name in VISION) and (chosen is None or b.name in chosen)]
    recalibrations = []
    for i, bench in enumerate(vision):
        if i and opts.recalibrate_every and i % opts.recalibrate_every == 0:
            hw, again_s, _ = calibrated()  # calibration before each group, not tuning
            recalibrations.append(again_s)
            print(f"recalibrated in {again_s:.0f} s", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        rows.append(one(bench.name, "forward (torchvision, batch 1)", bench.build(device),
                        bench.inputs(device), hw, opts.repeat, False))
    if not opts.quick:
        hw, again_s, _ = calibrated()  # recalibrated before the group: calibration, not tuning
        recalibrations.append(again_s)
        print(f"recalibrated in {again_s:.0f} s", file=sys.stderr, flush=True)
        for bench in transformer_benches():
            if chosen is not None and bench.name not in chosen:
                continue
            torch.manual_seed(0)
            model = bench.build(device)
            rows.append(one(bench.name, "training step (AdamW, 128 tokens)", model,
                            bench.inputs(device), hw, max(3, opts.repeat - 2), True))
    rows += host_checks(hw, opts.repeat)
    result = summary(rows)
    bars = {fam: s["p90_abs_error"] for fam, s in result["families"].items() if s["n"] >= 3}
    bars["total"] = result["all models"]["p90_abs_error"]
    assert first.calibration is not None
    models = [r for r in rows if r["kind"] != "host check"]
    loads = [x for r in models for x in (r["load_before"], r["load_after"])]
    validation = {  # what measured the error bars, and their split by regime (round 11)
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": opts.threads,
        "load": [round(min(loads), 1), round(max(loads), 1)], "models": len(models),
        "p90_by_regime": {regime: result[f"all models, regime {regime}"]["p90_abs_error"]
                          for regime in ("as calibrated", "differs")
                          if result.get(f"all models, regime {regime}", {}).get("n", 0) >= 3}}
    hw = dataclasses.replace(first, calibration=dataclasses.replace(
        first.calibration, error_bars=bars, validation=validation))
    Path(opts.profile).write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
    out = {"threads": torch.get_num_threads(), "torch": torch.__version__,
           "clock": clock("cpu")[0], "calibration_s": calibration_s,
           "calibration_cpu_s": calibration_cpu_s, "calibrated": first.calibration.date,
           "recalibrations_s": recalibrations, "calibration_parallel_add_s": probes,
           "cpu_count": os.cpu_count(), "repeat": opts.repeat,
           "note": f"{opts.threads} torch thread(s) on a shared 2-core machine (other jobs "
                   "running: load average per model); measured = the median of plain runs by "
                   f"the calibration's clock ({clock('cpu')[0]}), wall time beside it",
           "summary": result, "error_bars": bars, "validation": validation, "rows": rows}
    Path(opts.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(result, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
