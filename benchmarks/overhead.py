"""Overhead: time to count one forward / time of a plain forward, single thread.

Every tool runs interleaved with plain forwards in one process: ``plain, tool A, plain, tool B, ...``
for several rounds (the tool order rotates each round). A tool's ratio in a round is its time over
the mean of the plain forwards just before and after it; the reported ratio is the median over
rounds, so a burst of load from other processes disturbs one round, not the result. Everything runs
under ``torch.no_grad()`` (the plain forward as an inference call, each tool as it is called).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import tools
from benchmarks.agreement import _TupleOutput
from benchmarks.models import Bench
from benchmarks.results_file import append_run

FLOOR = "bare dispatch mode"  # a TorchDispatchMode that only forwards: the floor of such tools


class _Bare(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def _timed(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def measure(bench: Bench, tool_names: list[str], rounds: int, log: Any = print,
            clock: str = "wall") -> dict[str, Any]:
    """Interleaved timings of ``bench`` for every tool; see the module docstring. ``clock``:
    ``wall`` (elapsed time) or ``cpu`` (this thread's CPU time: every tool runs in this thread,
    with one intra-op thread, so it is the whole work, less disturbed by other processes)."""
    tick = _CLOCKS[clock]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = bench.build(torch.device("cpu"))
        inputs = bench.inputs(torch.device("cpu"))

        def plain() -> None:
            model(*inputs)

        def counter(name: str) -> Callable[[], None]:
            if name == FLOOR:
                def floor() -> None:
                    with _Bare():
                        model(*inputs)

                return floor

            target = _TupleOutput(model) if name == "fvcore" and bench.family != "torchvision" \
                else model

            def run() -> None:
                result = tools.measure(name, target, inputs, False)
                if result.macs is None:
                    raise RuntimeError(result.error)

            return run

        usable: list[str] = []
        with torch.no_grad():
            plain()
            plain()
            for name in [*tool_names, FLOOR]:  # warm-up, and drop tools that fail on this model
                try:
                    counter(name)()
                    usable.append(name)
                except RuntimeError as e:
                    log(f"  {bench.name}: {name} skipped ({e})")
            ratios: dict[str, list[float]] = {n: [] for n in usable}
            seconds: dict[str, list[float]] = {n: [] for n in usable}
            plains: list[float] = []
            for r in range(rounds):
                order = usable[r % len(usable):] + usable[:r % len(usable)]
                before = _timed(plain, tick)
                plains.append(before)
                for name in order:
                    t = _timed(counter(name), tick)
                    after = _timed(plain, tick)
                    plains.append(after)
                    ratios[name].append(t / ((before + after) / 2))
                    seconds[name].append(t)
                    before = after
        return {
            "model": bench.name,
            "rounds": rounds,
            "clock": clock,
            "plain_seconds": statistics.median(plains),
            "tools": {n: {"ratio": statistics.median(ratios[n]), "seconds": statistics.median(seconds[n]),
                          "ratios": [round(x, 4) for x in ratios[n]]} for n in usable},
        }
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.overhead --models resnet50 mobilenet_v3_large --json FILE``: the
    measurement above for torchvision models, appended to ``FILE`` under ``--label`` with the
    load average before and after (run it with another checkout's ``src`` first on
    ``PYTHONPATH`` to compare versions, alternating processes)."""
    import argparse
    import json
    import os
    from pathlib import Path

    import flopscope
    from benchmarks.models import torchvision_benches

    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead")
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v3_large"])
    parser.add_argument("--tools", nargs="+", default=["flopscope", "ptflops", "FlopCounterMode"])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--label", default="")
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="wall",
                        help="wall (elapsed) or cpu (this thread's CPU time); default wall")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = [measure(bench, args.tools, args.rounds, clock=args.clock)
            for bench in torchvision_benches(args.models)]
    run = {"label": args.label, "flopscope_file": flopscope.__file__, "load_before": load_before,
           "load_after": os.getloadavg(), "rows": rows}
    print(json.dumps({"label": args.label, "load": [load_before[0], run["load_after"][0]],
                      "ratios": {r["model"]: {n: round(t["ratio"], 3) for n, t in r["tools"].items()}
                                 for r in rows}}))
    if args.json is not None:
        append_run(args.json, run)


if __name__ == "__main__":
    main()
