"""Charts of where a model's cost goes (needs the optional extra ``flopscope[plot]``: matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flopscope.errors import UsageError
from flopscope.render.units import PREFIXES, human, shared_prefix

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["plot_report", "require_matplotlib"]

_SUFFIXES = (".png", ".svg", ".pdf")


def require_matplotlib() -> Any:
    """Check that plotting can work, before any slow work that would end in a plot.

    Returns:
        The ``matplotlib`` module.

    Raises:
        ImportError: matplotlib is not installed (the message says what to install).
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: pip install 'flopscope[plot]'"
        ) from None
    return matplotlib


def _pyplot() -> Any:
    matplotlib = require_matplotlib()
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _bars(report: ReportData, by: str, depth: int, top: int) -> tuple[list[tuple[str, int, int]], str]:
    """(label, flops, macs) of the largest items, and a description of what they are."""
    if by == "op":
        items = [(op, s.cost.flops, s.cost.macs) for op, s in report.by_op().items()]
        what = "operators"
    else:
        stats = report.by_module()
        # Modules at exactly `depth`, plus shallower leaves, so the bars partition the total.
        paths = [p for p in stats if p]
        level = {p: p.count(".") + 1 for p in paths}
        has_child = {p.rsplit(".", 1)[0] for p in paths if "." in p}
        chosen = [p for p in paths if level[p] == depth or (level[p] < depth and p not in has_child)]
        items = [
            (f"{p} ({stats[p].type})" if stats[p].type else p, stats[p].inclusive.flops,
             stats[p].inclusive.macs)
            for p in chosen
        ]
        own = stats[""].self_cost if "" in stats else None
        if own is not None and own.flops:
            items.append(("(root, own operators)", own.flops, own.macs))
        what = f"modules at depth {depth}"
    items = [i for i in items if i[1] > 0]
    items.sort(key=lambda i: -i[1])
    if len(items) > top:
        rest = items[top - 1:]
        items = items[: top - 1] + [(f"{len(rest)} others", sum(i[1] for i in rest),
                                     sum(i[2] for i in rest))]
    return items, what


def plot_report(
    report: ReportData,
    path: str | Path,
    *,
    by: str = "module",
    depth: int = 1,
    top: int = 15,
    title: str | None = None,
) -> Path:
    """Write a horizontal bar chart of the largest modules (or operators) by FLOPs.

    Each bar is labelled with its FLOPs, MACs and share of the total; the title names the model
    and its totals.

    Args:
        report: the report.
        path: the image file, ``.png``, ``.svg`` or ``.pdf``.
        by: ``"module"`` (modules at ``depth``) or ``"op"`` (operators).
        depth: module tree level to chart (1 = the root's children).
        top: bars at most (the rest are summed in one bar).
        title: the chart title (default: the model and its totals).

    Returns:
        The path written.

    Raises:
        UsageError: an unsupported file suffix, a bad ``by``, or nothing to plot.
        ImportError: matplotlib is not installed.
    """
    path = Path(path)
    if path.suffix.lower() not in _SUFFIXES:
        raise UsageError(f"cannot plot to {str(path)!r}: use a file name ending in .png, .svg or .pdf")
    if by not in ("module", "op"):
        raise UsageError(f"unknown breakdown {by!r}: use 'module' or 'op'")
    plt = _pyplot()
    items, what = _bars(report, by, max(depth, 1), max(top, 2))
    if not items:
        raise UsageError("nothing to plot: the report has no FLOPs")
    total = report.total()
    prefix = shared_prefix(i[1] for i in items)
    scale = PREFIXES[prefix]
    labels = [i[0] if len(i[0]) <= 48 else "..." + i[0][-45:] for i in items]
    values = [i[1] / scale for i in items]

    height = 1.6 + 0.38 * len(items)
    fig, ax = plt.subplots(figsize=(10, height), layout="constrained")
    ys = list(range(len(items)))[::-1]
    colors = ["#9a9a9a" if label.endswith(" others") or label.startswith("(root") else "#3b75af"
              for label, _, _ in items]
    bars = ax.barh(ys, values, color=colors, height=0.7)
    ax.set_yticks(ys, labels, fontsize=9)
    ax.set_xlabel(f"{prefix}FLOP (floating-point operations, forward"
                  f"{' + backward' if len(report.phases) > 1 else ''})")
    for bar, (_, flops, macs) in zip(bars, items, strict=True):
        share = 100 * flops / total.flops if total.flops else 0.0
        text = f" {human(flops, 'FLOP')}"
        if macs:
            text += f" · {human(macs, 'MAC')}"
        text += f" · {share:.1f}%"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center",
                fontsize=8, color="#222222")
    ax.set_xlim(0, max(values) * 1.45)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    source = report.meta.get("source")
    name = report.model or "counted code"
    heading = title or f"{name}{f' ({source})' if source and source != name else ''}: where the FLOPs go"
    sub = (f"{human(report.params)} params · {human(total.macs, 'MAC', digits=3)} · "
           f"{human(total.flops, 'FLOP', digits=3)} — top {what}")
    inputs = report.meta.get("inputs")
    if inputs:
        sub += f" · input {', '.join(map(str, inputs))}"
    ax.set_title(f"{heading}\n{sub}", loc="left", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
