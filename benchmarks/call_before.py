"""What a small call costs after the call before it (issue 29, round 9): at 2 intra-op threads a
small call (under ATen's grain size: it runs on the main thread alone) right after a convolution
or a product took 4-10 us more than after an in-place add in round 8. Is the key the family of
the call before, or whether it ran a parallel region (the OpenMP worker then spins on the other
core for a while, or goes to sleep)?

Each condition is a producer call then a timed small call (the target), interleaved in rounds
in one process (a random order each round), the median over the rounds:

- producers: none (the target after itself, a loop); an in-place add over 690 KB (parallel at 2
  threads), the same bytes as 6 adds each under the grain size (serial), the add with
  ``torch.set_num_threads(1)`` around it (and its control with ``set_num_threads(2)``); a 1x1
  convolution of 440 channels over 7 x 7 and an ``mm`` of 440 x 440 by 440 x 49, each as is and
  with 1 thread set around it (and the control); the parallel add and the convolution followed
  by 20, 200 or 2,000 us of Python busy-waiting before the target;
- targets: ``relu`` of a 1 x 440 x 7 x 7 tensor of its own, ``mean`` over its pixels, a
  ``view``; ``relu`` of the convolution's or the product's output (21,560 elements each); after
  the adds, ``relu`` of the first or the last 21,560 elements of the added buffer (at 2 threads
  the main thread wrote the first half, the OpenMP worker the last); ``clamp_min`` (a ReLU)
  into a fresh output and into a kept buffer (``out=``), ``relu_`` of the producer's output;
  after the convolution or the product with its output freed before the target.

Each configuration runs in its own process: 2 threads, 2 threads with ``OMP_WAIT_POLICY=PASSIVE``
(the worker sleeps at once after a region instead of spinning), 1 thread.

    python -m benchmarks.call_before [--realtime] [--rounds N] [--output FILE]

``--realtime`` runs the children at SCHED_FIFO priority (root only). The figures are
differences within a process; absolute times on this shared machine are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, os, random, statistics, sys, time
import torch
import torch.nn.functional as F
threads, realtime, rounds = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
if realtime:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
torch.set_num_threads(threads)
torch.manual_seed(0)
C, P = 440, 7
small = torch.randn(1, C, P, P)
img = torch.randn(1, C, P, P)
w = torch.randn(C, C, 1, 1)
a, b = torch.randn(C, C), torch.randn(C, P * P)
big = torch.randn(172_480)  # 690 KB, over ATen's grain size (32,768 elements)
chunks = big.split(28_747)  # 6 slices each under it
now = time.perf_counter_ns

def spin(us):
    end = now() + us * 1000
    while now() < end:
        pass

def setting(n, fn):
    def run():
        torch.set_num_threads(n)
        out = fn()
        torch.set_num_threads(threads)
        return out
    return run

def gap(fn, us):
    def run():
        out = fn()
        spin(us)
        return out
    return run

def add_par():
    big.add_(0.0)
def add_ser():
    for c in chunks:
        c.add_(0.0)
conv = lambda: F.conv2d(img, w)
mm = lambda: torch.mm(a, b)
producers = {
    "loop": None, "add": add_par, "add (6 serial adds)": add_ser,
    "add, 1 thread set": setting(1, add_par), "add, 2 threads set": setting(2, add_par),
    "conv": conv, "conv, 1 thread set": setting(1, conv), "conv, 2 threads set": setting(2, conv),
    "mm": mm, "mm, 1 thread set": setting(1, mm), "mm, 2 threads set": setting(2, mm),
    "add + 20 us": gap(add_par, 20), "add + 200 us": gap(add_par, 200),
    "add + 2000 us": gap(add_par, 2000), "conv + 20 us": gap(conv, 20),
    "conv + 200 us": gap(conv, 200), "conv + 2000 us": gap(conv, 2000),
    "conv, its output freed": lambda: (conv(), None)[1],
    "conv, 1 thread set, its output freed": lambda: (setting(1, conv)(), None)[1],
    "mm, its output freed": lambda: (mm(), None)[1],
}
dst = torch.empty(1, C, P, P)
n = C * P * P
near, far = big[:n].view(1, C, P, P), big[-n:].view(1, C, P, P)
targets = {"relu": lambda out: torch.relu(small), "relu (clamp_min)": lambda out: torch.clamp_min(small, 0.0), "mean": lambda out: small.mean((2, 3)),
           "view": lambda out: small.view(-1),
           "relu of its output": lambda out: torch.relu(out),
           "relu (clamp_min) into a kept buffer": lambda out: torch.clamp_min(small, 0.0, out=dst),
           "relu_ of its output": lambda out: torch.relu_(out),
           "relu of its first 86 KB": lambda out: torch.relu(near),
           "relu of its last 86 KB": lambda out: torch.relu(far)}
conds = []
for p in producers:
    for t in targets:
        if t in ("relu of its output", "relu_ of its output") and (
                not p.startswith(("conv", "mm")) or "freed" in p):
            continue
        if t.startswith("relu of its") and "KB" in t and not p.startswith("add"):
            continue
        conds.append((p, t))
times = {c: [] for c in conds}
with torch.no_grad():
    for _ in range(3):
        for p, t in conds:
            fn = producers[p]
            out = fn() if fn is not None else small
            targets[t](out)
    for r in range(rounds):
        order = list(conds)
        random.Random(r).shuffle(order)
        for p, t in order:
            fn = producers[p]
            if fn is None:  # the target after itself
                out = targets[t](small)
                out = small
            else:
                out = fn()
            target = targets[t]
            start = now()
            target(out)
            times[(p, t)].append(now() - start)
res = {f"{p} -> {t}": statistics.median(v) / 1e3 for (p, t), v in times.items()}
print(json.dumps(res))
"""

CONFIGS = {"2 threads": (2, {}), "2 threads, OMP_WAIT_POLICY=PASSIVE": (2, {
    "OMP_WAIT_POLICY": "PASSIVE"}), "1 thread": (1, {})}


def run(threads: int, env_extra: dict[str, str], realtime: bool, rounds: int) -> dict[str, float]:
    """One configuration's medians: "producer -> target" -> microseconds."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(threads), str(int(realtime)),
                           str(rounds)], env=env, capture_output=True, text=True, check=True,
                          timeout=1800)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    """Time every configuration and print (and save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--realtime", action="store_true")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--configs", default=";".join(CONFIGS), help="names separated by ;")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    results = {name: run(*CONFIGS[name], args.realtime, args.rounds)
               for name in args.configs.split(";")}
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]
    print(f"load {load_before} -> {load_after}; realtime {args.realtime}; rounds {args.rounds}")
    names = list(results)
    rows = list(next(iter(results.values())))
    print(f"{'producer -> target (us)':36s}" + "".join(f"{n[:22]:>24s}" for n in names))
    for row in rows:
        print(f"{row:36s}" + "".join(f"{results[n].get(row, float('nan')):24.1f}" for n in names))
    if args.output:
        args.output.write_text(json.dumps({"load": [load_before, load_after],
                                           "realtime": args.realtime, "rounds": args.rounds,
                                           "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
