"""Shape-only counting against a plain forward (issue 19): ``python -m benchmarks.shape_only``.

Part 1, in one process, single thread, everything under ``torch.no_grad()`` (``--clock cpu``:
timed in this thread's CPU time instead of wall time, for a shared machine): rounds of
``plain, tool, plain, tool, ...`` (the tool order rotates each round); a tool's ratio in a round
is its time over the mean of the plain forwards around it, and the table gives the median over
rounds. Tools:

- ``shape_only``: ``flopscope.count(model, x, shape_only=True)`` on the real model;
- ``meta``: ``flopscope.count(meta_model, x)`` on the same model built on ``meta``;
- ``FlopCounterMode``: torch's counter around ``meta_model(x_meta)``;
- ``meta forward``: ``meta_model(x_meta)`` with no mode at all (torch's meta kernels, many in
  Python);
- ``dispatch floor``: ``meta_model(x_meta)`` under a dispatch mode that only makes each call's
  outputs from the metadata flopscope remembers (:mod:`flopscope.core.memo`): the Python dispatch of
  every operator call, with nothing counted. flopscope's own work per call is ``meta`` minus this.

The counts after the first are warm: the meta outputs remembered per (operator, argument
metadata) are kept for the process. The first count in a fresh process (cold) is measured apart.

Part 2: the 70B-shaped Llama of :mod:`benchmarks.scale` at 2,048 and 131,072 tokens, flopscope and
FlopCounterMode alternating in fresh processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODELS = ("resnet50", "vit_b_16", "mobilenet_v3_large", "bert-base")
TOOLS = ("shape_only", "meta", "FlopCounterMode", "meta forward", "dispatch floor")


def _build(name: str, device: str) -> tuple[nn.Module, tuple[Any, ...]]:
    from benchmarks.models import tiny_benches, torchvision_benches, transformer_benches

    benches = {b.name: b for b in tiny_benches()}
    if name == "bert-base":
        benches.update({b.name: b for b in transformer_benches()})
    elif name not in benches:
        benches.update({b.name: b for b in torchvision_benches([name])})
    bench = benches[name]
    dev = torch.device(device)
    model = bench.build(dev)
    if device == "meta" and not all(p.is_meta for p in model.parameters()):
        model = model.to("meta")
    return model, bench.inputs(torch.device("cpu"))


class _Floor(torch.utils._python_dispatch.TorchDispatchMode):
    """Each call's outputs made from remembered metadata, nothing counted (the dispatch floor)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        from flopscope.core import memo as _memo

        kwargs = kwargs or {}
        self.calls += 1
        key = _memo.signature(id(func), args, kwargs)
        if key is not None:
            made = _memo.OUTPUTS.get(key)
            if made is not None:
                return args[0] if made is _memo.SELF else _memo.replay(made)
            out = func(*args, **kwargs)
            made = _memo.outputs_of(func, args, out)
            if made:
                _memo.remember(key, made)
            return out
        return func(*args, **kwargs)


_CLOCK = [time.perf_counter]  # --clock cpu: time.thread_time (this thread's CPU time)


def _timed(fn: Callable[[], Any]) -> float:
    clock = _CLOCK[0]
    start = clock()
    fn()
    return clock() - start


def measure_model(name: str, rounds: int, log: Any = print) -> dict[str, Any]:
    """Part 1 for one model: median ratios to the plain forward, and per-call costs."""
    from torch.utils.flop_counter import FlopCounterMode

    import flopscope

    torch.manual_seed(0)
    real, inputs = _build(name, "cpu")
    meta, _ = _build(name, "meta")
    meta_inputs = tuple(t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs)
    floor = _Floor()

    def fcm() -> None:
        with FlopCounterMode(display=False):
            meta(*meta_inputs)

    def with_floor() -> None:
        with floor:
            meta(*meta_inputs)

    tools: dict[str, Callable[[], Any]] = {
        "shape_only": lambda: flopscope.count(real, *inputs, shape_only=True, warn=False),
        "meta": lambda: flopscope.count(meta, *inputs, warn=False),
        "FlopCounterMode": fcm,
        "meta forward": lambda: meta(*meta_inputs),
        "dispatch floor": with_floor,
    }
    ratios: dict[str, list[float]] = {t: [] for t in tools}
    seconds: dict[str, list[float]] = {t: [] for t in tools}
    plain_times: list[float] = []
    with torch.no_grad():
        report = flopscope.count(meta, *inputs, warn=False)
        same = flopscope.count(real, *inputs, shape_only=True, warn=False)
        real(*inputs)  # warm-up; a tool that cannot run this model (a meta forward that reads
        failed = {}     # a value) is left out, with its error
        for tool, fn in list(tools.items()):
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                failed[tool] = f"{type(e).__name__}: {str(e)[:120]}"
                del tools[tool]
        floor.calls = 0
        with contextlib.suppress(Exception):  # a failure is listed above
            with_floor()
        calls = floor.calls
        order = list(tools)
        for r in range(rounds):
            order = order[1:] + order[:1]
            before = _timed(lambda: real(*inputs))
            plain_times.append(before)
            for tool in order:
                took = _timed(tools[tool])
                after = _timed(lambda: real(*inputs))
                plain_times.append(after)
                ratios[tool].append(took / ((before + after) / 2))
                seconds[tool].append(took)
                before = after
            log(f"  {name} round {r + 1}: " + ", ".join(
                f"{t} {ratios[t][-1]:.3f}x" for t in tools))
    row: dict[str, Any] = {
        "model": name, "calls": calls, "plain_ms": 1e3 * statistics.median(plain_times),
        "macs": report.macs, "shape_only_macs": same.macs,
        "ratios": {t: statistics.median(v) for t, v in ratios.items() if v},
        "ms": {t: 1e3 * statistics.median(v) for t, v in seconds.items() if v},
        "failed": failed,
    }
    ms = row["ms"]
    nan = float("nan")
    row["us_per_call"] = {
        "flopscope (meta)": 1e3 * ms.get("meta", nan) / calls,
        "dispatch floor": 1e3 * ms.get("dispatch floor", nan) / calls,
        "flopscope's own work": 1e3 * (ms.get("meta", nan) - ms.get("dispatch floor", nan)) / calls,
        "meta forward (torch's meta kernels)": 1e3 * ms.get("meta forward", nan) / calls,
    }
    return row


