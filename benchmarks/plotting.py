"""What the benchmark plots share: matplotlib on the file-only Agg backend (or a reason why
not), counted-against-measured axes (log-log over whole decades with the line y = x), and saving.

Used by ``benchmarks/validation.py`` (one group's scatter), ``benchmarks/validation_page.py`` (the
page's two-panel scatter) and ``benchmarks/document.py`` (agreement and overhead charts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MISSING = "matplotlib is not installed (pip install 'flopscope[plot]')"
"""Why a plot was not written, when matplotlib cannot be imported."""


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), or ``None`` when
    matplotlib is not installed (say :data:`MISSING`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def decades(values: Iterable[float], margin: float = 1.5) -> tuple[float, float]:
    """The whole decades around ``values`` with a margin: for 2e3 .. 7e6 (margin 1.5), 1e3 .. 1e7.

    Args:
        values: positive numbers.
        margin: a factor kept free below the smallest and above the largest value.

    Returns:
        (low, high), powers of ten.

    Raises:
        ValueError: no values, or one that is not positive.
    """
    vs = list(values)
    if not vs or min(vs) <= 0:
        raise ValueError(f"log axes need positive values, got {vs[:5]}")
    return (10.0 ** math.floor(math.log10(min(vs) / margin)),
            10.0 ** math.ceil(math.log10(max(vs) * margin)))


def counted_vs_measured_axes(ax: Any, values: Iterable[float], *, title: str,
                             xlabel: str = "counted FLOPs (flopscope)",
                             ylabel: str = "measured FLOPs (executed instructions)",
                             title_size: float = 9) -> tuple[float, float]:
    """Set up one counted-against-measured panel: both axes logarithmic over the same whole
    decades (so y = x is the diagonal), the dashed grey line y = x (first in the legend), labels,
    title and a light grid. Draw the points after this, then the legend.

    Args:
        ax: a matplotlib ``Axes``.
        values: every counted and every measured value that will be drawn.
        title: the panel's title.
        xlabel: the horizontal axis label.
        ylabel: the vertical axis label.
        title_size: the title's font size.

    Returns:
        The axes' (low, high) limits.
    """
    lo, hi = decades(values)
    ax.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    ax.grid(True, which="both", linewidth=0.3)
    return lo, hi


def save(plt: Any, fig: Any, path: Path, *, dpi: int = 110) -> None:
    """Lay out, write ``path`` (making its directory) and close the figure.

    Args:
        plt: ``matplotlib.pyplot`` (from :func:`pyplot`).
        fig: the figure.
        path: the image file.
        dpi: resolution.
    """
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
