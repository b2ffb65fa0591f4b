"""Overhead in instructions: what a count costs beyond a plain forward, counted by callgrind.

Wall time on a shared machine moves with the load; the number of instructions a run executes does
not. Each model is run in one worker process under ``valgrind --tool=callgrind
--instr-atstart=no``: a plain forward, the same forward under a bare pass-through
``TorchDispatchMode``, ptflops, torch's ``FlopCounterMode`` and ``flopscope.count``, each warmed up
first and then run ``--repeat`` times with callgrind's instrumentation switched on around it
(callgrind's client requests, through a tiny C helper compiled here with the system's C compiler),
one dump per tool. The overhead ratio of a tool is its instructions over the plain forward's; its
cost per operator call is its instructions beyond the plain forward's divided by the number of
operator calls. Single thread (``torch.set_num_threads(1)``), ``torch.no_grad()``.

``python -m benchmarks.instructions --models resnet50 mobilenet_v3_large --size 64 --json
benchmarks/results/instructions.json`` (needs ``valgrind`` and ``cc``; ``--annotate`` keeps the
callgrind dumps, for ``callgrind_annotate``). ``--flopscope`` puts another checkout's ``src`` first
on the worker's path, to compare versions.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.results_file import append_run

TOOLS = ("plain", "bare dispatch mode", "ptflops", "FlopCounterMode", "flopscope")
_HELPER = r"""
#include <valgrind/callgrind.h>
void fs_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void fs_stop(const char *name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _helper(directory: Path) -> Path:
    """Compile the client-request helper (a shared library) into ``directory``."""
    src = directory / "fs_callgrind.c"
    lib = directory / "fs_callgrind.so"
    src.write_text(_HELPER)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("benchmarks.instructions: no C compiler (cc) found; install gcc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def _worker(model_name: str, size: int, repeat: int, lib: str, parts: bool) -> None:
    """Run every tool on one model, instrumented one at a time (inside callgrind)."""
    import torch
    import torchvision
    from torch.utils._python_dispatch import TorchDispatchMode

    import flopscope
    from benchmarks import tools

    helper = ctypes.CDLL(lib)
    torch.set_num_threads(1)
    model = getattr(torchvision.models, model_name)().eval()
    x = torch.randn(1, 3, size, size)

    class Bare(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    def bare() -> None:
        with Bare():
            model(x)

    def tool(name: str) -> Any:
        def run() -> None:
            # a tool that fails (not installed: ``pip install -e '.[bench]'``) would be timed on
            # its error path, a ratio near 0; say so instead
            result = tools.measure(name, model, (x,), False)
            if result.macs is None:
                raise SystemExit(f"instructions: {name} did not count {model_name}: "
                                 f"{result.error}")
        return run

    runs = {
        "plain": lambda: model(x),
        "bare dispatch mode": bare,
        "ptflops": tool("ptflops"),
        "FlopCounterMode": tool("FlopCounterMode"),
        "flopscope": lambda: flopscope.count(model, x, warn=False),
    }
    if parts:  # flopscope's count in pieces: the per-count work apart from the forward
        from flopscope.execution.snapshot import ModelSnapshot

        finished = flopscope.Counter(model, warn=False)
        with finished:
            model(x)

        def snapshot() -> None:  # as count() does for a real run: buffers by copy on write
            counter = flopscope.Counter(model, warn=False)
            # (the model's tables as the Counter read them, where this flopscope has them)
            kept = ModelSnapshot(counter.modules,
                                 *filter(None, [getattr(counter, "model_tensors", None)]))
            kept.keep_values(buffers=False)
            counter.protect([*kept.params, *kept.own_buffers])
            kept.restore()
            counter.restore()

        def block() -> None:
            counter = flopscope.Counter(model, warn=False)
            counter.memo_shape_only = False
            with counter:
                model(x)

        runs["part: Counter()"] = lambda: flopscope.Counter(model, warn=False)
        runs["part: Counter() + snapshot, protect, restore"] = snapshot
        runs["part: report"] = finished.make_report
        runs["part: Counter() + with block"] = block
    with torch.no_grad():
        report = flopscope.count(model, x, warn=False)
        ops = sum(r.calls for r in report.records)
        for _ in range(2):  # warm: caches, lazily loaded kernels, memos
            for fn in runs.values():
                fn()
        helper.fs_start()  # the cost of the requests themselves
        helper.fs_stop(b"empty")
        for name, fn in runs.items():
            helper.fs_start()
            for _ in range(repeat):
                fn()
            helper.fs_stop(name.encode())
    print(json.dumps({"model": model_name, "ops": ops, "size": size, "repeat": repeat,
                      "flopscope_file": flopscope.__file__}))


_TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.M)
_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.M)


def _dumps(directory: Path) -> dict[str, int]:
    """Instructions per dump name of the callgrind files in ``directory``."""
    found: dict[str, int] = {}
    for f in directory.glob("cg.out*"):
        text = f.read_text(errors="replace")
        trigger = _TRIGGER.search(text)
        totals = _TOTALS.search(text)
        if trigger and totals:
            found[trigger.group(1).strip()] = int(totals.group(1))
    return found


def measure(model: str, size: int, repeat: int, keep: Path | None = None,
            src: str | None = None, parts: bool = False) -> dict[str, Any]:
    """Instructions of every tool on ``model`` (one callgrind worker); see the module docstring."""
    if shutil.which("valgrind") is None:
        raise SystemExit("benchmarks.instructions: valgrind not found; install valgrind")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        lib = _helper(directory)
        env = dict(os.environ)
        root = Path(__file__).resolve().parents[1]
        src = src or str(root / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, str(root), env.get("PYTHONPATH"))
                                            if p)
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={directory}/cg.out.%p", sys.executable, "-m",
               "benchmarks.instructions", "--worker", model, str(size), str(repeat), str(lib),
               "parts" if parts else "-"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind worker for {model} failed:\n{done.stderr[-3000:]}")
        info = json.loads(done.stdout.strip().splitlines()[-1])
        dumps = _dumps(directory)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for f in directory.glob("cg.out*"):
                shutil.copy(f, keep / f"{model}.{f.name}")
    empty = dumps.get("empty", 0)
    per_run = {name: (n - empty) / repeat for name, n in dumps.items() if name != "empty"}
    plain = per_run["plain"]
    ops = info["ops"]
    return {**info, "instructions": per_run,
            "ratio": {n: round(v / plain, 4) for n, v in per_run.items()},
            "per_op_beyond_plain": {n: round((v - plain) / ops) for n, v in per_run.items()},
            "flopscope_beyond_bare_per_op": round(
                (per_run["flopscope"] - per_run["bare dispatch mode"]) / ops)}


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5] == "parts")
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v3_large"])
    parser.add_argument("--size", type=int, default=64, help="image side (default 64)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool (default 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--annotate", type=Path, help="keep the callgrind dumps here")
    parser.add_argument("--flopscope", help="a checkout's src directory to count with")
    parser.add_argument("--label", default="", help="a label stored with the results")
    parser.add_argument("--parts", action="store_true",
                        help="also measure flopscope's per-count work in pieces")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        row = measure(model, args.size, args.repeat, args.annotate, args.flopscope, args.parts)
        row["label"] = args.label
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("model", "ops", "ratio", "per_op_beyond_plain",
                                              "flopscope_beyond_bare_per_op")}), flush=True)
    if args.json is not None:
        append_run(args.json, {"label": args.label, "rows": rows})


if __name__ == "__main__":
    main()
