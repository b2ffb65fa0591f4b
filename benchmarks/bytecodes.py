"""Bytecodes per Python function of one ``with Counter(model)`` block: where the per-call work goes.

callgrind (:mod:`benchmarks.instructions`) counts instructions per C function; inside the Python
interpreter every Python function is the same C function. This counts, with ``sys.settrace``'s
opcode events, how many bytecodes each Python function runs and how often it is called during one
forward of a torchvision model under a :class:`flopscope.Counter` (real tensors, the shape-only
memo off, as in ``count()``), after two warm-up blocks. Counts are exact and do not depend on the
load. Single thread, ``torch.no_grad()``.

``python -m benchmarks.bytecodes --model mobilenet_v3_large --size 32 --top 30`` prints one JSON
line: the total, flopscope's own bytecodes and the ``--top`` functions (file, name, bytecodes,
calls). Run it with another checkout's ``src`` first on ``PYTHONPATH`` to compare versions.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from types import FrameType
from typing import Any


def measure(model_name: str, size: int) -> tuple[collections.Counter[tuple[str, str]],
                                                  collections.Counter[tuple[str, str]], int]:
    """Bytecodes and calls per (file, function) of one counted forward, and its operator calls."""
    import torch
    import torchvision

    import flopscope

    torch.set_num_threads(1)
    model = getattr(torchvision.models, model_name)().eval()
    x = torch.randn(1, 3, size, size)
    codes: collections.Counter[tuple[str, str]] = collections.Counter()
    calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        co = frame.f_code
        key = (co.co_filename.split("site-packages/")[-1].split("src/")[-1], co.co_name)
        if event == "call":
            calls[key] += 1
        elif event == "opcode":
            codes[key] += 1
        return tracer

    previous = sys.gettrace()  # (a coverage run's tracer: put back afterwards)
    with torch.no_grad():
        for i in range(3):
            counter = flopscope.Counter(model, warn=False)
            counter.memo_shape_only = False
            if i == 2:
                sys.settrace(tracer)
            try:
                with counter:
                    model(x)
            finally:
                sys.settrace(previous)
    ops = sum(r.calls for r in counter.make_report().records)
    return codes, calls, ops


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bytecodes")
    parser.add_argument("--model", default="mobilenet_v3_large")
    parser.add_argument("--size", type=int, default=32, help="image side (default 32)")
    parser.add_argument("--top", type=int, default=30, help="functions listed (default 30)")
    args = parser.parse_args(argv)
    codes, calls, ops = measure(args.model, args.size)
    own = sum(n for (f, _), n in codes.items() if f.startswith("flopscope/"))
    print(json.dumps({
        "model": args.model, "size": args.size, "ops": ops, "total": sum(codes.values()),
        "flopscope": own, "flopscope_per_op": round(own / ops, 1),
        "top": [[f, name, n, calls[(f, name)]] for (f, name), n in codes.most_common(args.top)],
    }))


if __name__ == "__main__":
    main()
