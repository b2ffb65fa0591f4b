"""A report as a rich renderable and as plain text: headline, module tree (or every operator),
top operators, warnings, and what the report's sections add (columns and lines)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from flopscope.render.common import (
    headline,
    inputs_note,
    module_rows,
    num,
    pct,
    phase_line,
    report_warnings,
    subject,
    unit_header,
)
from flopscope.render.options import By
from flopscope.render.units import human
from flopscope.report.sections import Column

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["render_text", "rich_report", "rich_table", "section_columns", "section_lines",
           "table_width"]


def section_columns(report: ReportData) -> list[Column]:
    """The extra table columns of every section of ``report``, in order."""
    return [c for s in report.sections for c in s.columns()]


def section_lines(report: ReportData) -> list[str]:
    """The lines under the tables of every section of ``report``, in order."""
    return [line for s in report.sections for line in s.lines()]


def table_width(report: ReportData, width: int | None = None) -> int:
    """A table's console width: as given, else 120 and 14 more per extra column."""
    return width if width is not None else 120 + 14 * len(section_columns(report))


def rich_table(report: ReportData, depth: int = 2, *, unit: str | None = None,
               columns: Sequence[Column] = ()) -> Table:
    """The module tree to ``depth`` levels below the root: params, MACs, FLOPs, bytes moved,
    share, calls, any extra ``columns``, and a total row.

    Args:
        report: the report.
        depth: levels below the root.
        unit: a fixed SI prefix for MACs and FLOPs (``"G"``), or ``None`` for automatic.
        columns: extra columns (see :class:`Column`).

    Returns:
        A rich table.
    """
    total = report.total()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("module", "type", "params", unit_header("MACs", unit),
                unit_header("FLOPs", unit), "bytes", "share", "calls",
                *(c.header for c in columns)):
        table.add_column(col, justify="left" if col in ("module", "type") else "right",
                         no_wrap=True)
    for row in module_rows(report, depth):
        indent = "  " * max(row.level - 1, 0)
        table.add_row(
            indent + row.name,
            row.type,
            human(row.params),
            num(row.macs, unit),
            num(row.flops, unit),
            human(row.bytes, "B"),
            pct(row.flops, total.flops),
            str(row.calls),
            *(c.by_module.get(row.path, "-") for c in columns),
        )
    table.add_section()
    table.add_row("total", "", human(report.params), num(total.macs, unit),
                  num(total.flops, unit), human(total.bytes, "B"),
                  pct(total.flops, total.flops), "", *(c.total for c in columns))
    return table


def ops_table(report: ReportData, top: int | None, unit: str | None,
               columns: Sequence[Column] = ()) -> Table:
    total = report.total()
    ops = list(report.by_op().items())
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("operator", "calls", unit_header("MACs", unit), unit_header("FLOPs", unit),
                "bytes", "share", *(c.header for c in columns)):
        table.add_column(col, justify="left" if col == "operator" else "right", no_wrap=True)
    shown = ops if top is None else ops[:top]
    uncounted = report.uncounted
    for op, s in shown:
        table.add_row(op + (" (no rule)" if op in uncounted else ""), str(s.calls),
                      num(s.cost.macs, unit), num(s.cost.flops, unit), human(s.cost.bytes, "B"),
                      pct(s.cost.flops, total.flops), *(c.by_op.get(op, "-") for c in columns))
    if top is not None and len(ops) > top:
        rest = ops[top:]
        table.add_row(f"... {len(rest)} more", str(sum(s.calls for _, s in rest)),
                      num(sum(s.cost.macs for _, s in rest), unit),
                      num(sum(s.cost.flops for _, s in rest), unit),
                      human(sum(s.cost.bytes for _, s in rest), "B"),
                      pct(sum(s.cost.flops for _, s in rest), total.flops),
                      *("" for _ in columns))
    return table


def warning_panel(report: ReportData) -> Panel | None:
    warnings = report_warnings(report)
    if not warnings:
        return None
    text = Text()
    for i, w in enumerate(warnings):
        if i:
            text.append("\n")
        text.append(w.title + ":\n", style="bold yellow")
        for item in w.items:
            text.append(f"  {item}\n")
        text.append(f"  -> {w.advice}", style="italic")
    return Panel(text, title="warnings", title_align="left", border_style="yellow", expand=False,
                 box=box.ASCII)


def rich_report(
    report: ReportData,
    *,
    depth: int = 2,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
    notes: bool = True,
) -> RenderableType:
    """The whole report as one rich renderable: headline, the table, top operators, warnings,
    and the lines its sections add.

    This is what ``Report.__rich__`` (Jupyter, ``rich.print``) and ``flopscope count`` show.

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        by: ``"module"`` (module tree and top operators) or ``"op"`` (every operator).
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.
        notes: show the sections' lines at the end.

    Returns:
        A rich renderable.
    """
    by = By(by)
    columns = section_columns(report)
    parts: list[RenderableType] = []
    head = Text()
    head.append(subject(report), style="bold")
    note = inputs_note(report)
    if note:
        head.append(f"  [{note}]", style="dim")
    head.append("\n" + headline(report, unit), style="bold cyan")
    line = phase_line(report, unit)
    if line:
        head.append("\n" + line)
    parts.append(head)
    if by is By.MODULE:
        parts.append(Text(""))
        parts.append(rich_table(report, depth, unit=unit, columns=columns))
        if report.by_op():
            parts.append(Text(f"\ntop operators (by FLOPs, all {len(report.by_op())}: --by op)",
                              style="bold"))
            parts.append(ops_table(report, top_ops, unit, columns))
    else:
        parts.append(Text(""))
        parts.append(ops_table(report, None, unit, columns))
    panel = warning_panel(report)
    if panel is not None:
        parts.append(Text(""))
        parts.append(panel)
    if notes:
        parts.extend(Text(line) for line in section_lines(report))
    return Group(*parts)


def render_text(
    report: ReportData,
    depth: int = 2,
    width: int | None = None,
    *,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
) -> str:
    """The report (see :func:`rich_report`) as plain text without colour codes; the sections'
    lines follow the tables after a blank line, as they are (never wrapped).

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        width: the console width in characters (default: see :func:`table_width`).
        by: ``"module"`` or ``"op"``.
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.

    Returns:
        The text, ending in a newline.
    """
    buf = io.StringIO()
    console = Console(file=buf, width=table_width(report, width), no_color=True,
                      force_terminal=False, color_system=None, emoji=False, highlight=False)
    console.print(rich_report(report, depth=depth, by=by, unit=unit, top_ops=top_ops,
                              notes=False))
    text = "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
    lines = section_lines(report)
    if lines:
        text += "\n" + "\n".join(lines) + "\n"
    return text
