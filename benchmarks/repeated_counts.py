"""Repeated counts: what a count leaves to Python's cyclic garbage collector, and what a long run
of counts costs per count once the collections it causes are paid.

The interleaved ratios of :mod:`benchmarks.overhead` are medians over a dozen rounds: a cost paid
once every hundred counts (a full collection of the process's objects, 150-250 ms with torch and
torchvision imported) falls in no median. A program that counts many models or configurations in
one process pays it, amortized. For each tool, in one process, one thread, ``torch.no_grad()``:

- ``cycles``: the objects one call leaves in reference cycles (found by ``gc.collect()`` after the
  call, with the collector off during it): freed only by the cyclic collector;
- a block of ``--calls`` consecutive calls (a ``gc.collect()`` first, so every block starts with
  nothing pending), timed in this thread's CPU time: the mean per call (the mean, not a median,
  so the collections are in it), over the mean plain forward of the plain blocks; and the time
  spent in collections per call (``gc.callbacks``), the full ones (generation 2) apart; then the
  tracked objects the block added per call (``len(gc.get_objects())``, no collection between) and
  the CPU time of the ``gc.collect()`` after it, per call: the full collection that a long run
  pays sooner or later (``flopscope.count`` freezes the heap while it runs, so no collection during
  a count ever scans the objects of earlier counts).

Blocks run ``plain, tool, plain, tool, ...``, the tool order reversed in the second repeat.
``python -m benchmarks.repeated_counts --models mobilenet_v3_large --calls 300 --json FILE``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import tools
from benchmarks.overhead import FLOOR, _Bare
from benchmarks.results_file import append_run

TOOLS = ("flopscope", "ptflops", FLOOR)


class _Collections:
    """CPU time and number of the garbage collector's runs, per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            generation = info["generation"]
            self.runs[generation] += 1
            self.seconds[generation] += time.thread_time() - self._start


def cycles(fn: Callable[[], Any]) -> int:
    """How many objects one call of ``fn`` leaves in reference cycles: the objects that existed
    before it are held while it runs, so garbage that an earlier job left for the collector and
    that becomes collectable during the call (torch's autograd hooks release Python closures when
    their C++ nodes die) is not taken for the call's."""
    for _ in range(10):  # until nothing is left: a collection's finalizers can make more garbage
        if not gc.collect():
            break
    gc.disable()
    try:
        before = gc.get_objects()
        fn()
        found = gc.collect()
        del before
        return found
    finally:
        gc.enable()


def block(fn: Callable[[], Any], calls: int, seen: _Collections) -> dict[str, float]:
    """Mean CPU time per call of ``calls`` consecutive calls, and the collections' share; then
    what the block left for the cyclic collector: tracked objects added per call, and the CPU
    time of the full collection that frees them (per call)."""
    gc.collect()
    objects = len(gc.get_objects())
    runs, seconds = list(seen.runs), list(seen.seconds)
    start = time.thread_time()
    for _ in range(calls):
        fn()
    total = time.thread_time() - start
    timings = {"per_call": total / calls,
               "gc_per_call": (sum(seen.seconds) - sum(seconds)) / calls,
               "full_gc_per_call": (seen.seconds[2] - seconds[2]) / calls,
               "full_collections": seen.runs[2] - runs[2],
               "objects_left_per_call": (len(gc.get_objects()) - objects) / calls}
    start = time.thread_time()
    gc.collect()
    return {**timings, "collect_after_per_call": (time.thread_time() - start) / calls}


def measure(name: str, size: int, calls: int, tool_names: list[str]) -> dict[str, Any]:
    """The garbage and the block timings of every tool on one torchvision model."""
    import torchvision

    torch.set_num_threads(1)
    model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, size, size)

    def run(tool: str) -> Callable[[], Any]:
        if tool == FLOOR:
            def bare() -> None:
                with _Bare():
                    model(x)
            return bare
        return lambda: tools.measure(tool, model, (x,), False)

    fns = {t: run(t) for t in tool_names}
    seen = _Collections()
    gc.callbacks.append(seen)
    try:
        with torch.no_grad():
            for fn in [lambda: model(x), *fns.values()] * 2:  # warm-up
                fn()
            left = {t: cycles(fn) for t, fn in fns.items()}
            t0 = time.thread_time()
            gc.collect()
            full_collection = time.thread_time() - t0
            plains: list[float] = []
            blocks: dict[str, list[dict[str, float]]] = {t: [] for t in fns}
            for order in (list(fns), list(fns)[::-1]):
                for tool in order:
                    plains.append(block(lambda: model(x), calls, seen)["per_call"])
                    blocks[tool].append(block(fns[tool], calls, seen))
                plains.append(block(lambda: model(x), calls, seen)["per_call"])
    finally:
        gc.callbacks.remove(seen)
    plain = sum(plains) / len(plains)
    return {"model": name, "size": size, "calls": calls, "plain_seconds": plain,
            "objects_tracked": len(gc.get_objects()), "full_collection_seconds": full_collection,
            "tools": {t: {"cycles_per_call": left[t],
                          "ratio": [round(b["per_call"] / plain, 4) for b in blocks[t]],
                          "gc_per_call_over_plain": [round(b["gc_per_call"] / plain, 4)
                                                     for b in blocks[t]],
                          "full_gc_per_call_over_plain": [round(b["full_gc_per_call"] / plain, 4)
                                                          for b in blocks[t]],
                          "full_collections": [b["full_collections"] for b in blocks[t]],
                          "objects_left_per_call": [round(b["objects_left_per_call"])
                                                    for b in blocks[t]],
                          "collect_after_per_call_over_plain": [
                              round(b["collect_after_per_call"] / plain, 4) for b in blocks[t]]}
                      for t in fns}}


def main(argv: list[str] | None = None) -> None:
    """Run :func:`measure` for each model; print and optionally append to ``--json``."""
    import flopscope

    parser = argparse.ArgumentParser(prog="python -m benchmarks.repeated_counts")
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_large", "resnet50"])
    parser.add_argument("--tools", nargs="+", default=list(TOOLS))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = [measure(m, args.size, args.calls, args.tools) for m in args.models]
    run = {"label": args.label, "flopscope_file": flopscope.__file__,
           "load": [load, os.getloadavg()[0]], "rows": rows}
    print(json.dumps({"label": args.label, "load": run["load"],
                      "rows": [{k: r[k] for k in ("model", "full_collection_seconds", "tools")}
                               for r in rows]}))
    if args.json is not None:
        append_run(args.json, run)


if __name__ == "__main__":
    main()
