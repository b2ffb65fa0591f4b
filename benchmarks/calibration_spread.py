"""How reproducible is a calibration? (issue 29, round 6): calibrate ``--calibrations`` times,
then predict the same models from every profile without timing the models again.

1. Calibrate K times (``flopscope.estimate.calibrate`` on the ``this-machine`` profile, the
   entry point ``flopscope calibrate`` runs), each profile written to ``--profiles`` (or read
   from there with ``--reuse``: the prediction of an earlier set of calibrations again).
2. Count each model once (its calls' records: a forward at batch 1 under ``no_grad``, or the
   AdamW training step ``flopscope.profile(train=True)`` counts) and predict the records from
   every profile (``CallLog.estimate``): prediction is cheap, timing is not; no model is timed.
3. Per model, the spread of its predicted time across the calibrations (max / min) and the
   family whose summed prediction moves most; per calibration point (family, operator, shape),
   the spread of its measured seconds, the largest listed.

    PYTHONPATH=src:. python -m benchmarks.calibration_spread [--calibrations 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flopscope.estimate import calibrate, measure_this_machine
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog

RESULTS = Path(__file__).parent / "results"
MODELS = ["mnasnet0_5", "mnasnet1_3", "mobilenet_v2", "efficientnet_b1", "efficientnet_b2",
          "densenet121", "resnet18", "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1",
          "mobilenet_v3_large", "convnext_tiny"]
"""The forwards of round 5's 90th-percentile misses and of some it predicted well."""


def spread(values: list[float]) -> float:
    """max / min of positive values (1.0: all equal)."""
    return max(values) / min(values)


def records(name: str) -> tuple[str, CallLog]:
    """(what ran, the counted calls' records) of one model: a torchvision forward at batch 1,
    or a transformer's AdamW training step (as the validation runs them)."""
    from benchmarks.models import torchvision_benches, transformer_benches
    from flopscope.core.counter import Counter
    from flopscope.execution.training import Step, default_loss, training_step

    device = torch.device("cpu")
    torch.manual_seed(0)
    log = CallLog()
    for bench in transformer_benches():
        if bench.name == name:
            model = bench.build(device)

            def counter(step: Step) -> Counter:
                return Counter(step.model, warn=False, observers=[log])

            training_step(model, bench.inputs(device), {}, optimizer="adamw",
                          loss_fn=default_loss, shape_only=False, counter=counter,
                          after=lambda step: None, on_retry=log.records.clear)
            return "training step", log
    bench = torchvision_benches([name])[0]
    model, args = bench.build(device), bench.inputs(device)
    with torch.no_grad(), Counter(model, warn=False, observers=[log]):
        model(*args)
    return "forward", log


def predict(log: CallLog, hw: Hardware) -> tuple[float, dict[str, float]]:
    """(predicted seconds, predicted seconds per family) of ``log``'s calls on ``hw``."""
    estimate = log.estimate(hw)
    return (estimate.total.predicted_s,
            {fam: row.predicted_s for fam, row in estimate.by_family.items()})


def point_spreads(profiles: list[Hardware]) -> list[dict[str, Any]]:
    """Per calibration point, its seconds in every profile and their spread, largest first."""
    seconds: dict[tuple[str, str, str, int, int], list[float]] = {}
    for hw in profiles:  # two workloads may share a name (what): their counts tell them apart
        assert hw.calibration is not None
        for p in hw.calibration.points:
            seconds.setdefault((p.family, p.dtype, p.what, p.flops, p.bytes), []).append(p.seconds)
    rows = [{"family": f, "dtype": d, "what": w, "flops": n, "bytes": b, "seconds": s,
             "spread": spread(s)}
            for (f, d, w, n, b), s in seconds.items() if len(s) == len(profiles)]
    return sorted(rows, key=lambda r: -r["spread"])


