"""Calibration data of a profile's links: collectives timed on a real process group
(``flopscope calibrate --comm``, :func:`flopscope.distributed.probe.probe_links`), the raw points
with their date, backend and versions, and the alpha-beta fits made from them.

The model a fit feeds is ``seconds = calls x latency + bus bytes / bandwidth`` per collective
(:mod:`flopscope.estimate.comm_time`), bus bytes by the ring convention of
:mod:`flopscope.rules.collectives` (all-reduce 2 (n-1)/n of the payload, all-gather and
reduce-scatter (n-1)/n, broadcast and send 1). :func:`fit_alpha_beta` fits latency and
bandwidth to points by least squares on the *relative* error (each point weighs as much as any
other, whatever its size): small payloads fix the latency, large ones the bandwidth.

In a profile file the block is ``"link_calibration"``::

    "link_calibration": {"date": "2026-11-27T03:00:00+00:00", "backend": "gloo", "ranks": 4,
                         "link": "intra", "host": "cpu (x86_64)", "threads": 1,
                         "versions": {"torch": "2.14.1", "flopscope": "...", "python": "3.12"},
                         "fit": {"latency_us": 95.0, "bandwidth_gb_s": 1.9, "error": 0.21},
                         "kinds": {"all_reduce": {"latency_us": ..., "bandwidth_gb_s": ...,
                                                  "error": ...}, ...},
                         "groups": {"all_reduce": {"2": {...}, "4": {...}}, ...},
                         "points": [{"kind": "all_reduce", "ranks": 4, "payload_bytes": 4096,
                                     "bus_bytes": 6144, "seconds": 1.2e-4,
                                     "spread": 0.1}, ...],
                         "error_bars": {"step": 0.25}}

``fit`` is what the profile's link fields (``intra_node_gb_s``, ``intra_node_latency_us``) were
set to; ``kinds`` the fit of each collective kind alone and ``groups`` of each kind at each group
size alone, which the time model prefers (the most specific first) for the link that was
measured; ``error`` the median ``|fitted / measured - 1|`` over the fit's points;
``error_bars`` (optional) what a validation against real jobs measured (``"step"``: the 90th
percentile of ``|predicted / measured - 1|`` of whole training steps).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopscope.errors import UsageError
from flopscope.estimate.calibration import table_with

__all__ = ["LINKS", "LinkCalibration", "LinkFit", "LinkPoint", "fit_alpha_beta"]

LINKS = ("intra", "inter")
"""Which link a calibration measured: inside a node (loopback, NVLink) or across nodes."""


@dataclass(frozen=True)
class LinkPoint:
    """One collective timed at one payload size.

    Attributes:
        kind: the collective (``all_reduce``, ``all_gather``, ``reduce_scatter``,
            ``broadcast``, ``send``).
        ranks: the group's size.
        payload_bytes: bytes per rank (the convention of :mod:`flopscope.rules.collectives`).
        bus_bytes: the ring convention's bytes per rank.
        seconds: the median over repetitions of the slowest rank's time of one call.
        spread: (slowest - fastest repetition) / median: how noisy the point was.
    """

    kind: str
    ranks: int
    payload_bytes: int
    bus_bytes: int
    seconds: float
    spread: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The point in the file format."""
        return {"kind": self.kind, "ranks": self.ranks, "payload_bytes": self.payload_bytes,
                "bus_bytes": self.bus_bytes, "seconds": self.seconds, "spread": self.spread}


