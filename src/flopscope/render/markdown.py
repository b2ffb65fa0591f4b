"""A report as GitHub-flavoured markdown: headline, tables, warnings and what its sections add."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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

__all__ = ["render_markdown"]


def _md_table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if a == "r" else ":---" for a in align) + " |"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    report: ReportData,
    *,
    depth: int = 2,
    by: By | str = By.MODULE,
    unit: str | None = None,
    top_ops: int = 10,
) -> str:
    """The report as GitHub-flavoured markdown: headline, tables, warnings as a list.

    Args:
        report: the report.
        depth: levels of the module tree below the root.
        by: ``"module"`` or ``"op"``.
        unit: a fixed SI prefix for MACs and FLOPs, or ``None`` for automatic.
        top_ops: how many operators to list under the module tree.

    Returns:
        Markdown text, ending in a newline: the sections' columns in the tables, their lines as
        a list at the end.
    """
    by = By(by)
    columns: Sequence[Column] = [c for s in report.sections for c in s.columns()]
    total = report.total()
    out = [f"### {subject(report)}", ""]
    note = inputs_note(report)
    out.append(f"**{headline(report, unit)}**" + (f" ({note})" if note else ""))
    phases = phase_line(report, unit)
    if phases:
        out += ["", phases]
    out.append("")
    ops = list(report.by_op().items())
    uncounted = report.uncounted

    def op_rows(items: list[tuple[str, Any]]) -> list[list[str]]:
        return [[f"`{op}`" + (" (no rule)" if op in uncounted else ""), str(s.calls),
                 num(s.cost.macs, unit), num(s.cost.flops, unit), human(s.cost.bytes, "B"),
                 pct(s.cost.flops, total.flops), *(c.by_op.get(op, "-") for c in columns)]
                for op, s in items]

    extra = [c.header for c in columns]
    op_header = ["operator", "calls", unit_header("MACs", unit), unit_header("FLOPs", unit),
                 "bytes", "share", *extra]
    op_align = "lrrrrr" + "r" * len(columns)
    if by is By.MODULE:
        rows = [
            ["`(root)`" if r.path == "" else f"`{r.path}`", r.type, human(r.params),
             num(r.macs, unit), num(r.flops, unit), human(r.bytes, "B"),
             pct(r.flops, total.flops), str(r.calls), *(c.by_module.get(r.path, "-") for c in columns)]
            for r in module_rows(report, depth)
        ]
        rows.append(["**total**", "", human(report.params), num(total.macs, unit),
                     num(total.flops, unit), human(total.bytes, "B"),
                     pct(total.flops, total.flops), "", *(c.total for c in columns)])
        out.append(_md_table(
            ["module", "type", "params", unit_header("MACs", unit), unit_header("FLOPs", unit),
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
    text = "\n".join(out) + "\n"
    lines = [line for s in report.sections for line in s.lines()]
    if lines:
        text += "\n" + "\n".join(f"- {line.strip()}" for line in lines) + "\n"
    return text
