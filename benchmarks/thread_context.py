"""Where a model's small calls lose time at 2 threads (issue 29, round 10).

Two experiments, each at 1 and at 2 intra-op threads in a process of its own:

- **ablation**: the in-model cost of a model's activation calls (every ``nn.ReLU``,
  ``nn.ReLU6`` and ``nn.Hardswish`` module replaced by ``nn.Identity``), as the difference of
  whole plain runs of the model and its stripped copy (interleaved, the median of the paired
  differences), against the difference of their predictions (a profile calibrated in the same
  process first, as the validation does) and against what the validation's per-operator join
  (:func:`benchmarks.prediction_validation.captured_by_op`) reads for those calls. It says
  whether the element-wise family's low ratio in the validation is in the model or in the join,
  and how much of a model's gap it is.
- **producer**: a model's pattern, a 1x1 convolution, an eval-mode batch norm, an in-place ReLU,
  timing the ReLU alone: in that order; with the batch norm at 1 thread (its output written by
  the main thread alone); and the ReLU after itself (a loop, what a calibration point sees). At
  2 threads a ReLU under ATen's grain size (32,768 elements) runs on the main thread and reads
  and writes what the OpenMP worker wrote of the batch norm's output.

With ``--regimes N``: N fresh processes at 2 threads and N at 1 thread, alternated, each timing
the forwards of :data:`MODELS`' first three (the median of 20 plain runs after 3): how far apart
the same forward runs in different processes at each thread count.

    python -m benchmarks.thread_context [--realtime] [--regimes N] [--output FILE]

``--realtime`` runs the children at SCHED_FIFO priority (root only). Absolute times on this
shared machine move by 20-30% between processes; the figures are differences within one.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from torch import nn

MODELS = ("regnet_y_400mf", "shufflenet_v2_x1_0", "mobilenet_v3_large", "resnet18")
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.Hardswish)
SHAPES = ((116, 14), (232, 7), (58, 28), (24, 56))  # shufflenet_v2-like: 11-75 K elements


def strip_activations(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every activation module of :data:`ACTIVATIONS` an identity."""
    out = copy.deepcopy(model)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ACTIVATIONS):
                setattr(parent, name, nn.Identity())
    return out


def is_activation_op(op: str) -> bool:
    """Whether an ATen operator's name is one of the stripped activations' kernels."""
    return any(k in op for k in ("relu", "hardswish", "hardtanh"))


