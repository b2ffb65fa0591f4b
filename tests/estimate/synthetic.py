"""What the prediction tests share: a machine so fast that every roofline bound is far below
the predictions (no clamping), a calibrated copy of it built from given points, and a module
that applies one function (a call of the operator under test)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn

from flopscope.estimate import Calibration, Hardware
from flopscope.estimate.calibration import Point

FAST = Hardware("fast", memory_bandwidth=1e18, matrix={"fp32": 1e18}, vector={"fp32": 1e18})


def calibrated(points: tuple[Point, ...], host: Mapping[str, float], hw: Hardware = FAST,
               *, date: str = "2026-11-26T00:00:00+00:00", **extra: object) -> Hardware:
    """``hw`` with a calibration of ``points`` and host times ``host`` (one thread, a CPU);
    ``extra``: the calibration's other fields."""
    cal = Calibration(date, "cpu (test)", 1, {"torch": "x"}, host, points,
                      **extra)  # type: ignore[arg-type]
    return dataclasses.replace(hw, calibration=cal)


class Fn(nn.Module):
    """A module whose forward applies ``fn``."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)  # type: ignore[operator, no-any-return]
