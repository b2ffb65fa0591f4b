"""What --hardware and --memory add to a count: resnet50 (1x3x224x224, real CPU run) counted
plainly, with a CallLog (roofline) and with a MemoryTracker (peak memory), best of ``repeats``
wall times; the ratios to the plain count are printed as JSON.

``python -m benchmarks.estimate_overhead``
"""

from __future__ import annotations

import json

import torch

import flopscope
from flopscope.estimate import PROFILES, CallLog, MemoryTracker
from flopscope.estimate.hardware import best_seconds


def measure(repeats: int = 5) -> dict[str, float]:
    """Best-of wall seconds for each way of counting, and the ratios."""
    import torchvision

    model = torchvision.models.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)

    def plain() -> None:
        with torch.no_grad():
            flopscope.count(model, x, warn=False)

    def hardware() -> None:
        log = CallLog()
        with torch.no_grad():
            flopscope.count(model, x, warn=False, observers=[log])
        log.estimate(PROFILES["h100-sxm"])

    def memory() -> None:
        tracker = MemoryTracker()
        tracker.register(model.parameters(), "parameters")
        with torch.no_grad():
            flopscope.count(model, x, warn=False, observers=[tracker])
        tracker.profile()

    out: dict[str, float] = {}
    for name, fn in (("plain", plain), ("hardware", hardware), ("memory", memory)):
        out[f"{name}_s"] = best_seconds(fn, repeats)
    out["hardware_ratio"] = out["hardware_s"] / out["plain_s"]
    out["memory_ratio"] = out["memory_s"] / out["plain_s"]
    return out


if __name__ == "__main__":
    print(json.dumps(measure()))
