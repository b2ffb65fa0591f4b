"""Where a real count's time goes beyond a bare dispatch mode, stage by stage.

One process, one thread, ``torch.no_grad()``; rounds of ``plain, stage, plain`` for each stage in
turn (the ratio of a stage in a round is its time over the mean of the two plain forwards around
it; the median over rounds is reported), timed in this thread's CPU time so that other processes
on a shared machine disturb it less. The stages add flopscope's work one piece at a time:

- ``bare dispatch mode``: a ``TorchDispatchMode`` that only forwards each call (the floor of any
  tool that sees every operator);
- ``bare + module listener``: the same with flopscope's module-call listener installed
  (:mod:`flopscope.core.module_calls`) and doing nothing;
- ``Counter block``: ``with Counter(model): model(x)``: the module tracker, the costing and the
  ledger of every call, without the model snapshot, the copy on write or the report;
- ``Counter block + report``: the same and the report made;
- ``count``: ``flopscope.count(model, x)``: everything (snapshot, copy on write, restore, report).

``python -m benchmarks.count_split --models mobilenet_v3_large resnet50 --json FILE``.
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
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.results_file import append_run

STAGES = ("bare dispatch mode", "bare + module listener", "Counter block",
          "Counter block + report", "count")


class _Bare(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _nothing(*args: Any) -> None:
    return None


def measure(name: str, size: int, rounds: int) -> dict[str, Any]:
    """The median ratio of every stage to the plain forward for one torchvision model."""
    import torchvision

    import flopscope
    from flopscope.core import module_calls

    torch.set_num_threads(1)
    model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, size, size)

    def bare() -> None:
        with _Bare():
            model(x)

    def listened() -> None:
        pair = module_calls.listen(_nothing, _nothing)
        try:
            with _Bare():
                model(x)
        finally:
            module_calls.stop_listening(pair)

    def block(report: bool) -> Callable[[], None]:
        def run() -> None:
            counter = flopscope.Counter(model, warn=False)
            counter.memo_shape_only = False  # as count() does for real tensors
            with counter:
                model(x)
            if report:
                counter.make_report()
        return run

    stages: dict[str, Callable[[], Any]] = {
        "bare dispatch mode": bare, "bare + module listener": listened,
        "Counter block": block(False), "Counter block + report": block(True),
        "count": lambda: flopscope.count(model, x, warn=False)}
    ratios: dict[str, list[float]] = {s: [] for s in stages}
    clock = time.thread_time
    with torch.no_grad():
        for fn in [lambda: model(x), *stages.values()] * 2:  # warm-up
            fn()
        for _ in range(rounds):
            for stage, fn in stages.items():
                t0 = clock()
                model(x)
                t1 = clock()
                fn()
                t2 = clock()
                model(x)
                t3 = clock()
                ratios[stage].append((t2 - t1) / ((t1 - t0 + t3 - t2) / 2))
    return {"model": name, "size": size, "rounds": rounds,
            "ratio": {s: round(statistics.median(v), 4) for s, v in ratios.items()},
            "ratios": {s: [round(r, 4) for r in v] for s, v in ratios.items()}}


def main(argv: list[str] | None = None) -> None:
    """Run :func:`measure` for each model; print and optionally append to ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.count_split")
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_large", "resnet50"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = [measure(m, args.size, args.rounds) for m in args.models]
    run = {"label": args.label, "load": [load, os.getloadavg()[0]], "rows": rows}
    print(json.dumps({"label": args.label, "load": run["load"],
                      "ratio": {r["model"]: r["ratio"] for r in rows}}))
    if args.json is not None:
        append_run(args.json, run)


if __name__ == "__main__":
    main()
