"""What --hardware and --memory add to a count, measured so that a shared machine's load cancels.

resnet50 (1x3x224x224) is counted four ways: plainly, with a CallLog and an estimate on h100-sxm
(``--hardware``), with a MemoryTracker and its profile (``--memory``), and with both. Each way is
timed once per round, the rounds interleaved (the order rotates each round), so a change of load
on the machine hits every way alike; each way's figure is the median over rounds, and the
overhead is the median of the per-round ratios to the plain count of the same round (paired
ratios: a slow round is slow for both). Wall time and process CPU time are both kept: CPU time
is what the observers add, wall time what a user waits for. Done for a real CPU run (where the
forward's arithmetic dominates) and for a shape-only run (``shape_only=True``: no arithmetic, so
the observers' cost stands out). One torch thread by default (``--threads``): on a shared
machine OpenMP threads that wait for a busy core spin, which charges the wait to CPU time and
makes both clocks swing by several times between rounds.

``python -m benchmarks.estimate_overhead [--rounds 15] [--threads 1] [--out benchmarks/results/estimate_overhead.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import flopscope
from flopscope.estimate import PROFILES, CallLog, MemoryTracker

WAYS = ("plain", "hardware", "memory", "both")


def _ways(model: torch.nn.Module, x: torch.Tensor,
          shape_only: bool) -> dict[str, Callable[[], None]]:
    def counted(*observers: Any) -> None:
        with torch.no_grad():
            flopscope.count(model, x, warn=False, shape_only=shape_only, observers=observers)

    def plain() -> None:
        counted()

    def hardware() -> None:
        log = CallLog()
        counted(log)
        log.estimate(PROFILES["h100-sxm"])

    def memory() -> None:
        tracker = MemoryTracker()
        tracker.register(model.parameters(), "parameters")
        counted(tracker)
        tracker.profile()

    def both() -> None:
        log = CallLog()
        tracker = MemoryTracker()
        tracker.register(model.parameters(), "parameters")
        counted(log, tracker)
        log.estimate(PROFILES["h100-sxm"])
        tracker.profile()

    return {"plain": plain, "hardware": hardware, "memory": memory, "both": both}


def measure(rounds: int = 15, *, shape_only: bool = False) -> dict[str, Any]:
    """Interleaved timings of the four ways of counting resnet50.

    Args:
        rounds: timed rounds (each way once per round, after one untimed warm-up round).
        shape_only: count on meta tensors instead of running the forward.

    Returns:
        Per way: median and best wall and CPU seconds; per way but plain: the median, lowest
        and highest paired ratio to the plain count (wall and CPU); the load averages seen.
    """
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    ways = _ways(model, x, shape_only)
    for fn in ways.values():  # warm-up: first-call caches, page faults
        fn()
    wall: dict[str, list[float]] = {w: [] for w in WAYS}
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    loads: list[float] = []
    for r in range(rounds):
        order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
        for way in order:
            w0, c0 = time.perf_counter(), time.process_time()
            ways[way]()
            cpu[way].append(time.process_time() - c0)
            wall[way].append(time.perf_counter() - w0)
        loads.append(os.getloadavg()[0])
    out: dict[str, Any] = {"model": "resnet50 1x3x224x224", "shape_only": shape_only,
                           "rounds": rounds, "threads": torch.get_num_threads(),
                           "cpus": os.cpu_count(), "load_1min": {
                               "min": min(loads), "median": statistics.median(loads),
                               "max": max(loads)}}
    for way in WAYS:
        out[way] = {"wall_median_s": statistics.median(wall[way]), "wall_best_s": min(wall[way]),
                    "cpu_median_s": statistics.median(cpu[way]), "cpu_best_s": min(cpu[way])}
    for way in WAYS[1:]:
        for clock, table in (("wall", wall), ("cpu", cpu)):
            ratios = [a / b for a, b in zip(table[way], table["plain"], strict=True)]
            out[way][f"{clock}_ratio_median"] = statistics.median(ratios)
            out[way][f"{clock}_ratio_min"] = min(ratios)
            out[way][f"{clock}_ratio_max"] = max(ratios)
            out[way][f"{clock}_ratio_of_bests"] = min(table[way]) / min(table["plain"])
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """The overheads as a Markdown table."""
    lines = ["| run | way | median wall | median CPU | ratio to plain, wall (median; range) | "
             "ratio to plain, CPU (median; range) |",
             "| :--- | :--- | ---: | ---: | ---: | ---: |"]
    for res in results:
        run = "shape-only" if res["shape_only"] else "real CPU forward"
        for way in WAYS:
            row = res[way]
            if way == "plain":
                ratios = "1 | 1"
            else:
                ratios = " | ".join(
                    f"{row[f'{c}_ratio_median']:.3f} ({row[f'{c}_ratio_min']:.2f}-"
                    f"{row[f'{c}_ratio_max']:.2f})" for c in ("wall", "cpu"))
            lines.append(f"| {run} | {way} | {row['wall_median_s'] * 1e3:.1f} ms | "
                         f"{row['cpu_median_s'] * 1e3:.1f} ms | {ratios} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/estimate_overhead.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = [measure(args.rounds, shape_only=False), measure(args.rounds, shape_only=True)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
