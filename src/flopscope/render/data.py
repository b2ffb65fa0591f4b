"""A report for programs: JSON (with every section's data) and CSV of plain integers."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

from flopscope.render.options import By

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["render_csv", "render_json"]


def render_json(report: ReportData) -> str:
    """The report as JSON (``Report.to_json``); ``Report.from_json`` reads it back equal.

    Args:
        report: the report.

    Returns:
        JSON text, ending in a newline.
    """
    return report.to_json(indent=2) + "\n"


def render_csv(report: ReportData, *, by: By | str = By.MODULE) -> str:
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
