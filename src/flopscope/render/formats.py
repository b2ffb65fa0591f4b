"""Rendering reports for people and programs: table (rich), markdown, json, csv.

Units live here and in :mod:`flopscope.render.units` only; a :class:`~flopscope.Report` holds integers.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from flopscope.cost import Phase
from flopscope.render.units import human, scaled
from flopscope.report.report import Report, set_display

__all__ = [
    "By",
    "Column",
    "Format",
    "ModuleRow",
    "ReportWarning",
    "module_rows",
    "render",
    "render_csv",
    "render_json",
    "render_markdown",
    "render_text",
    "report_warnings",
    "rich_report",
    "rich_table",
]


class By(str, Enum):
    """What the main table lists."""

    MODULE = "module"
    OP = "op"


class Format(str, Enum):
    """Output formats of :func:`render`."""

    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"
    CSV = "csv"


@dataclass(frozen=True)
class Column:
    """An extra column of the module and operator tables, computed elsewhere (the roofline
    estimate adds intensity, time and bound): cells by module path and by operator, and the
    total row's cell. A missing cell shows ``-``.

    Attributes:
        header: the column's title.
        by_module: module path -> cell.
        by_op: operator name -> cell.
        total: the total row's cell.
    """

    header: str
    by_module: Mapping[str, str]
    by_op: Mapping[str, str]
    total: str = ""


@dataclass(frozen=True)
class ModuleRow:
    """One visible row of the module tree."""

    path: str
    name: str
    level: int
    type: str
    params: int
    macs: int
    flops: int
    calls: int
    bytes: int = 0


@dataclass(frozen=True)
class ReportWarning:
    """One item of the warning block: a headline and what to do about it."""

    title: str
    items: tuple[str, ...]
    advice: str


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _num(value: int, prefix: str | None) -> str:
    """A table cell: auto prefix in the cell, or a bare number when the header names the unit."""
    if prefix is None:
        return human(value)
    return scaled(value, prefix)


def module_rows(report: Report, depth: int = 2) -> list[ModuleRow]:
    """The modules shown in a tree of ``depth`` levels below the root, in model order.

    Modules that never ran and hold no parameters are left out.

    Args:
        report: the report.
        depth: levels below the root (0 shows the root only).

    Returns:
        The rows.
    """
    rows = []
    for path, s in report.by_module().items():
        level = 0 if path == "" else path.count(".") + 1
        if level > depth:
            continue
        if path and s.calls == 0 and s.inclusive.flops == 0 and s.params.inclusive == 0:
            continue
        name = "(root)" if path == "" else path.rsplit(".", 1)[-1]
        rows.append(ModuleRow(path, name, level, s.type, s.params.inclusive, s.inclusive.macs,
                              s.inclusive.flops, s.calls, s.inclusive.bytes))
    return rows


def report_warnings(report: Report) -> list[ReportWarning]:
    """What the reader of a report must know: uncounted operators, opaque modules, rule mismatches.

    Args:
        report: the report.

    Returns:
        The warnings, empty when there is nothing to say.
    """
    out = []
    if report.uncounted:
        out.append(ReportWarning(
            f"{len(report.uncounted)} operator(s) had no rule and count as 0 FLOPs",
            tuple(f"{op} ({n} call{'s' if n != 1 else ''})"
                  for op, n in report.uncounted.items()),
            "add a rule (--rules file.py), or fail on them with --strict",
        ))
    if report.opaque:
        out.append(ReportWarning(
            f"{len(report.opaque)} module(s) produced outputs without arithmetic (possibly opaque)",
            tuple(f"'{p}'" for p in report.opaque),
            "their work may bypass the dispatcher: give them a module rule",
        ))
    mismatches = report.rule_mismatches()
    if mismatches:
        out.append(ReportWarning(
            f"{len(mismatches)} module rule(s) disagree with the operators they replaced",
            tuple(
                f"'{r.module}' ({r.rule}): rule {human(r.cost.macs, 'MAC')} / "
                f"{human(r.cost.flops, 'FLOP')}, operators {human(r.shadowed.macs, 'MAC')} / "
                f"{human(r.shadowed.flops, 'FLOP')}"
                for r in mismatches
            ),
            "check the module rule",
        ))
    return out


def _subject(report: Report) -> str:
    source = report.meta.get("source")
    name = report.model or "counted code"
    return f"{name} ({source})" if source and source != name else name


def _inputs_note(report: Report) -> str:
    notes = []
    inputs = report.meta.get("inputs")
    if inputs:
        notes.append("input " + ", ".join(map(str, inputs)))
    if report.shape_only:
        notes.append("shape-only")
    phases = report.phases
    if len(phases) > 1 or (phases and phases[0] is not Phase.FORWARD):
        notes.append(" + ".join(ph.value for ph in phases))  # forward + backward + optimizer
    return ", ".join(notes)


def _headline(report: Report, prefix: str | None) -> str:
    total = report.total()
    p = prefix
    return (
        f"{report.params:,} params"
        + (f" ({human(report.params, digits=2)})" if report.params >= 1000 else "")
        + " · "
        f"{human(total.macs, 'MAC', prefix=p, digits=3)} · {human(total.flops, 'FLOP', prefix=p, digits=3)}"
    )


def _phase_line(report: Report, prefix: str | None) -> str:
    if len(report.phases) < 2:
        return ""
    parts = [
        f"{ph.value}: {human(report.total(ph).macs, 'MAC', prefix=prefix, digits=3)}, "
        f"{human(report.total(ph).flops, 'FLOP', prefix=prefix, digits=3)}"
        for ph in report.phases
    ]
    return "; ".join(parts)


def _unit_header(name: str, prefix: str | None) -> str:
    return f"{name} ({prefix})" if prefix else name


# -- rich ------------------------------------------------------------------------------------------
def rich_table(report: Report, depth: int = 2, *, unit: str | None = None,
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
    for col in ("module", "type", "params", _unit_header("MACs", unit),
                _unit_header("FLOPs", unit), "bytes", "share", "calls",
                *(c.header for c in columns)):
        table.add_column(col, justify="left" if col in ("module", "type") else "right",
                         no_wrap=True)
    for row in module_rows(report, depth):
        indent = "  " * max(row.level - 1, 0)
        table.add_row(
            indent + row.name,
            row.type,
            human(row.params),
            _num(row.macs, unit),
            _num(row.flops, unit),
            human(row.bytes, "B"),
            _pct(row.flops, total.flops),
            str(row.calls),
            *(c.by_module.get(row.path, "-") for c in columns),
        )
    table.add_section()
    table.add_row("total", "", human(report.params), _num(total.macs, unit),
                  _num(total.flops, unit), human(total.bytes, "B"),
                  _pct(total.flops, total.flops), "", *(c.total for c in columns))
    return table


def _ops_table(report: Report, top: int | None, unit: str | None,
               columns: Sequence[Column] = ()) -> Table:
    total = report.total()
    ops = list(report.by_op().items())
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("operator", "calls", _unit_header("MACs", unit), _unit_header("FLOPs", unit),
                "bytes", "share", *(c.header for c in columns)):
        table.add_column(col, justify="left" if col == "operator" else "right", no_wrap=True)
    shown = ops if top is None else ops[:top]
    uncounted = report.uncounted
    for op, s in shown:
        table.add_row(op + (" (no rule)" if op in uncounted else ""), str(s.calls),
                      _num(s.cost.macs, unit), _num(s.cost.flops, unit), human(s.cost.bytes, "B"),
                      _pct(s.cost.flops, total.flops), *(c.by_op.get(op, "-") for c in columns))
    if top is not None and len(ops) > top:
        rest = ops[top:]
        table.add_row(f"... {len(rest)} more", str(sum(s.calls for _, s in rest)),
                      _num(sum(s.cost.macs for _, s in rest), unit),
                      _num(sum(s.cost.flops for _, s in rest), unit),
                      human(sum(s.cost.bytes for _, s in rest), "B"),
                      _pct(sum(s.cost.flops for _, s in rest), total.flops),
                      *("" for _ in columns))
    return table


def _warning_panel(report: Report) -> Panel | None:
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
    report: Report,
    *,
    depth: int = 2,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
    columns: Sequence[Column] = (),
) -> RenderableType:
    """The whole report as one rich renderable: headline, the table, top operators, warnings.

    This is what ``Report.__rich__`` (Jupyter, ``rich.print``) and ``flopscope count`` show.

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        by: ``"module"`` (module tree and top operators) or ``"op"`` (every operator).
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.
        columns: extra columns of the module and operator tables (see :class:`Column`).

    Returns:
        A rich renderable.
    """
    by = By(by)
    parts: list[RenderableType] = []
    head = Text()
    head.append(_subject(report), style="bold")
    note = _inputs_note(report)
    if note:
        head.append(f"  [{note}]", style="dim")
    head.append("\n" + _headline(report, unit), style="bold cyan")
    phase_line = _phase_line(report, unit)
    if phase_line:
        head.append("\n" + phase_line)
    parts.append(head)
    if by is By.MODULE:
        parts.append(Text(""))
        parts.append(rich_table(report, depth, unit=unit, columns=columns))
        if report.by_op():
            parts.append(Text(f"\ntop operators (by FLOPs, all {len(report.by_op())}: --by op)",
                              style="bold"))
            parts.append(_ops_table(report, top_ops, unit, columns))
    else:
        parts.append(Text(""))
        parts.append(_ops_table(report, None, unit, columns))
    panel = _warning_panel(report)
    if panel is not None:
        parts.append(Text(""))
        parts.append(panel)
    return Group(*parts)


def render_text(
    report: Report,
    depth: int = 2,
    width: int = 120,
    *,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
    columns: Sequence[Column] = (),
) -> str:
    """The report (see :func:`rich_report`) as plain text without colour codes.

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        width: the console width in characters.
        by: ``"module"`` or ``"op"``.
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.
        columns: extra table columns (see :class:`Column`).

    Returns:
        The text, ending in a newline.
    """
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, force_terminal=False,
                      color_system=None, emoji=False, highlight=False)
    console.print(rich_report(report, depth=depth, by=by, unit=unit, top_ops=top_ops,
                              columns=columns))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


# -- markdown --------------------------------------------------------------------------------------
def _md_table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if a == "r" else ":---" for a in align) + " |"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    report: Report,
    *,
    depth: int = 2,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
    columns: Sequence[Column] = (),
) -> str:
    """The report as GitHub-flavoured markdown: headline, tables, warnings as a list.

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        by: ``"module"`` or ``"op"``.
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.
        columns: extra table columns (see :class:`Column`).

    Returns:
        Markdown text, ending in a newline.
    """
    by = By(by)
    total = report.total()
    out = [f"### {_subject(report)}", ""]
    note = _inputs_note(report)
    out.append(f"**{_headline(report, unit)}**" + (f" ({note})" if note else ""))
    phase_line = _phase_line(report, unit)
    if phase_line:
        out += ["", phase_line]
    out.append("")
    ops = list(report.by_op().items())
    uncounted = report.uncounted

    def op_rows(items: list[tuple[str, Any]]) -> list[list[str]]:
        return [[f"`{op}`" + (" (no rule)" if op in uncounted else ""), str(s.calls),
                 _num(s.cost.macs, unit), _num(s.cost.flops, unit), human(s.cost.bytes, "B"),
                 _pct(s.cost.flops, total.flops), *(c.by_op.get(op, "-") for c in columns)]
                for op, s in items]

    extra = [c.header for c in columns]
    op_header = ["operator", "calls", _unit_header("MACs", unit), _unit_header("FLOPs", unit),
                 "bytes", "share", *extra]
    op_align = "lrrrrr" + "r" * len(columns)
    if by is By.MODULE:
        rows = [
            ["`(root)`" if r.path == "" else f"`{r.path}`", r.type, human(r.params),
             _num(r.macs, unit), _num(r.flops, unit), human(r.bytes, "B"),
             _pct(r.flops, total.flops), str(r.calls), *(c.by_module.get(r.path, "-") for c in columns)]
            for r in module_rows(report, depth)
        ]
        rows.append(["**total**", "", human(report.params), _num(total.macs, unit),
                     _num(total.flops, unit), human(total.bytes, "B"),
                     _pct(total.flops, total.flops), "", *(c.total for c in columns)])
        out.append(_md_table(
            ["module", "type", "params", _unit_header("MACs", unit), _unit_header("FLOPs", unit),
             "bytes", "share", "calls", *extra],
            "llrrrrrr" + "r" * len(columns), rows))
        if ops:
            out += ["", f"Top operators (of {len(ops)}):", ""]
            out.append(_md_table(op_header, op_align, op_rows(ops[:top_ops])))
    else:
        out.append(_md_table(op_header, op_align, op_rows(ops)))
    warnings = report_warnings(report)
    if warnings:
        out += ["", "**Warnings**", ""]
        for w in warnings:
            out.append(f"- {w.title}: {', '.join(w.items)} -- {w.advice}")
    return "\n".join(out) + "\n"


# -- machine formats -------------------------------------------------------------------------------
def render_json(report: Report) -> str:
    """The report as JSON (``Report.to_json``); ``Report.from_json`` reads it back equal.

    Args:
        report: the report.

    Returns:
        JSON text, ending in a newline.
    """
    return report.to_json(indent=2) + "\n"


def render_csv(report: Report, *, by: By | str = By.MODULE) -> str:
    """The report as CSV of plain integers: every module (with a ``depth`` column) or every
    operator; see :meth:`Report.table_rows` for the columns.

    Args:
        report: the report.
        by: ``"module"`` or ``"op"``.

    Returns:
        CSV text with a header row.
    """
    rows = report.table_rows(By(by).value)
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def render(
    report: Report,
    fmt: Format | str = Format.TABLE,
    *,
    depth: int = 2,
    by: By | str = By.MODULE,
    unit: str | None = None,
    width: int = 120,
    columns: Sequence[Column] = (),
) -> str:
    """Render ``report`` in one of the :class:`Format` s, as text without colour codes.

    Args:
        report: the report.
        fmt: ``table``, ``markdown``, ``json`` or ``csv``.
        depth: levels of the module tree (table, markdown).
        by: ``"module"`` or ``"op"`` (table, markdown, csv).
        unit: fixed SI prefix for MACs and FLOPs, ``None`` for automatic (table, markdown).
        width: console width (table).
        columns: extra table columns (table, markdown; see :class:`Column`).

    Returns:
        The text.

    Raises:
        ValueError: an unknown format or breakdown.
    """
    fmt = Format(fmt)
    if fmt is Format.TABLE:
        return render_text(report, depth, width, by=by, unit=unit, columns=columns)
    if fmt is Format.MARKDOWN:
        return render_markdown(report, depth=depth, by=by, unit=unit, columns=columns)
    if fmt is Format.JSON:
        return render_json(report)
    return render_csv(report, by=by)


set_display(lambda report, depth: render_text(report, depth=depth), rich_report)
