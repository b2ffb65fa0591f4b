"""Why 2-thread predictions miss on this machine (issue 29): torchvision forwards at batch 1
timed at 1 and 2 intra-op threads, interleaved in one process, with glibc's default allocator
and with its mmap and trim thresholds raised (``GLIBC_TUNABLES``: fresh outputs then come from
the heap, without page faults), each configuration in its own process.

    python -m benchmarks.thread_scaling [--realtime] [--models a,b] [--output FILE]

``--realtime`` runs the children at SCHED_FIFO priority (root only): other processes then get
the kernel's 5% real-time reserve, so the shared machine's other jobs do not stretch the
2-thread runs (a parallel region waits for its slowest thread). The figures are ratios within a
configuration; absolute times on this shared machine are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = ("densenet121", "efficientnet_b0", "mnasnet1_0", "mobilenet_v3_small",
          "regnet_x_1_6gf", "resnet50", "shufflenet_v2_x1_0")
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"

_CHILD = r"""
import json, os, statistics, sys, time
import torch, torchvision
if sys.argv[2] == "1":
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
out = {}
torch.manual_seed(0)
with torch.no_grad():
    for name in sys.argv[1].split(","):
        model = getattr(torchvision.models, name)(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        times = {1: [], 2: []}
        for _ in range(3):  # interleaved rounds
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for _ in range(3):
                    model(x)
                runs = []
                for _ in range(15):
                    start = time.perf_counter()
                    model(x)
                    runs.append(time.perf_counter() - start)
                times[threads].append(statistics.median(runs))
        out[name] = {str(k): min(v) for k, v in times.items()}
print(json.dumps(out))
"""


def run(models: list[str], realtime: bool, tunables: bool) -> dict[str, dict[str, float]]:
    """One configuration's times: model -> {threads: the fastest round's median seconds}."""
    env = dict(os.environ)
    if tunables:
        env["GLIBC_TUNABLES"] = TUNABLES
    else:
        env.pop("GLIBC_TUNABLES", None)
    done = subprocess.run([sys.executable, "-c", _CHILD, ",".join(models), str(int(realtime))],
                          env=env, capture_output=True, text=True, check=True, timeout=1800)
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    """Time the models in both configurations and print (and save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--realtime", action="store_true")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    models = args.models.split(",")
    load = os.getloadavg()[0]
    configs = {"default allocator": run(models, args.realtime, False),
               "mmap/trim thresholds raised": run(models, args.realtime, True)}
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}; realtime {args.realtime}")
    print(f"{'model':22s} " + "  ".join(f"{c:>34s}" for c in configs))
    for m in models:
        cells = [f"1t {t[m]['1'] * 1e3:6.1f} ms  2t {t[m]['2'] * 1e3:6.1f} ms  x{t[m]['1'] / t[m]['2']:.2f}"
                 for t in configs.values()]
        print(f"{m:22s} " + "  ".join(f"{c:>34s}" for c in cells))
    if args.output:
        args.output.write_text(json.dumps({
            "load_before": load, "load_after": os.getloadavg()[0], "realtime": args.realtime,
            "tunables": TUNABLES, "seconds": configs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
