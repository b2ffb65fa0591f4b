"""Rendering reports for people: the module tree table (rich), plain text."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from flopscope.report import Report
from flopscope.units import human

__all__ = ["render_text", "rich_table"]


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def rich_table(report: Report, depth: int = 2) -> Table:
    """The module tree to ``depth`` levels below the root: params, MACs, FLOPs, share, calls."""
    stats = report.by_module()
    total = report.total()
    title = f"{report.model or 'counted code'}: {human(report.params)} params, " \
        f"{human(total.macs, 'MAC')}, {human(total.flops, 'FLOP')}"
    if report.shape_only:
        title += " (shape-only)"
    table = Table(title=title, title_justify="left")
    for col in ("module", "type", "params", "MACs", "FLOPs", "share", "calls"):
        table.add_column(col, justify="left" if col in ("module", "type") else "right", no_wrap=True)
    for path, s in stats.items():
        level = 0 if path == "" else path.count(".") + 1
        if level > depth:
            continue
        if path and s.calls == 0 and s.inclusive.flops == 0 and s.params.inclusive == 0:
            continue
        name = "(root)" if path == "" else "  " * (level - 1) + path.rsplit(".", 1)[-1]
        table.add_row(
            name,
            s.type,
            human(s.params.inclusive),
            human(s.inclusive.macs),
            human(s.inclusive.flops),
            _pct(s.inclusive.flops, total.flops),
            str(s.calls),
        )
    return table


def render_text(report: Report, depth: int = 2, width: int = 120) -> str:
    """The table and the warnings as plain text (no colour codes)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, force_terminal=False)
    console.print(rich_table(report, depth=depth))
    if report.uncounted:
        console.print("uncounted operators (0 FLOPs assumed):")
        for op, n in report.uncounted.items():
            console.print(f"  {op}: {n} calls")
    if report.opaque:
        console.print("possibly opaque modules (outputs from allocations only): " + ", ".join(report.opaque))
    for r in report.rule_mismatches():
        console.print(
            f"module rule on '{r.module}' says {human(r.cost.macs, 'MAC')}; the operators inside "
            f"measured {human(r.shadowed.macs, 'MAC')}"
        )
    return buf.getvalue()
