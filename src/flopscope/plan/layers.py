"""A role's figures as exact formulas in its number of decoder layers.

A decoder's layers run the same shapes, so everything a role is planned by grows by the same
amount with each layer it holds: FLOPs, the roofline time of each phase, the collectives' calls
and bytes, the parameter shards and, as long as the peak is reached at the same place (a
module outside the layers, or a layer at the same distance from the stage's first or last), the
peak memory and every
category at it. Two simulations of the role on the same model with fewer layers, ``k1`` and
``k2 = k1 + 1`` per stage, give the figures at ``k`` layers per stage as
``v(k) = v(k2) + (k - k2) (v(k2) - v(k1))``; where the two peaks are not at corresponding
places, the role is simulated whole. Checked against whole simulations in ``tests/plan``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

from flopscope.cost import Phase
from flopscope.estimate import Estimate, MemoryProfile
from flopscope.estimate.bound import Row
from flopscope.report.records import CommRecord

__all__ = ["MIN_LAYERS", "SMALL_LAYERS", "corresponding_peak", "extrapolate_comm", "extrapolate_estimate",
           "extrapolate_memory", "line"]

#: layers per stage of the two small simulations (k1, k2 = k1 + 1)
SMALL_LAYERS = (3, 4)
#: the fewest layers per stage worth extrapolating (below, the two small simulations together
#: run about as many layers as the whole one)
MIN_LAYERS = 6

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(.*)$")
N = TypeVar("N", int, float)


def line(v1: N, v2: N, k: int) -> N:
    """The value at ``k`` layers per stage from those at ``SMALL_LAYERS``."""
    return v2 + (k - SMALL_LAYERS[1]) * (v2 - v1)  # k2 = k1 + 1: one layer's worth per layer


def _position(module: str, stage: int, per_stage: int) -> tuple[int, str] | None:
    """A layer module's position in its stage and its path below the layer, or ``None`` for a
    module outside the layers."""
    found = _LAYER.match(module)
    if found is None:
        return None
    return int(found.group(2)) - stage * per_stage, found.group(3)


def _peak_module(a: MemoryProfile, b: MemoryProfile, stage: int, k: int) -> str | None:
    """Where the peak is at ``k`` layers per stage, when the two small simulations peak at
    corresponding places (the same module outside the layers; or the same module of a layer at
    the same distance from the stage's first layer, or from its last), in the same phase;
    ``None`` otherwise."""
    k1, k2 = SMALL_LAYERS
    if a.peak_phase != b.peak_phase:
        return None
    pa, pb = _position(a.peak_module, stage, k1), _position(b.peak_module, stage, k2)
    if pa is None or pb is None:
        return b.peak_module if pa is None and pb is None and a.peak_module == b.peak_module \
            else None
    (ia, below), (ib, below_b) = pa, pb
    if below != below_b:
        return None
    if ia == ib:
        return f"model.layers.{stage * k + ib}{below}"
    if k1 - ia == k2 - ib:
        return f"model.layers.{stage * k + k - (k2 - ib)}{below}"
    return None


def corresponding_peak(a: MemoryProfile, b: MemoryProfile, stage: int) -> bool:
    """Whether the two small simulations peak at corresponding places (see
    :func:`extrapolate_memory`)."""
    return _peak_module(a, b, stage, SMALL_LAYERS[1]) is not None


def extrapolate_memory(a: MemoryProfile, b: MemoryProfile, stage: int, k: int) -> MemoryProfile:
    """The memory profile at ``k`` layers per stage. The two peaks must correspond: the same
    module outside the layers, or the same module of a layer at the same distance from the
    stage's first layer (or from its last), in the same phase.

    Args:
        a: the profile at ``SMALL_LAYERS[0]`` layers per stage.
        b: at ``SMALL_LAYERS[1]``.
        stage: the role's stage.
        k: layers per stage.

    Returns:
        The profile (no per-module marks).

    Raises:
        ValueError: the peaks do not correspond.
    """
    module = _peak_module(a, b, stage, k)
    if module is None:
        raise ValueError(f"peaks at {a.peak_module} and {b.peak_module} do not correspond")
    categories = {c: line(a.at_peak.get(c, 0), b.at_peak.get(c, 0), k)
                  for c in {*a.at_peak, *b.at_peak}}
    return MemoryProfile(line(a.peak_bytes, b.peak_bytes, k), module, b.peak_phase, b.peak_op,
                         {c: v for c, v in categories.items() if v},
                         line(a.end_bytes, b.end_bytes, k), {}, b.train, b.note)


def _row(a: Row, b: Row, k: int) -> Row:
    return Row(**{f.name: line(getattr(a, f.name), getattr(b, f.name), k)
                  for f in dataclasses.fields(Row)})


def extrapolate_estimate(a: Estimate, b: Estimate, k: int) -> Estimate:
    """The roofline estimate at ``k`` layers per stage: its total and phases (the per-operator
    and per-module tables are left empty)."""
    phases = {p: _row(a.by_phase.get(p, Row()), b.by_phase.get(p, Row()), k)
              for p in {*a.by_phase, *b.by_phase}}
    return Estimate(b.hardware, b.tf32, _row(a.total, b.total, k), phases,
                    tf32_convolution=b.tf32_convolution)


def _summed(records: tuple[CommRecord, ...]) -> dict[tuple[str, Phase, str, int], list[int]]:
    out: dict[tuple[str, Phase, str, int], list[int]] = {}
    for r in records:
        module = _LAYER.sub(r"\1*\3", r.module)
        acc = out.setdefault((module, r.phase, r.kind, r.group_size), [0, 0, 0])
        acc[0] += r.calls
        acc[1] += r.payload_bytes
        acc[2] += r.bus_bytes
    return out


def extrapolate_comm(a: tuple[CommRecord, ...], b: tuple[CommRecord, ...],
                     k: int) -> tuple[CommRecord, ...]:
    """The collectives at ``k`` layers per stage, the layers' records summed under
    ``model.layers.*`` (in the order ``b`` first issued them)."""
    sa, sb = _summed(a), _summed(b)
    out = []
    for key in [*sb, *(x for x in sa if x not in sb)]:
        va, vb = sa.get(key, [0, 0, 0]), sb.get(key, [0, 0, 0])
        calls, payload, bus = (line(x, y, k) for x, y in zip(va, vb, strict=True))
        if calls:
            out.append(CommRecord(key[0], key[1], key[2], key[3], calls, payload, bus))
    return tuple(out)