def cold(name: str) -> dict[str, Any]:
    """The first shape-only and meta counts of a fresh process (nothing remembered yet), and a
    plain forward of the same process (after a warm-up forward)."""
    import flopscope

    real, inputs = _build(name, "cpu")
    meta, _ = _build(name, "meta")
    with torch.no_grad():
        real(*inputs)
        plain = _timed(lambda: real(*inputs))
        shape_only = _timed(lambda: flopscope.count(real, *inputs, shape_only=True, warn=False))
    fresh, _ = _build(name, "meta")
    from flopscope.core import memo as _memo

    _memo.OUTPUTS.clear()
    with torch.no_grad():
        meta_first = _timed(lambda: flopscope.count(fresh, *inputs, warn=False))
    return {"model": name, "plain_s": plain, "shape_only_cold_s": shape_only,
            "meta_cold_s": meta_first, "shape_only_cold_ratio": shape_only / plain,
            "meta_cold_ratio": meta_first / plain}


def _fresh(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.shape_only", *args],
                          capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write JSON results and print Markdown tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shape_only")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale-tokens", nargs="*", type=int, default=[2048, 131072])
    parser.add_argument("--scale-repeats", type=int, default=3)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/shape_only.json")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time part 1 by wall clock, or by this thread's CPU time "
                        "(steadier on a shared machine: time spent waiting for a CPU is left "
                        "out; the forward runs in this thread with one intra-op thread)")
    parser.add_argument("--cold-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clock == "cpu":
        _CLOCK[0] = time.thread_time
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.cold_worker:
        print(json.dumps(cold(args.cold_worker)))
        return 0
    results: dict[str, Any] = {"load_before": _load(), "clock": args.clock, "models": [],
                               "cold": [], "scale": []}
    for name in args.models:
        results["models"].append(measure_model(name, args.rounds, log=lambda s: print(s, file=sys.stderr)))
    for _ in range(args.cold_repeats):
        for name in args.models:
            results["cold"].append(_fresh(["--cold-worker", name]))
    if args.scale_tokens:
        from benchmarks.scale import LLAMA_70B, measure

        for tokens in args.scale_tokens:
            config = dict(LLAMA_70B, max_position_embeddings=max(tokens, 32768))
            results["scale"] += measure(tokens, args.scale_repeats, config,
                                        log=lambda s: print(s, file=sys.stderr))
    results["load_after"] = _load()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return 0


def _load() -> str:
    try:
        return ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md's shape-only section."""
    lines = ["| model | operator calls | plain forward (ms) | " + " | ".join(TOOLS) + " |",
             "|---|---|---|" + "---|" * len(TOOLS)]
    for row in results["models"]:
        lines.append(f"| {row['model']} | {row['calls']} | {row['plain_ms']:.1f} | " + " | ".join(
            f"{row['ratios'][t]:.3f}x" if t in row["ratios"] else "fails" for t in TOOLS) + " |")
    lines += ["", "| model | flopscope on meta, µs/call | dispatch floor, µs/call | "
              "flopscope's own work, µs/call | torch's meta kernels, µs/call |",
              "|---|---|---|---|---|"]
    for row in results["models"]:
        u = row["us_per_call"]
        lines.append(f"| {row['model']} | {u['flopscope (meta)']:.1f} | {u['dispatch floor']:.1f} | "
                     f"{u['flopscope' + chr(39) + 's own work']:.1f} | "
                     f"{u['meta forward (torch' + chr(39) + 's meta kernels)']:.1f} |")
    if results["cold"]:
        lines += ["", "| model (fresh process, first count) | shape_only / plain | meta / plain |",
                  "|---|---|---|"]
        for name in dict.fromkeys(r["model"] for r in results["cold"]):
            rows = [r for r in results["cold"] if r["model"] == name]
            lines.append(f"| {name} | "
                         f"{statistics.median(r['shape_only_cold_ratio'] for r in rows):.3f}x | "
                         f"{statistics.median(r['meta_cold_ratio'] for r in rows):.3f}x |")
    if results["scale"]:
        lines += ["", "| tokens | tool | runs | wall time (s), median | peak RSS above imports "
                  "(MiB), median | TMACs |", "|---|---|---|---|---|---|"]
        keys = dict.fromkeys((r["tokens"], r["tool"]) for r in results["scale"])
        for tokens, tool in keys:
            rows = [r for r in results["scale"] if r["tokens"] == tokens and r["tool"] == tool]
            lines.append(
                f"| {tokens:,} | {tool} | {len(rows)} | "
                f"{statistics.median(r['seconds'] for r in rows):.2f} | "
                f"{statistics.median(r['peak_above_import_mib'] for r in rows):.0f} | "
                f"{rows[0]['macs'] / 1e12:,.2f} |")
    lines.append("")
    lines.append(f"load average before/after: {results['load_before']} / {results.get('load_after')}"
                 f"; clock: {results.get('clock', 'wall')}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