@dataclass(frozen=True)
class LinkFit:
    """``seconds = calls x latency + bus bytes / bandwidth``, fitted.

    Attributes:
        latency: seconds per call.
        bandwidth: bus bytes per second.
        error: median ``|fitted / measured - 1|`` over the points it was fitted to.
        points: how many points.
    """

    latency: float
    bandwidth: float
    error: float = 0.0
    points: int = 0

    def seconds(self, bus_bytes: float, calls: int = 1) -> float:
        """Time of ``calls`` collectives moving ``bus_bytes`` bus bytes in all."""
        return calls * self.latency + bus_bytes / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The fit in the file format (microseconds, GB/s)."""
        return {"latency_us": self.latency * 1e6, "bandwidth_gb_s": self.bandwidth / 1e9,
                "error": self.error, "points": self.points}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> LinkFit:
        """Read a fit (see :meth:`to_dict`).

        Raises:
            UsageError: a missing or malformed field.
        """
        try:
            fit = cls(float(data["latency_us"]) * 1e-6, float(data["bandwidth_gb_s"]) * 1e9,
                      float(data.get("error", 0.0)), int(data.get("points", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{where}: a fit needs latency_us and bandwidth_gb_s numbers "
                             f"({type(e).__name__}: {e})") from None
        if not fit.bandwidth > 0 or fit.latency < 0:
            raise UsageError(f"{where}: bandwidth must be positive and latency not negative")
        return fit


def fit_alpha_beta(points: Sequence[LinkPoint]) -> LinkFit:
    """Latency and bandwidth that minimise the summed squared relative error of
    ``latency + bus_bytes / bandwidth`` against each point's time (weighted least squares,
    weights ``1 / seconds^2``), both kept non-negative (a one-parameter fit where the
    two-parameter one would make either negative).

    Args:
        points: the points (at least one; at least two of different sizes for both terms).

    Returns:
        The fit.

    Raises:
        UsageError: no points, or no point that moves a byte.
    """
    if not points:
        raise UsageError("no points to fit a link's latency and bandwidth to")
    xs = [float(p.bus_bytes) for p in points]
    ts = [p.seconds for p in points]
    ws = [1.0 / t**2 for t in ts]
    # normal equations of min sum w (a + b x - t)^2, b = 1 / bandwidth
    s1, sx, sxx = sum(ws), sum(w * x for w, x in zip(ws, xs, strict=True)), sum(
        w * x * x for w, x in zip(ws, xs, strict=True))
    st, sxt = sum(w * t for w, t in zip(ws, ts, strict=True)), sum(
        w * x * t for w, x, t in zip(ws, xs, ts, strict=True))
    det = s1 * sxx - sx * sx
    a = b = -1.0
    if det > 0:
        a, b = (st * sxx - sx * sxt) / det, (s1 * sxt - sx * st) / det
    if b <= 0:  # latency-bound throughout (or one size): latency alone, bandwidth unbounded
        if not any(xs):
            raise UsageError("no point moved a byte: cannot fit a link's bandwidth")
        a, b = st / s1, 1e-30
    elif a < 0:  # through the origin
        a, b = 0.0, sxt / sxx
    fit = LinkFit(a, 1.0 / b)
    errors = [abs(fit.seconds(x) / t - 1) for x, t in zip(xs, ts, strict=True)]
    return LinkFit(a, 1.0 / b, statistics.median(errors), len(points))


@dataclass(frozen=True)
class LinkCalibration:
    """What a collective probe measured on one machine.

    Attributes:
        date: when (ISO 8601, UTC).
        backend: the process group's backend (``gloo``, ``nccl``).
        ranks: processes in the probe.
        link: which link the ranks shared (:data:`LINKS`).
        host: the machine (``cpu (x86_64)``, a GPU's name).
        threads: torch's intra-op threads per process.
        versions: torch, flopscope and Python versions.
        points: the raw points.
        fit: every point together: the profile's link fields.
        kinds: each kind's own fit, over every group size.
        groups: kind -> group size -> the fit of that kind at that group size alone (on an
            oversubscribed CPU the latency grows with the ranks that must all be scheduled).
        error_bars: what a validation against real jobs measured (``"step"``).
    """

    date: str
    backend: str
    ranks: int
    link: str
    host: str
    threads: int
    versions: Mapping[str, str]
    points: tuple[LinkPoint, ...]
    fit: LinkFit
    kinds: Mapping[str, LinkFit] = field(default_factory=dict)
    error_bars: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[str, Mapping[int, LinkFit]] = field(default_factory=dict)

    def fit_for(self, kind: str, group_size: int) -> LinkFit | None:
        """The most specific fit for a collective: its kind at its group size, else its kind
        over every size, else ``None`` (the profile's link fields apply)."""
        exact = self.groups.get(kind, {}).get(group_size)
        return exact if exact is not None else self.kinds.get(kind)

    @classmethod
    def of_points(cls, points: Iterable[LinkPoint], **info: Any) -> LinkCalibration:
        """The calibration of ``points``: the overall fit and one per kind.

        Args:
            points: the probe's points.
            **info: the other attributes (date, backend, ranks, link, host, threads,
                versions).

        Returns:
            The calibration.
        """
        pts = tuple(points)
        kinds = {k: fit_alpha_beta([p for p in pts if p.kind == k])
                 for k in dict.fromkeys(p.kind for p in pts)}
        groups: dict[str, dict[int, LinkFit]] = {}
        for k, n in dict.fromkeys((p.kind, p.ranks) for p in pts):
            groups.setdefault(k, {})[n] = fit_alpha_beta(
                [p for p in pts if p.kind == k and p.ranks == n])
        return cls(points=pts, fit=fit_alpha_beta(pts), kinds=kinds, groups=groups, **info)

    def to_dict(self) -> dict[str, Any]:
        """The block in the file format (see the module docstring)."""
        out: dict[str, Any] = {
            "date": self.date, "backend": self.backend, "ranks": self.ranks, "link": self.link,
            "host": self.host, "threads": self.threads, "versions": dict(self.versions),
            "fit": self.fit.to_dict(), "kinds": {k: f.to_dict() for k, f in self.kinds.items()},
            "groups": {k: {str(n): f.to_dict() for n, f in by.items()}
                       for k, by in self.groups.items()},
            "points": [p.to_dict() for p in self.points]}
        if self.error_bars:
            out["error_bars"] = dict(self.error_bars)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "profile") -> LinkCalibration:
        """Read the block (see the module docstring).

        Args:
            data: the ``"link_calibration"`` value of a profile.
            where: what to name in error messages.

        Returns:
            The calibration.

        Raises:
            UsageError: a missing or malformed field.
        """
        where = f"{where}: link_calibration"
        data = table_with(data, where, ("date", "backend", "ranks", "link", "fit", "points"))
        if data["link"] not in LINKS:
            raise UsageError(f"{where}: link must be one of {', '.join(LINKS)}, not "
                             f"{data['link']!r}")
        raw = data["points"]
        if not isinstance(raw, list):
            raise UsageError(f"{where}: points must be a list")
        points = []
        for i, p in enumerate(raw):
            try:
                point = LinkPoint(str(p["kind"]), int(p["ranks"]), int(p["payload_bytes"]),
                                  int(p["bus_bytes"]), float(p["seconds"]),
                                  float(p.get("spread", 0.0)))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise UsageError(f"{where}: point {i} is malformed ({type(e).__name__}: {e}); "
                                 "each needs kind, ranks, payload_bytes, bus_bytes, seconds"
                                 ) from None
            if not (point.seconds > 0 and math.isfinite(point.seconds)):
                raise UsageError(f"{where}: point {i}: seconds must be positive")
            points.append(point)
        kinds = data.get("kinds", {})
        groups = data.get("groups", {})
        bars = data.get("error_bars", {})
        versions = data.get("versions", {})
        if not all(isinstance(t, Mapping) for t in (kinds, groups, bars, versions)) or not all(
                isinstance(t, Mapping) for t in groups.values()):
            raise UsageError(f"{where}: kinds, groups, error_bars and versions must be tables")
        try:
            ranks, threads = int(data["ranks"]), int(data.get("threads", 1))
            error_bars = {str(k): float(v) for k, v in bars.items()}
            by_group = {str(k): {int(n): LinkFit.from_dict(f, f"{where}: groups: {k}: {n}")
                                 for n, f in by.items()} for k, by in groups.items()}
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: {e}") from None
        return cls(str(data["date"]), str(data["backend"]), ranks, str(data["link"]),
                   str(data.get("host", "")), threads,
                   {str(k): str(v) for k, v in versions.items()}, tuple(points),
                   LinkFit.from_dict(data["fit"], f"{where}: fit"),
                   {str(k): LinkFit.from_dict(v, f"{where}: kinds: {k}")
                    for k, v in kinds.items()}, error_bars, by_group)
