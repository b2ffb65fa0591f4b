"""Symbolic against concrete: a Llama-2-70B-shaped decoder (on ``meta``) counted with
``count_symbolic`` (batch and sequence length symbolic) and with a concrete shape-only ``count``,
side by side, each in fresh processes, alternating.

Each (mode, layers) run is a fresh subprocess (``python -m benchmarks.symbolic_scale MODE LAYERS
TOKENS``) that builds the model, then times two counts in a row: the first pays the one-time
imports of the path it takes (a symbolic count imports ``torch._dynamo``/``torch.export`` pieces
the first time PyTorch records where a symbol was made), the second does not. The symbolic row
also checks that its formula evaluated at (1, TOKENS) equals the concrete MACs.

Usage::

    python -m benchmarks.symbolic_scale --layers 80 --repeats 2 [--json out.json] [--src DIR]

``--src`` runs the workers against another checkout's ``src`` (for a before/after figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.scale import LLAMA_70B

MODES = ("concrete", "symbolic")


def worker(mode: str, layers: int, tokens: int) -> dict[str, Any]:
    """Build the decoder on ``meta`` and time two counts of one forward; runs in its own process."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import flopscope
    from flopscope.symbolic import count_symbolic

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(**{**LLAMA_70B, "num_hidden_layers": layers})).eval()
    ids = torch.zeros(1, tokens, dtype=torch.long)
    seconds = []
    value: int | str = 0
    for _ in range(2):
        start = time.perf_counter()
        if mode == "concrete":
            value = flopscope.count(model, ids, warn=False, shape_only=True).macs
        else:
            rep = count_symbolic(model, ids, symbolic={"batch": (0, 0), "seq_len": (0, 1)},
                                 warn=False)
            macs = rep.total().macs
            seconds.append(time.perf_counter() - start)
            value = str(macs)
            at = int(macs.xreplace({rep.symbols["batch"]: 1, rep.symbols["seq_len"]: tokens}))
            continue
        seconds.append(time.perf_counter() - start)
    row: dict[str, Any] = {"mode": mode, "layers": layers, "tokens": tokens,
                           "first_s": seconds[0], "second_s": seconds[1]}
    if mode == "symbolic":
        row["formula"] = value
        row["macs_at_tokens"] = at
    else:
        row["macs_at_tokens"] = value
    return row


def measure(layers: int, tokens: int, repeats: int, src: str | None = None,
            log: Any = print) -> list[dict[str, Any]]:
    """Every mode, ``repeats`` fresh processes each, alternating; all rows."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), str(root)])
    rows = []
    for _ in range(repeats):
        for mode in MODES:
            cmd = [sys.executable, "-m", "benchmarks.symbolic_scale", "--worker", mode,
                   str(layers), str(tokens)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root,
                                  env=env)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            log(f"  {mode:9s} {layers:3d} layers  first {row['first_s']:6.2f} s  "
                f"second {row['second_s']:6.2f} s")
            rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per mode and the symbolic / concrete ratios (first and second count)."""
    med = {m: {k: statistics.median(r[k] for r in rows if r["mode"] == m)
               for k in ("first_s", "second_s")} for m in MODES}
    macs = {m: {r["macs_at_tokens"] for r in rows if r["mode"] == m} for m in MODES}
    return {"median": med,
            "ratio_first": med["symbolic"]["first_s"] / med["concrete"]["first_s"],
            "ratio_second": med["symbolic"]["second_s"] / med["concrete"]["second_s"],
            "formula_equals_concrete": macs["symbolic"] == macs["concrete"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write rows and summary here")
    parser.add_argument("--src", help="another checkout's src directory for the workers")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "LAYERS", "TOKENS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, layers, tokens = args.worker
        print(json.dumps(worker(mode, int(layers), int(tokens))))
        return 0
    rows = measure(args.layers, args.tokens, args.repeats, args.src)
    result = {"rows": rows, "summary": summary(rows), "src": args.src or "src"}
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    raise SystemExit(main())
