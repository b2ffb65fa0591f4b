"""How measured time shows in a report: per operator and per module (self and inclusive), its
share of the run, the achieved FLOP/s and bytes/s, and against a hardware profile the roofline
bound, the efficiency (bound / measured) and the time above the roof (measured - bound), ranked;
the time outside every counted call is its own line, so the rows add up to the run's wall time.
Units only here (the edge of the timing package).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from flopscope.estimate.display import human_seconds
from flopscope.render.units import human
from flopscope.report.records import is_within
from flopscope.report.sections import Column
from flopscope.timing.run import NOISY, CallTime, Timing

__all__ = ["MeasuredSection", "Totals", "by_module", "by_op", "ranked"]


@dataclass
class Totals:
    """Measured time and counted work over a set of calls.

    Attributes:
        calls: operator calls.
        seconds: their measured time (sum of the calls' medians).
        flops: counted FLOPs.
        bytes: counted bytes read and written.
        bound_s: their roofline time (a lower bound), when a profile was given.
        predicted_s: their predicted time, when the profile is calibrated
            (:mod:`flopscope.estimate.predict`).
    """

    calls: int = 0
    seconds: float = 0.0
    flops: int = 0
    bytes: int = 0
    bound_s: float | None = None
    predicted_s: float | None = None

    def add(self, c: CallTime) -> None:
        """Add one call."""
        self.calls += 1
        self.seconds += c.seconds
        self.flops += c.cost.flops
        self.bytes += c.cost.bytes
        if c.bound is not None:
            self.bound_s = (self.bound_s or 0.0) + c.bound.time_s
            if c.bound.predicted_s:
                self.predicted_s = (self.predicted_s or 0.0) + c.bound.predicted_s

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s."""
        return self.flops / self.seconds if self.seconds else None

    @property
    def bytes_per_s(self) -> float | None:
        """Achieved bytes/s."""
        return self.bytes / self.seconds if self.seconds else None

    @property
    def efficiency(self) -> float | None:
        """Bound / measured (1.0: at the roof)."""
        return self.bound_s / self.seconds if self.bound_s is not None and self.seconds else None

    @property
    def above_roof_s(self) -> float | None:
        """Measured - bound: the time a faster kernel could win at most."""
        return self.seconds - self.bound_s if self.bound_s is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"calls": self.calls, "seconds": self.seconds, "flops": self.flops,
                "bytes": self.bytes, "flops_per_s": self.flops_per_s,
                "bytes_per_s": self.bytes_per_s, "bound_s": self.bound_s,
                "predicted_s": self.predicted_s,
                "efficiency": self.efficiency, "above_roof_s": self.above_roof_s}


def _group(calls: Iterable[CallTime], key: Any) -> dict[Any, Totals]:
    out: dict[Any, Totals] = {}
    for c in calls:
        out.setdefault(key(c), Totals()).add(c)
    return out


def by_op(timing: Timing) -> dict[str, Totals]:
    """Per operator, most measured time first."""
    table = _group(timing.calls, lambda c: c.op)
    return dict(sorted(table.items(), key=lambda kv: -kv[1].seconds))


def by_module(timing: Timing, modules: Sequence[str]) -> dict[str, Totals]:
    """Per module path (inclusive: the module and everything below it), in ``modules`` order."""
    own = _group(timing.calls, lambda c: c.module)
    out: dict[str, Totals] = {}
    for path in modules:
        total = Totals()
        for p, t in own.items():
            if is_within(p, path):
                total.calls += t.calls
                total.seconds += t.seconds
                total.flops += t.flops
                total.bytes += t.bytes
                if t.bound_s is not None:
                    total.bound_s = (total.bound_s or 0.0) + t.bound_s
                if t.predicted_s is not None:
                    total.predicted_s = (total.predicted_s or 0.0) + t.predicted_s
        out[path] = total
    return out


def ranked(timing: Timing, top: int = 10) -> list[tuple[str, str, Totals]]:
    """Where to look first: (module, operator) pairs by time above the roof (by measured time
    when there is no profile), largest first."""
    pairs = _group(timing.calls, lambda c: (c.module, c.op))

    def key(kv: tuple[tuple[str, str], Totals]) -> float:
        t = kv[1]
        return -(t.above_roof_s if t.above_roof_s is not None else t.seconds)

    return [(m, op, t) for (m, op), t in sorted(pairs.items(), key=key)[:top]]


def _rate(value: float | None, unit: str) -> str:
    return "-" if value is None else human(int(value), unit)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


