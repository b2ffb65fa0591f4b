"""Comparing two reports module by module: what changed, and by how much (a cost guard for CI).

    >>> d = diff_reports(baseline, current)
    >>> [c.path for c in d.beyond(0.01)]      # modules whose params, MACs or FLOPs moved > 1%
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopscope.report.records import ModuleStats
from flopscope.report.report import Report

__all__ = ["ModuleChange", "ReportDiff", "diff_reports", "measured_times", "relative_change"]


def relative_change(a: int, b: int) -> float:
    """``|b - a| / |a|``: 0 when equal, infinite when ``a`` is 0 and ``b`` is not.

    Args:
        a: the old value.
        b: the new value.

    Returns:
        The relative change.
    """
    if a == b:
        return 0.0
    if a == 0:
        return math.inf
    return abs(b - a) / abs(a)


def _counts(stats: ModuleStats | None) -> tuple[int, int, int]:
    if stats is None:
        return (0, 0, 0)
    return (stats.params.inclusive, stats.inclusive.macs, stats.inclusive.flops)


@dataclass(frozen=True)
class ModuleChange:
    """One module that differs between report A and report B.

    Attributes:
        path: the module path (``""`` is the root).
        a: the module in A (``None``: only in B).
        b: the module in B (``None``: only in A).
    """

    path: str
    a: ModuleStats | None
    b: ModuleStats | None

    @property
    def counts_a(self) -> tuple[int, int, int]:
        """Inclusive (params, MACs, FLOPs) in A (zeros when absent)."""
        return _counts(self.a)

    @property
    def counts_b(self) -> tuple[int, int, int]:
        """Inclusive (params, MACs, FLOPs) in B (zeros when absent)."""
        return _counts(self.b)

    @property
    def counts_differ(self) -> bool:
        """Whether params, MACs or FLOPs differ (not only bytes or parameter details)."""
        return self.counts_a != self.counts_b

    @property
    def relative(self) -> float:
        """The largest relative change of params, MACs and FLOPs."""
        return max(relative_change(x, y)
                   for x, y in zip(self.counts_a, self.counts_b, strict=True))

    @property
    def depth(self) -> int:
        """Level in the module tree (the root is 0)."""
        return 0 if self.path == "" else self.path.count(".") + 1

    @property
    def presence(self) -> str:
        """``"only in A"``, ``"only in B"`` or ``""`` (in both)."""
        return "only in A" if self.b is None else "only in B" if self.a is None else ""


@dataclass(frozen=True)
class ReportDiff:
    """Every module that differs between two reports, in A's module order then B's new ones.

    Attributes:
        changes: the modules that differ in presence, inclusive cost or parameters.
        compared: how many module paths were compared (the union of both reports').
    """

    changes: tuple[ModuleChange, ...]
    compared: int

    def beyond(self, tolerance: float) -> tuple[ModuleChange, ...]:
        """The changes whose params, MACs or FLOPs moved by more than ``tolerance``.

        Args:
            tolerance: the allowed relative change (``0.01`` is 1%).

        Returns:
            Those changes, in order.
        """
        return tuple(c for c in self.changes if c.counts_differ and c.relative > tolerance)

    @property
    def identical(self) -> bool:
        """No module differs."""
        return not self.changes


def diff_reports(a: Report, b: Report) -> ReportDiff:
    """Compare two reports module by module (inclusive params, MACs, FLOPs, bytes).

    Args:
        a: the baseline.
        b: the new report.

    Returns:
        The :class:`ReportDiff`.
    """
    sa, sb = a.by_module(), b.by_module()
    paths = list(sa) + [p for p in sb if p not in sa]
    changes = []
    for path in paths:
        ma, mb = sa.get(path), sb.get(path)
        if ma is not None and mb is not None and (ma.inclusive, ma.params) == (mb.inclusive,
                                                                                mb.params):
            continue
        changes.append(ModuleChange(path, ma, mb))
    return ReportDiff(tuple(changes), len(paths))


def measured_times(report: Report) -> dict[str, float] | None:
    """A profiled report's measured time per module (inclusive, the median run's), read from its
    ``"measured"`` section, whether made by :func:`flopscope.profile` or read back from JSON.

    Args:
        report: the report.

    Returns:
        Module path -> seconds, or ``None`` when the report has no measured time.
    """
    section = report.section("measured")
    if section is None:
        return None
    data = section.to_dict()
    if not isinstance(data, dict) or not isinstance(data.get("by_module"), dict):
        return None
    return {path: float(row["seconds"]) for path, row in data["by_module"].items()}
