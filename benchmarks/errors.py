"""Error statistics of the validations: quantiles of |predicted / measured - 1|."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = ["abs_errors", "quantile"]


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (the nearest rank; NaN for none)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def abs_errors(ratios: Iterable[float]) -> dict[str, float | int]:
    """The count, median and 90th percentile of ``|ratio - 1|`` over predicted / measured
    ratios."""
    errs = [abs(r - 1) for r in ratios]
    if not errs:
        return {"cases": 0}
    return {"cases": len(errs), "median_abs_error": statistics.median(errs),
            "p90_abs_error": quantile(errs, 0.9)}
