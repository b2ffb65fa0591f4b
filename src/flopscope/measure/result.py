"""Measurement results and their comparison with counted FLOPs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Comparison", "Measurement", "SegmentComparison"]


@dataclass(frozen=True)
class Measurement:
    """Floating-point operations executed by a region of code.

    Attributes:
        backend: the backend that measured (``"valgrind"``, ``"perf"``, ``"papi"``).
        flops: executed floating-point operations, all precisions together (FMA = 2).
        flops_by_precision: ``flops`` split by precision (``"double"``, ``"single"``, ...);
            backends that cannot tell precisions apart report everything under ``"any"``.
        segments: executed FLOPs per segment module path (``""`` is code outside them; see
            :func:`~flopscope.measure.workload.segment_paths`); empty when the backend cannot
            split the region.
        by_instruction: executed FLOPs per instruction mnemonic (valgrind only).
        region_seconds: wall time of the measured region (under valgrind: slowed down).
        wall_seconds: wall time of the whole measurement, setup included.
        notes: how the measurement was made and what to keep in mind when reading it.
    """

    backend: str
    flops: int
    flops_by_precision: Mapping[str, int]
    segments: Mapping[str, int] = field(default_factory=dict)
    by_instruction: Mapping[str, int] = field(default_factory=dict)
    region_seconds: float = 0.0
    wall_seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def compare(
        self, counted_flops: int, counted_segments: Mapping[str, int] | None = None
    ) -> Comparison:
        """Compare with counted FLOPs.

        Args:
            counted_flops: FLOPs counted by flopscope for the same code (``Report.flops``).
            counted_segments: counted FLOPs per segment module path, with ``""`` for the ops
                outside them (:func:`~flopscope.measure.request.counted_segments`), to compare
                segment by segment when the measurement has them.

        Returns:
            A :class:`Comparison`.
        """
        rows: list[SegmentComparison] = []
        if counted_segments is not None and self.segments:
            for path in sorted(set(self.segments) | set(counted_segments), key=_path_key):
                rows.append(
                    SegmentComparison(
                        path, counted_segments.get(path, 0), self.segments.get(path, 0)
                    )
                )
        return Comparison(counted_flops, self.flops, tuple(rows))


def _path_key(path: str) -> tuple[int, str]:
    return (0 if path == "" else 1, path)


def _ratio(measured: int, counted: int) -> float:
    if counted == 0:
        return float("inf") if measured else 1.0
    return measured / counted


@dataclass(frozen=True)
class SegmentComparison:
    """Counted vs measured FLOPs of one segment module.

    Attributes:
        path: module path (``""`` = ops of the root module outside its children).
        counted_flops: counted FLOPs.
        measured_flops: measured FLOPs.
    """

    path: str
    counted_flops: int
    measured_flops: int

    @property
    def ratio(self) -> float:
        """measured / counted (``inf`` if nothing was counted but something executed)."""
        return _ratio(self.measured_flops, self.counted_flops)

    @property
    def difference(self) -> int:
        """measured - counted FLOPs."""
        return self.measured_flops - self.counted_flops


@dataclass(frozen=True)
class Comparison:
    """Counted vs measured FLOPs.

    Attributes:
        counted_flops: FLOPs counted by flopscope.
        measured_flops: FLOPs executed.
        segments: per segment module comparison (may be empty).
    """

    counted_flops: int
    measured_flops: int
    segments: tuple[SegmentComparison, ...] = ()

    @property
    def ratio(self) -> float:
        """measured / counted."""
        return _ratio(self.measured_flops, self.counted_flops)

    @property
    def relative_difference(self) -> float:
        """(measured - counted) / counted."""
        return self.ratio - 1.0

    def within(self, tolerance: float) -> bool:
        """Whether measured is within ``tolerance`` (relative) of counted.

        Args:
            tolerance: allowed relative difference, e.g. ``0.03`` for 3 %.

        Returns:
            True if ``abs(measured / counted - 1) <= tolerance``.
        """
        return abs(self.relative_difference) <= tolerance

    def largest_gaps(self, n: int = 3) -> list[SegmentComparison]:
        """The segments contributing most to the difference.

        Args:
            n: how many to return.

        Returns:
            Up to ``n`` segments ordered by absolute difference, largest first.
        """
        return sorted(self.segments, key=lambda s: abs(s.difference), reverse=True)[:n]
