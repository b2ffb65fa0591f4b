"""The result of a count: :class:`Report`, a report's data and queries
(:class:`~flopscope.report.data.ReportData`) and how it shows itself.

A report shows itself through :mod:`flopscope.render` (``str(report)``, ``rich.print(report)``,
a notebook's HTML): this module imports the renderers, and they read the report through
:class:`~flopscope.report.data.ReportData`, never through this module, so imports flow one way
(data -> render -> report) and a report prints as a table from any import path, with no
registration step. The renderers are imported when a display method is called: importing
flopscope does not import rich.
"""

from __future__ import annotations

from typing import Any

from flopscope.report.data import ReportData

__all__ = ["Report"]


class Report(ReportData):
    """What a model (or any code run under a :class:`~flopscope.Counter`) cost, as a count
    returns it: the fields and queries of :class:`~flopscope.report.data.ReportData` (all numbers
    are integers), shown as a table by ``str()``, ``print()`` and rich, and as a page in a
    notebook.

    Build one with :func:`flopscope.count` or :class:`flopscope.Counter`.
    """

    def table(self, depth: int = 2) -> str:
        """The module tree as a plain-text table, down to ``depth`` levels below the root, with
        what the sections add."""
        from flopscope.render.text import render_text

        return render_text(self, depth=depth)

    def to_html(self) -> str:
        """The report as one self-contained HTML page (no network request): the module tree as
        an icicle, sortable tables, the roofline and memory where the report has them; drawn from
        :meth:`to_dict`, embedded in the page."""
        from flopscope.render.html import render_html

        return render_html(self)

    def _repr_html_(self) -> str:  # Jupyter: the page in a frame of its own
        from flopscope.render.html import notebook_frame, render_html

        return notebook_frame(render_html(self))

    def __str__(self) -> str:
        return self.table()

    def __rich__(self) -> Any:
        from flopscope.render.text import rich_report

        return rich_report(self)