@dataclass(frozen=True)
class MeasuredSection:
    """Measured time as a report section: ``"measured"`` in JSON, its columns and lines.

    Attributes:
        timing: what was measured.
        modules: the report's module paths (for the inclusive module rows).
    """

    timing: Timing
    modules: tuple[str, ...]
    key: str = "measured"

    def to_dict(self) -> Any:
        """Wall time, outside time, spread, per operator and module, the ranked list; with a
        hardware profile, ``"peaks"``: its roofs in the profile file's format (bandwidths in
        GB/s, rates in TFLOP/s; its calibration left out), for the HTML page's roofline."""
        t = self.timing
        peaks = None
        if t.hardware is not None:
            peaks = {k: v for k, v in t.hardware.to_dict().items() if k != "calibration"}
        return {
            "kind": "measured", "device": t.device, "warmup": t.warmup, "repeat": len(t.walls),
            "wall_s": t.wall_s, "walls_s": list(t.walls), "outside_s": t.outside_s,
            "counting_s": t.counting_s,
            "spread": t.spread, "unmatched_calls": t.unmatched,
            "hardware": t.hardware.name if t.hardware is not None else None,
            "by_op": {k: v.to_dict() for k, v in by_op(t).items()},
            "by_module": {k: v.to_dict() for k, v in by_module(t, self.modules).items()},
            "ranked": [{"module": m, "op": op, **v.to_dict()} for m, op, v in ranked(t)],
            **({"peaks": peaks} if peaks is not None else {}),
        }

    def columns(self) -> Sequence[Column]:
        """Measured time, its share, achieved FLOP/s; efficiency and time above the roof."""
        t = self.timing
        mods, ops = by_module(t, self.modules), by_op(t)
        wall = t.wall_s
        total = Totals()
        for c in t.calls:
            total.add(c)

        def cells(fn: Any) -> tuple[dict[str, str], dict[str, str], str]:
            return ({k: fn(v) for k, v in mods.items()}, {k: fn(v) for k, v in ops.items()},
                    fn(total))

        cols = [("measured", lambda v: human_seconds(v.seconds)),
                ("of run", lambda v: _pct(v.seconds, wall)),
                ("FLOP/s", lambda v: _rate(v.flops_per_s, ""))]
        if t.hardware is not None:
            cols += [("efficiency", lambda v: "-" if v.efficiency is None
                      else f"{100 * v.efficiency:.0f}%"),
                     ("above roof", lambda v: "-" if v.above_roof_s is None
                      else human_seconds(max(v.above_roof_s, 0.0)))]
        if t.hardware is not None and t.hardware.calibration is not None:
            cols.append(("predicted", lambda v: "-" if v.predicted_s is None
                         else human_seconds(v.predicted_s)))
        return [Column(name, *cells(fn)) for name, fn in cols]

    def lines(self) -> Sequence[str]:
        """The run's wall time and its parts, the spread, and where to look first."""
        t = self.timing
        inside = t.wall_s - t.outside_s
        if t.counting_s is None:
            lines = [f"measured ({t.device}, median of {len(t.walls)} runs after {t.warmup} "
                     f"warm-up): {human_seconds(t.wall_s)} per run = {human_seconds(inside)} in "
                     f"counted operators + {human_seconds(t.outside_s)} outside them (Python, "
                     "module hooks, composite operators' dispatch)"]
        else:
            lines = [f"measured ({t.device}, one counted run of the block): "
                     f"{human_seconds(t.wall_s)} = {human_seconds(inside)} in counted operators + "
                     f"{human_seconds(t.outside_s)} outside them (Python, module hooks, composite "
                     f"operators' dispatch, and flopscope's counting: "
                     f"{human_seconds(t.counting_s)} of it measured inside the operators' events; "
                     "an uncounted run of the block is at least that much faster)"]
        cal = t.hardware.calibration if t.hardware is not None else None
        if cal is not None:
            predicted = sum(c.bound.predicted_s for c in t.calls if c.bound is not None)
            lines.append(f"  predicted ({cal.source()}): "
                         f"{human_seconds(predicted)} per run, {predicted / t.wall_s:.2f}x the "
                         "measured wall time (the calls' predictions; docs/prediction.md)")
        if t.spread > NOISY:
            lines.append(f"  the runs spread by {100 * t.spread:.0f}% of the median (slowest - "
                         "fastest): this machine is shared; read the times with that margin")
        if t.unmatched:
            lines.append(f"  {t.unmatched} counted call(s) had no profiler event and show 0 s")
        what = "time above the roof" if t.hardware is not None else "measured time"
        lines.append(f"  where to look first (by {what}):")
        for module, op, v in ranked(t, 5):
            extra = ""
            if v.above_roof_s is not None and v.efficiency is not None:
                extra = (f", {human_seconds(max(v.above_roof_s, 0.0))} above its roof "
                         f"({100 * v.efficiency:.0f}% efficient)")
            lines.append(f"    {module or '(root)'} {op}: {human_seconds(v.seconds)} "
                         f"x{v.calls}{extra}")
        return lines
