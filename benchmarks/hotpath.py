"""Hot path: flopscope's own cost per operator call, without the forward's arithmetic.

resnet50 on a 32x32 image (the same 278 operator calls and 183 module calls as at 224x224, but
almost no arithmetic) is run plain, under a bare ``TorchDispatchMode`` that only forwards each call,
and under ``flopscope.count``; single thread, minimum CPU time (process time, less disturbed by other processes than wall time) over repeats. The differences divided by the
number of operator calls are the per-call costs of dispatch itself and of flopscope's bookkeeping.

``python -m benchmarks.hotpath`` prints one JSON line; run it with another ``flopscope`` on
``PYTHONPATH`` to compare versions.
"""

from __future__ import annotations

import json
import time
import timeit
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flopscope


class _Bare(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def measure(repeat: int = 30, size: int = 32) -> dict[str, float]:
    """Microseconds: plain forward, bare dispatch per op, flopscope per op (count minus bare)."""
    import torchvision

    torch.set_num_threads(1)
    model = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, size, size)
    ops = sum(r.calls for r in flopscope.count(model, x, warn=False).records)

    def bare() -> None:
        with _Bare():
            model(x)

    def best(fn: Any) -> float:
        return min(timeit.repeat(fn, number=1, repeat=repeat, timer=time.process_time)) * 1e6

    with torch.no_grad():
        for _ in range(3):
            model(x)
            bare()
            flopscope.count(model, x, warn=False)
        plain_us = best(lambda: model(x))
        bare_us = best(bare)
        count_us = best(lambda: flopscope.count(model, x, warn=False))
    return {"ops": ops, "plain_us": plain_us, "dispatch_us_per_op": (bare_us - plain_us) / ops,
            "flopscope_us_per_op": (count_us - bare_us) / ops,
            "flopscope_total_us_per_op": (count_us - plain_us) / ops,
            "flopscope_file": flopscope.__file__}


if __name__ == "__main__":
    import sys

    quick = "--quick" in sys.argv[1:]
    print(json.dumps(measure(repeat=3 if quick else 30)))