def ablation(threads: int, pairs: int = 40) -> list[dict[str, float | str | int]]:
    """Per model of :data:`MODELS`: the activations' measured, predicted and joined seconds."""
    import statistics
    import time

    import torch

    import flopscope
    from benchmarks.models import torchvision_benches
    from benchmarks.prediction_validation import _step, captured_by_op
    from flopscope.estimate import calibrate, measure_this_machine

    hw = calibrate(measure_this_machine(), threads=threads)
    rows: list[dict[str, float | str | int]] = []
    for bench in torchvision_benches(list(MODELS)):
        torch.manual_seed(0)
        full = bench.build(torch.device("cpu"))
        args = bench.inputs(torch.device("cpu"))
        stripped = strip_activations(full)
        predicted = []
        for model in (full, stripped):
            _, timing = flopscope.profile(model, *args, hardware=hw, repeat=1, warmup=1)
            predicted.append(sum(c.bound.predicted_s for c in timing.calls
                                 if c.bound is not None))
            if model is full:
                calls = sum(1 for c in timing.calls if is_activation_op(c.op))
        run_full, run_stripped = _step(full, args, False), _step(stripped, args, False)
        for _ in range(3):
            run_full()
            run_stripped()
        whole, diffs = [], []
        for _ in range(pairs):
            start = time.perf_counter()
            run_full()
            middle = time.perf_counter()
            run_stripped()
            end = time.perf_counter()
            whole.append(middle - start)
            diffs.append((middle - start) - (end - middle))
        joined = sum(s for op, s in captured_by_op(run_full).items() if is_activation_op(op))
        rows.append({"model": bench.name, "threads": threads, "activation_calls": calls,
                     "measured_s": statistics.median(whole), "predicted_s": predicted[0],
                     "activations_measured_s": statistics.median(diffs),
                     "activations_predicted_s": predicted[0] - predicted[1],
                     "activations_joined_s": joined, "load": os.getloadavg()[0]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def producer(threads: int, rounds: int = 300) -> list[dict[str, float | str | int]]:
    """Per shape of :data:`SHAPES`: the in-place ReLU's median time after each producer."""
    import random
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    random.seed(0)
    torch.manual_seed(0)
    cases = {}
    for channels, pixels in SHAPES:
        cases[(channels, pixels)] = (torch.randn(1, channels, pixels, pixels),
                                     torch.randn(channels, channels, 1, 1),
                                     torch.zeros(channels), torch.ones(channels))
    modes = ("model order", "batch norm at 1 thread", "after itself")

    def once(key: tuple[int, int], mode: str) -> float:
        x, w, mean, var = cases[key]
        y = F.conv2d(x, w)
        if mode == "batch norm at 1 thread":
            torch.set_num_threads(1)
        z = F.batch_norm(y, mean, var, var, mean, False)
        torch.set_num_threads(threads)
        if mode == "after itself":
            for _ in range(3):
                torch.relu_(z)
        start = time.perf_counter()
        torch.relu_(z)
        return time.perf_counter() - start

    samples: dict[tuple[tuple[int, int], str], list[float]] = {
        (k, m): [] for k in cases for m in modes}
    for _ in range(rounds):
        order = list(samples)
        random.shuffle(order)
        for key, mode in order:
            samples[(key, mode)].append(once(key, mode))
    return [{"shape": f"1x{c}x{p}x{p}", "elements": c * p * p, "threads": threads,
             **{mode: statistics.median(samples[((c, p), mode)]) for mode in modes}}
            for c, p in SHAPES]


def forwards(threads: int, runs: int = 20) -> dict[str, float]:
    """The median seconds of a forward of each of :data:`MODELS`' first three, in this process."""
    import statistics
    import time

    import torch

    from benchmarks.models import torchvision_benches
    from benchmarks.prediction_validation import _step

    torch.set_num_threads(threads)
    out = {}
    for bench in torchvision_benches(list(MODELS[:3])):
        torch.manual_seed(0)
        run = _step(bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu")), False)
        for _ in range(3):
            run()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        out[bench.name] = statistics.median(times)
    return out


def spread(processes: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per model: the smallest, median and largest of its per-process times, and largest /
    smallest."""
    import statistics

    out = {}
    for name in processes[0]:
        values = [p[name] for p in processes]
        out[name] = {"min_s": min(values), "median_s": statistics.median(values),
                     "max_s": max(values), "max_over_min": max(values) / min(values)}
    return out


def _child(threads: int, realtime: bool) -> dict[str, object]:
    if realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    import torch

    torch.set_num_threads(threads)
    return {"threads": threads, "producer": producer(threads), "ablation": ablation(threads)}


def main(argv: list[str] | None = None) -> int:
    """Run both experiments at 1 and 2 threads, each in a child process; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realtime", action="store_true", help="SCHED_FIFO children (root)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results"
                                                / "thread_context.json"))
    parser.add_argument("--regimes", type=int, metavar="N",
                        help="N fresh processes per thread count timing forwards (only that)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--forwards", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        if opts.realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        if opts.forwards:
            print(json.dumps(forwards(opts.child)))
        else:
            print(json.dumps(_child(opts.child, False)))
        return 0
    if opts.regimes:
        per: dict[int, list[dict[str, float]]] = {2: [], 1: []}
        for _ in range(opts.regimes):
            for threads in per:
                cmd = [sys.executable, "-m", "benchmarks.thread_context", "--child", str(threads),
                       "--forwards"] + (["--realtime"] if opts.realtime else [])
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                per[threads].append(json.loads(done.stdout.strip().splitlines()[-1]))
        result = {f"{t} thread(s)": {"processes": ps, "spread": spread(ps)} for t, ps in per.items()}
        Path(opts.output).write_text(json.dumps(result, indent=1) + "\n")
        for key, value in result.items():
            for name, row in value["spread"].items():
                print(key, name, {k: round(v, 4) for k, v in row.items()})
        return 0
    runs = []
    for threads in (2, 1):
        cmd = [sys.executable, "-m", "benchmarks.thread_context", "--child", str(threads)]
        if opts.realtime:
            cmd.append("--realtime")
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    Path(opts.output).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    for run in runs:
        for row in run["producer"]:
            print(row)
        for row in run["ablation"]:
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
