"""What besides instructions could make a count dearer in time: page faults and the garbage
collector, per call, next to the CPU time.

One process, one thread, ``torch.no_grad()``; rounds of ``plain, bare dispatch mode, flopscope,
ptflops`` (the order rotating each round), each call measured with ``getrusage(RUSAGE_THREAD)``
(minor page faults) and ``gc.callbacks`` (collections and their CPU time); medians over rounds.
``python -m benchmarks.overhead_causes mobilenet_v3_large 224 9``.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import tools
from benchmarks.overhead import _Bare


def measure(name: str, size: int, rounds: int) -> dict[str, dict[str, float]]:
    """Medians per tool: CPU ms, ratio to plain, minor faults, collections and their ms."""
    import torchvision

    import flopscope

    torch.set_num_threads(1)
    model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, size, size)
    collections = [0, 0.0, 0.0]  # runs, seconds, start

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections[0] += 1
            collections[2] = time.thread_time()
        else:
            collections[1] += time.thread_time() - collections[2]

    def bare() -> None:
        with _Bare():
            model(x)

    runs: dict[str, Callable[[], Any]] = {
        "plain": lambda: model(x), "bare dispatch mode": bare,
        "flopscope": lambda: flopscope.count(model, x, warn=False),
        "ptflops": lambda: tools.measure("ptflops", model, (x,), False)}
    rows: dict[str, list[tuple[float, int, float, float]]] = {n: [] for n in runs}
    gc.callbacks.append(seen)
    try:
        with torch.no_grad():
            for fn in [*runs.values()] * 2:
                fn()
            for r in range(rounds):
                names = list(runs)[r % 4:] + list(runs)[:r % 4]
                for n in names:
                    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
                    runs0, secs0 = collections[0], collections[1]
                    t = time.thread_time()
                    runs[n]()
                    t = time.thread_time() - t
                    rows[n].append((t, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
                                    - faults, collections[0] - runs0, collections[1] - secs0))
    finally:
        gc.callbacks.remove(seen)
    plain = statistics.median(v[0] for v in rows["plain"])
    return {n: {"cpu_ms": statistics.median(v[0] for v in r) * 1e3,
                "ratio": statistics.median(v[0] for v in r) / plain,
                "minor_faults": statistics.median(v[1] for v in r),
                "collections": statistics.median(v[2] for v in r),
                "gc_ms": statistics.median(v[3] for v in r) * 1e3} for n, r in rows.items()}


def main(argv: list[str] | None = None) -> None:
    """``[MODEL [SIZE [ROUNDS]]]``: print the table and the load average before and after."""
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "mobilenet_v3_large"
    size = int(args[1]) if len(args) > 1 else 224
    rounds = int(args[2]) if len(args) > 2 else 9
    load = os.getloadavg()[0]
    result = measure(name, size, rounds)
    print(f"{name} {size}x{size}, load {load:.2f} -> {os.getloadavg()[0]:.2f}")
    for n, v in result.items():
        print(f"  {n:20s} {v['cpu_ms']:8.1f} ms  {v['ratio']:.3f}  minor faults {v['minor_faults']:6.0f}"
              f"  collections {v['collections']:.0f} ({v['gc_ms']:.2f} ms)")


if __name__ == "__main__":
    main()
