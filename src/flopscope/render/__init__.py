"""The edge: a report for people and programs. Human units live here only (``units``); a report
holds integers.

- ``options``: :class:`RenderOptions` and the :class:`Format` / :class:`By` enums;
- ``common``: what every text rendering shows (module rows, warnings, headline);
- ``text``: the rich table and plain text; ``markdown``; ``data``: JSON and CSV;
- ``html``: one self-contained page that draws the report's JSON (no network);
- ``plot``: charts (matplotlib).

Every writer takes a report's sections (what features added: columns, lines, JSON data) the same
way (:mod:`flopscope.report.sections`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flopscope.render.data import render_csv, render_json
from flopscope.render.markdown import render_markdown
from flopscope.render.options import By, Format, RenderOptions
from flopscope.render.text import render_text

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["By", "Format", "RenderOptions", "render"]


def render(report: ReportData, options: RenderOptions | None = None, **changes: Any) -> str:
    """``report`` as text in one of the :class:`Format` s, without colour codes.

    Args:
        report: the report (with its sections).
        options: how; default :class:`RenderOptions()`.
        **changes: fields of :class:`RenderOptions` to change (``format="json"``, ``depth=3``).

    Returns:
        The text.

    Raises:
        ValueError: an unknown format or breakdown.
    """
    opts = options or RenderOptions()
    if changes:
        opts = RenderOptions(**{**opts.__dict__, **changes})
    if opts.format is Format.TABLE:
        return render_text(report, opts.depth, opts.width, by=opts.by, unit=opts.unit,
                           top_ops=opts.top_ops)
    if opts.format is Format.MARKDOWN:
        return render_markdown(report, depth=opts.depth, by=opts.by, unit=opts.unit,
                               top_ops=opts.top_ops)
    if opts.format is Format.JSON:
        return render_json(report)
    if opts.format is Format.HTML:
        from flopscope.render.html import render_html

        return render_html(report)
    return render_csv(report, by=opts.by)