def main(argv: list[str] | None = None) -> int:
    """Calibrate K times (or reuse), predict the models from each, write the spreads."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrations", type=int, default=4, metavar="K")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default=",".join(MODELS + ["bert-base"]))
    parser.add_argument("--profiles", default=str(RESULTS / "calibration_spread"),
                        help="folder of the K profiles (calibration_<i>.json)")
    parser.add_argument("--start", type=int, default=0, metavar="N",
                        help="number the profiles from N (calibration_<N>.json on)")
    parser.add_argument("--only-calibrate", action="store_true",
                        help="write the profiles and stop (predict later with --reuse)")
    parser.add_argument("--reuse", action="store_true",
                        help="read the profiles already in --profiles; calibrate none")
    parser.add_argument("--output", default=str(RESULTS / "calibration_spread.json"))
    parser.add_argument("--no-preemption-filter", action="store_true",
                        help="keep every sample, preempted or not (an ablation: no context "
                             "switch is ever seen)")
    opts = parser.parse_args(argv)
    if opts.no_preemption_filter:
        import flopscope.estimate.timers as timers

        timers.switches = lambda: 0  # read at each call by batch_samples and rotation_samples
    torch.set_num_threads(opts.threads)
    folder = Path(opts.profiles)
    folder.mkdir(parents=True, exist_ok=True)
    profiles, taken = [], []
    for i in range(opts.start, opts.start + opts.calibrations):
        path = folder / f"calibration_{i}.json"
        if opts.reuse:
            profiles.append(Hardware.from_dict(json.loads(path.read_text()), where=str(path)))
            continue
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        hw = calibrate(measure_this_machine(), threads=opts.threads)
        taken.append({"wall_s": time.perf_counter() - start,
                      "cpu_s": time.process_time() - cpu, "load_before": load,
                      "load_after": os.getloadavg()[0]})
        path.write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
        profiles.append(hw)
        print(f"calibration {i}: {taken[-1]['wall_s']:.0f} s wall, {taken[-1]['cpu_s']:.0f} s "
              f"CPU, load {load:.1f}", file=sys.stderr, flush=True)
    if opts.only_calibrate:
        (folder / f"taken_{opts.start}.json").write_text(json.dumps(taken) + "\n")
        return 0
    models = []
    for name in opts.models.split(","):
        kind, log = records(name)
        predicted, fams = zip(*(predict(log, hw) for hw in profiles), strict=True)
        fam_spread = {f: spread([max(p.get(f, 0.0), 1e-12) for p in fams])
                      for f in fams[0] if fams[0][f] > 0.02 * predicted[0]}
        worst = max(fam_spread, key=lambda f: fam_spread[f])
        models.append({"model": name, "kind": kind, "predicted_s": list(predicted),
                       "spread": spread(list(predicted)), "family_spread": fam_spread,
                       "family_share": {f: fams[0][f] / predicted[0] for f in fam_spread}})
        print(f"{name:22s} {kind:13s} predicted {min(predicted) * 1e3:8.2f}-"
              f"{max(predicted) * 1e3:8.2f} ms  spread {spread(list(predicted)):.3f}  "
              f"most: {worst} {fam_spread[worst]:.3f}", file=sys.stderr, flush=True)
    points = point_spreads(profiles)
    by_family: dict[str, list[float]] = {}
    for p in points:
        by_family.setdefault(p["family"], []).append(p["spread"])
    families = {f: {"points": len(s), "median_spread": statistics.median(s), "max_spread": max(s)}
                for f, s in sorted(by_family.items())}
    for f, s in families.items():
        print(f"points {f:14s} n={s['points']:3d} median spread {s['median_spread']:.3f} "
              f"max {s['max_spread']:.3f}", file=sys.stderr)
    for p in points[:15]:
        print(f"  {p['spread']:.2f}  {p['family']:12s} {p['what']}", file=sys.stderr)
    spreads = [m["spread"] for m in models]
    out = {"threads": opts.threads, "calibrations": opts.calibrations, "taken": taken,
           "models": models, "median_model_spread": statistics.median(spreads),
           "max_model_spread": max(spreads), "point_families": families,
           "points": points[:40]}
    Path(opts.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"model spread: median {statistics.median(spreads):.3f}, max {max(spreads):.3f}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
