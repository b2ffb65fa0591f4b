"""Reference calibrations: a prediction for the shipped GPU profiles that were never calibrated
on the user's machine (issue 29), marked as such.

flopscope calibrated two GPUs itself, on lent machines (docs/gpu.md): an H100 SXM and an H200,
the points timed as CUDA graphs' replays (device time), with the host times of those machines'
CPUs. Their calibration blocks ship in ``estimate/data/``:

- ``h100-sxm`` and ``h200`` take their own device's points;
- the other shipped GPU profiles take the H100 SXM's, each point's time carried to the profile
  by :func:`moved`: the family's fastest point (the kernel's latency floor, which no datasheet
  figure scales) stays, and the rest is scaled by the point's roofline bound there over its bound
  on the H100 (datasheet peaks and bandwidths, :func:`point_bound`).

How well the move works is measured, not assumed: :func:`move_errors` carries one measured
device's points to the other and compares them with that device's own measurements of the same
microbenchmarks (H200 and H100 differ in bandwidth, not compute; no other architecture has been
measured, which the note on every moved profile says). The host times are the lent machines'
(another CPU, another driver would differ). CPU profiles get none: the prediction there needs the
machine's own ``flopscope calibrate``.

The prediction made from a reference is *uncalibrated* (:attr:`Calibration.reference` says what
it came from); the planner ranks layouts by it and shows the bound beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.profile import Hardware

__all__ = ["MEASURED", "SOURCE", "measured", "move_errors", "moved", "point_bound", "reference",
           "spread"]

DATA = Path(__file__).parent / "data"
MEASURED = ("h100-sxm", "h200")
"""Profiles whose own device flopscope calibrated (``estimate/data/NAME.json``)."""
SOURCE = "h100-sxm"
"""The measured calibration the other GPU profiles take, moved to their peaks."""
_MATRIX = frozenset({"matmul", "conv", "attention"})


def point_bound(point: Point, hw: Hardware) -> float:
    """A microbenchmark's roofline bound on ``hw``: its FLOPs at the peak (matrix units for
    products, convolutions and attention; float32 convolutions as TF32, cuDNN's default, float32
    products not, torch's) or its bytes at the memory bandwidth, whichever is longer.

    Args:
        point: the microbenchmark.
        hw: the profile.

    Returns:
        Seconds.
    """
    key = "tf32" if point.family == "conv" and point.dtype == "fp32" and "tf32" in hw.matrix \
        else point.dtype
    compute = point.flops / hw.peak(key, point.family in _MATRIX) if point.flops else 0.0
    return max(compute, point.bytes / hw.memory_bandwidth)


def moved(calibration: Calibration, source: Hardware, target: Hardware) -> tuple[Point, ...]:
    """The points of a calibration measured on ``source`` carried to ``target``: each point's
    time is its family's fastest point's time (the floor) plus the rest scaled by the point's
    bound on ``target`` over its bound on ``source``.

    Args:
        calibration: measured on ``source``.
        source: the profile of the device it was measured on.
        target: the profile to carry it to.

    Returns:
        The points, in order, with their times moved.
    """
    floor: dict[str, float] = {}
    for p in calibration.points:
        floor[p.family] = min(floor.get(p.family, p.seconds), p.seconds)
    out = []
    for p in calibration.points:
        ratio = point_bound(p, target) / point_bound(p, source)
        base = floor[p.family]
        out.append(dataclasses.replace(p, seconds=base + (p.seconds - base) * ratio))
    return tuple(out)


@functools.cache
def _data(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return found


@functools.cache
def measured(name: str) -> Calibration:
    """The calibration flopscope measured on a lent device (:data:`MEASURED`)."""
    return Calibration.from_dict(_data(name)["calibration"],
                                 where=f"flopscope's {name} reference")


def _framework_words(name: str) -> str:
    """Where a reference's DTensor and FSDP2 host times come from, where not its own machine's
    (the data file's ``framework_from``: the H100's are the lent H200 machine's host's)."""
    found = _data(name).get("framework_from")
    return f"; DTensor's and FSDP2's host times from {found}" if found else ""


def move_errors(source: Hardware, target: Hardware) -> list[float]:
    """``moved / measured - 1`` for every microbenchmark that both measured devices ran: the
    points measured on ``source`` carried to ``target`` against ``target``'s own.

    Args:
        source: a profile named in :data:`MEASURED`.
        target: another.

    Returns:
        One relative error per shared point.
    """
    theirs = {(p.family, p.dtype, p.what, p.op): p.seconds for p in measured(target.name).points}
    ours = measured(source.name)
    return [p.seconds / theirs[(p0.family, p0.dtype, p0.what, p0.op)] - 1
            for p, p0 in zip(moved(ours, source, target), ours.points, strict=True)
            if (p0.family, p0.dtype, p0.what, p0.op) in theirs]


def spread(errors: list[float]) -> tuple[float, float]:
    """The median and the 90th percentile (nearest rank) of ``|error|``."""
    size = sorted(abs(e) for e in errors)
    return statistics.median(size), size[min(len(size) - 1, round(0.9 * (len(size) - 1)))]


def _device(cal: Calibration) -> str:
    return cal.device.partition("(")[2].rstrip(")") or cal.device  # "cuda (NVIDIA H200)"


def reference(hw: Hardware, profiles: Mapping[str, Hardware]) -> Calibration:
    """The reference calibration of a shipped GPU profile (the module docstring).

    Args:
        hw: the profile.
        profiles: the shipped profiles of :data:`MEASURED` by name.

    Returns:
        Its own device's calibration where flopscope measured one, else :data:`SOURCE`'s moved
        to it; :attr:`~Calibration.reference` says which.
    """
    if hw.name in MEASURED:
        own = measured(hw.name)
        return dataclasses.replace(own, reference=(
            f"flopscope's calibration of a lent {_device(own)} on {own.date[:10]}, with that "
            f"machine's host{_framework_words(hw.name)}"))
    source = measured(SOURCE)
    a, b = profiles["h200"], profiles["h100-sxm"]
    median, p90 = spread(move_errors(a, b) + move_errors(b, a))
    return dataclasses.replace(source, points=moved(source, profiles[SOURCE], hw), reference=(
        f"flopscope's calibration of a lent {_device(source)} on {source.date[:10]}, with that "
        f"machine's host{_framework_words(SOURCE)}, moved to this profile's datasheet peaks; "
        f"H200 and H100 points moved "
        f"to each other missed by a median {100 * median:.0f}%, 90th percentile "
        f"{100 * p90:.0f}% (the same architecture: no other is measured)"))
