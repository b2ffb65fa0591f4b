"""Validate communication time and the planner against real gloo jobs on this machine (issues 29
and 31): predicted / measured per-rank step time and peak memory, and the planner's order of
the layouts against the measured order.

1. **Calibrate** before any job runs (microbenchmarks only, no model of the validation):
   - compute: ``flopscope.estimate.calibrate`` (1 thread) run in ``N`` processes at once, for
     N = 2 and 4: the rate a rank gets when N ranks share this machine's 2 cores (the points
     of the first process are kept); and once alone, for comparison;
   - links: ``flopscope calibrate --comm --ranks 4`` (:func:`flopscope.distributed.probe
     .calibrate_links`, gloo over loopback: groups of 4 and of 2), the same link block put into
     every profile.
   The profiles are written beside ``--output``: ``comm_profile_{alone,2,4}.json`` for the
   default output, ``<output's stem>_profile_{key}.json`` for another.
2. **Plan** (``flopscope.plan``) the model of :mod:`benchmarks.gloo_jobs` on 2 and 4 devices
   (one node: ``gpus_per_node`` = the ranks; float32; every layout, no memory budget), with
   each profile: per layout the predicted per-rank peak memory and step time.
3. **Run** each layout of :data:`benchmarks.gloo_jobs.JOBS` for real (gloo, one process per
   rank): forward + backward time per step (the slowest rank; median of ``--steps``), AdamW's
   step apart, per-rank peak memory from torch's profiler memory timeline.
4. **Compare**: predicted / measured forward + backward (the planned step less its optimizer
   update and accumulation), the planned update / AdamW's measured step (``optimizer_ratio``),
   predicted / measured peak memory, and the order: every pair of layouts on the same
   ranks whose measured times differ by more than the larger of their spreads, ordered the
   same way by the planner or not. The 90th percentile of ``|predicted / measured - 1|`` of
   the steps is written as ``error_bars["step"]`` into each profile's link calibration.

    PYTHONPATH=src python -m benchmarks.comm_validation [--steps 5] [--ranks 2] [--realtime]
        [--output FILE] [--tables]

``--ranks 2`` calibrates, plans and runs the 2-rank layouts only: each rank then has a core of
its own, as the planner's ranks-as-devices model assumes. ``--realtime`` runs everything at
SCHED_FIFO priority (root; the jobs' processes inherit it): the other processes on the machine
keep the kernel's 5% real-time reserve, so their load no longer spreads the measured steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.errors import quantile

RESULTS = Path(__file__).parent / "results"


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr,
          flush=True)


def _calibrate_one(index: int) -> dict[str, Any] | None:
    from flopscope.estimate import calibrate, get_hardware

    # the peaks for the bound come from epyc-like datasheet figures replaced below; only the
    # calibration block of this run is kept
    hw = calibrate(get_hardware("epyc-9654"), device="cpu", threads=1, budget_s=0.01)
    assert hw.calibration is not None
    return hw.calibration.to_dict() if index == 0 else None


def concurrent_calibration(processes: int) -> Any:
    """The compute calibration block measured by the first of ``processes`` processes running
    the microbenchmarks at once."""
    from flopscope.estimate.calibration import Calibration

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        blocks = pool.map(_calibrate_one, range(processes))
    return Calibration.from_dict(blocks[0], where=f"{processes} processes")


def profile_path(output: Path, key: str) -> Path:
    """Where the profile ``key`` of a run writing ``output`` goes."""
    if output == RESULTS / "comm_validation.json":
        return RESULTS / f"comm_profile_{key}.json"
    return output.with_name(f"{output.stem}_profile_{key}.json")


def profiles(output: Path, ranks: tuple[int, ...] = (2, 4)) -> dict[str, Any]:
    """Calibrate (step 1 of the module docstring) for jobs on ``ranks`` processes; returns the
    profiles by key."""
    from flopscope.distributed.probe import calibrate_links
    from flopscope.estimate import measure_this_machine

    torch.set_num_threads(1)
    base = measure_this_machine()
    out: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for key, n in (("alone", 1), *((str(r), r) for r in ranks)):
        start = time.perf_counter()
        cal = concurrent_calibration(n)
        seconds[key] = time.perf_counter() - start
        out[key] = dataclasses.replace(base, name=f"this-machine-{key}", calibration=cal)
        _say(f"compute calibration, {n} process(es) at once: {seconds[key]:.0f} s")
    start = time.perf_counter()
    linked = calibrate_links(base, max(ranks))
    seconds["links"] = time.perf_counter() - start
    cal = linked.link_calibration
    assert cal is not None
    _say(f"links: {seconds['links']:.0f} s, latency {cal.fit.latency * 1e6:.0f} us, bandwidth "
         f"{cal.fit.bandwidth / 1e9:.2f} GB/s, median fit error {cal.fit.error:.0%}")
    for key, hw in out.items():
        out[key] = dataclasses.replace(hw, link_calibration=cal,
                                       intra_node_bandwidth=linked.intra_node_bandwidth,
                                       intra_node_latency=linked.intra_node_latency)
        profile_path(output, key).write_text(json.dumps(out[key].to_dict(), indent=1) + "\n")
    out["seconds"] = seconds
    return out


def plans(hw: Any, ranks: int) -> dict[str, Any]:
    """The planner's layouts on ``ranks`` devices of profile ``hw``, by label."""
    import flopscope
    from benchmarks.gloo_jobs import CONFIG, SEQ

    plan = flopscope.plan("hf:llama", gpus=ranks, hardware=hw, gpus_per_node=ranks,
                          global_batch=ranks, seq_len=SEQ, dtype="float32", config=CONFIG,
                          memory_budget=1 << 40, sequence_parallel="search",
                          data_parallel="search")
    return {c.choice.label: {"memory_bytes": c.memory_bytes, "at_peak": c.at_peak,
                             "peak_where": c.peak_where, "time_s": c.time.to_dict(),
                             "compute": c.time.compute}
            for c in plan.ranked}


