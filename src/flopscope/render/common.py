"""What every text rendering of a report shows: the rows of the module tree, the warnings, the
headline and the notes under it, number cells."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flopscope.cost import Phase
from flopscope.render.units import human, scaled

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["ModuleRow", "ReportWarning", "headline", "inputs_note", "module_rows", "num", "pct",
           "phase_line", "report_warnings", "subject", "unit_header"]


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


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def num(value: int, prefix: str | None) -> str:
    """A table cell: auto prefix in the cell, or a bare number when the header names the unit."""
    if prefix is None:
        return human(value)
    return scaled(value, prefix)


def module_rows(report: ReportData, depth: int = 2) -> list[ModuleRow]:
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


def report_warnings(report: ReportData) -> list[ReportWarning]:
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


def subject(report: ReportData) -> str:
    source = report.meta.get("source")
    name = report.model or "counted code"
    return f"{name} ({source})" if source and source != name else name


def inputs_note(report: ReportData) -> str:
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


def headline(report: ReportData, prefix: str | None) -> str:
    total = report.total()
    p = prefix
    return (
        f"{report.params:,} params"
        + (f" ({human(report.params, digits=2)})" if report.params >= 1000 else "")
        + " · "
        f"{human(total.macs, 'MAC', prefix=p, digits=3)} · {human(total.flops, 'FLOP', prefix=p, digits=3)}"
    )


def phase_line(report: ReportData, prefix: str | None) -> str:
    if len(report.phases) < 2:
        return ""
    parts = [
        f"{ph.value}: {human(report.total(ph).macs, 'MAC', prefix=prefix, digits=3)}, "
        f"{human(report.total(ph).flops, 'FLOP', prefix=prefix, digits=3)}"
        for ph in report.phases
    ]
    return "; ".join(parts)


def unit_header(name: str, prefix: str | None) -> str:
    return f"{name} ({prefix})" if prefix else name