def _fwd_bwd(time_s: dict[str, float]) -> float:
    """A planned step less what runs after its backwards (the jobs time AdamW's step apart;
    plans before round 15 had neither part)."""
    return time_s["total"] - time_s.get("optimizer", 0.0) - time_s.get("accumulation", 0.0)


def compare(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Ratios and the order check for one profile ``key``."""
    out: dict[str, Any] = {"rows": [], "pairs": []}
    for r in rows:
        pred = r["predicted"][key]
        measured_peak = max(r["measured"]["peak_bytes"].values())
        step = _fwd_bwd(pred["time_s"])
        update = pred["time_s"].get("optimizer", 0.0)
        out["rows"].append({
            "name": r["name"], "ranks": r["job"]["world"],
            "predicted_step_s": step,
            "measured_step_s": r["measured"]["fwd_bwd_median_s"],
            "step_ratio": step / r["measured"]["fwd_bwd_median_s"],
            "predicted_optimizer_s": update,
            "measured_optimizer_s": r["measured"]["optimizer_median_s"],
            "optimizer_ratio": update / r["measured"]["optimizer_median_s"],
            "predicted_peak_bytes": pred["memory_bytes"], "measured_peak_bytes": measured_peak,
            "peak_ratio": pred["memory_bytes"] / measured_peak})
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["job"]["world"] != b["job"]["world"]:
                continue
            ma, mb = a["measured"], b["measured"]
            gap = abs(ma["fwd_bwd_median_s"] - mb["fwd_bwd_median_s"])
            spread = max(ma["fwd_bwd_spread_s"], mb["fwd_bwd_spread_s"])
            pa = _fwd_bwd(a["predicted"][key]["time_s"])
            pb = _fwd_bwd(b["predicted"][key]["time_s"])
            out["pairs"].append({
                "a": a["name"], "b": b["name"], "measured_gap_s": gap, "spread_s": spread,
                "distinct": gap > spread,
                "agree": (ma["fwd_bwd_median_s"] < mb["fwd_bwd_median_s"]) == (pa < pb)})
    steps = [abs(r["step_ratio"] - 1) for r in out["rows"]]
    updates = [r["optimizer_ratio"] for r in out["rows"]]
    peaks = [abs(r["peak_ratio"] - 1) for r in out["rows"]]
    distinct = [p for p in out["pairs"] if p["distinct"]]
    out["summary"] = {
        "step_median_abs_error": quantile(steps, 0.5), "step_p90_abs_error": quantile(steps, 0.9),
        "peak_median_abs_error": quantile(peaks, 0.5), "peak_max_abs_error": max(peaks),
        "pairs_distinct": len(distinct), "pairs_agree": sum(p["agree"] for p in distinct),
        "optimizer_ratio_median": quantile(updates, 0.5),
        "optimizer_ratio_range": [min(updates), max(updates)]}
    return out


def repredict(output: Path, to: Path) -> int:
    """The jobs of a finished run (``output``) planned again with its saved profiles by this
    code, against the same measured times: a change to the planner checked without running
    the jobs again."""
    from flopscope.estimate import load_hardware

    old = json.loads(output.read_text())
    rows = old["rows"]
    worlds = sorted({r["job"]["world"] for r in rows})
    keys = {k for r in rows for k in r["predicted"] if k != "concurrent"}
    for key in sorted(keys):
        (hw,) = load_hardware(profile_path(output, key))
        for world in worlds:
            if key != "alone" and key != str(world):
                continue
            planned = plans(hw, world)
            for r in rows:
                if r["job"]["world"] == world:
                    r["predicted"][key] = planned[r["label"]]
    for r in rows:
        r["predicted"]["concurrent"] = r["predicted"][str(r["job"]["world"])]
    result = {key: compare(rows, key) for key in ("concurrent", "alone")}
    to.write_text(json.dumps({**old, "repredicted_from": output.name, "comparison": result,
                              "rows": rows}, indent=1) + "\n")
    print(json.dumps({k: v["summary"] for k, v in result.items()}, indent=1), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Calibrate, plan, run, compare; write benchmarks/results/comm_validation.json."""
    from benchmarks.gloo_jobs import JOBS, run_job

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--output", default=str(RESULTS / "comm_validation.json"))
    parser.add_argument("--jobs", default="", help="comma-separated job indices (default all)")
    parser.add_argument("--ranks", default="2,4", help="the jobs' process counts (2, 4)")
    parser.add_argument("--realtime", action="store_true",
                        help="run at SCHED_FIFO priority (root): other processes' load stays out")
    parser.add_argument("--tables", action="store_true",
                        help="print the markdown tables of --output's results and stop")
    parser.add_argument("--repredict", metavar="OUT",
                        help="plan --output's jobs again with its saved profiles (this code), "
                             "compare with its measured times, write OUT and stop")
    opts = parser.parse_args(argv)
    if opts.repredict:
        return repredict(Path(opts.output), Path(opts.repredict))
    if opts.tables:
        from benchmarks.comm_tables import tables

        print(tables(json.loads(Path(opts.output).read_text())))
        return 0
    if opts.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    ranks = tuple(int(r) for r in opts.ranks.split(","))
    output = Path(opts.output)
    start = time.perf_counter()
    hws = profiles(output, ranks)
    seconds = hws.pop("seconds")
    predicted: dict[str, dict[int, dict[str, Any]]] = {}
    for key, hw in hws.items():
        for world in ranks:
            if key != "alone" and key != str(world):
                continue
            t = time.perf_counter()
            predicted.setdefault(key, {})[world] = plans(hw, world)
            _say(f"plan on {world} with profile {key}: {time.perf_counter() - t:.0f} s")
    jobs = [JOBS[int(i)] for i in opts.jobs.split(",")] if opts.jobs else JOBS
    jobs = [job for job in jobs if job.world in ranks]
    rows = []
    for job in jobs:
        measured = run_job(job, steps=opts.steps)
        pred = {key: by[job.world][job.label] for key, by in predicted.items()
                if job.world in by}
        pred["concurrent"] = pred[str(job.world)]
        rows.append({"name": job.name, "job": measured["job"], "label": job.label,
                     "measured": measured, "predicted": pred})
        c = pred["concurrent"]
        _say(f"{job.name}: fwd+bwd {measured['fwd_bwd_median_s'] * 1e3:.0f} ms (spread "
             f"{measured['fwd_bwd_spread_s'] * 1e3:.0f}), predicted "
             f"{c['time_s']['total'] * 1e3:.0f} ms; peak "
             f"{max(measured['peak_bytes'].values()) / 2**20:.1f} MiB, predicted "
             f"{c['memory_bytes'] / 2**20:.1f} MiB")
    result = {key: compare(rows, key) for key in ("concurrent", "alone")}
    bar = result["concurrent"]["summary"]["step_p90_abs_error"]
    for key, hw in hws.items():
        cal = hw.link_calibration
        hw = dataclasses.replace(hw, link_calibration=dataclasses.replace(
            cal, error_bars={"step": bar}))
        profile_path(output, key).write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
    out = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "steps": opts.steps,
           "ranks": list(ranks), "realtime": opts.realtime,
           "calibration_s": seconds, "total_s": time.perf_counter() - start,
           "note": "gloo over loopback on a shared 2-core machine (other jobs running: load "
                   "average per job); 1 torch thread per rank",
           "comparison": result, "rows": rows}
    output.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v["summary"] for k, v in result.items()}, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
