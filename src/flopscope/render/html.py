"""A report as one self-contained HTML page: the report's own JSON dict embedded as data, and a
small hand-written script (``html_assets/*.js``) that draws the page from it in the browser:
the module tree as an icicle, sortable and filterable tables of modules and operators, the
roofline and the memory figures where the report has those sections, the warnings and where the
numbers came from.

The page asks the network for nothing: its script and style are inlined, and it uses the
browser's own fonts. The data is :meth:`Report.to_dict` exactly (what ``--format json`` writes),
so the page, the table and the JSON have one source; :func:`embedded_data` reads it back.
"""

from __future__ import annotations

import datetime
import html
import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import metadata, resources
from typing import TYPE_CHECKING, Any

from flopscope.errors import UsageError

if TYPE_CHECKING:
    from flopscope.report.data import ReportData

__all__ = ["KINDS", "embedded_data", "notebook_frame", "page",
           "render_diff_html", "render_generation_html", "render_html", "render_plan_html",
           "render_symbolic_html", "render_table_html"]

# what a page shows: one report, two reports compared, a plain table, a symbolic report, a
# generation's steps, a plan of layouts
KINDS = ("report", "diff", "table", "symbolic", "generation", "plan")

_DATA_ID = "flopscope-data"
_PAGE_ID = "flopscope-page"


@cache
def _asset(name: str) -> str:
    return resources.files("flopscope.render").joinpath("html_assets").joinpath(name).read_text("utf-8")


# the page's script, in files joined inside one function: helpers and widgets, one report, a plan,
# the other pages (which also starts the drawing)
_SCRIPTS = ("widgets.js", "report.js", "plan.js", "pages.js")


@cache
def _script() -> str:
    """The page's script: draws the page from the embedded data with the DOM and SVG only;
    nothing is fetched, no library is used."""
    return ('(function () {\n  "use strict";\n' + "".join(_asset(n) for n in _SCRIPTS)
            + "})();\n")


def _script_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` escaped as JSON escapes,
    so no text of the data can close the element or open a comment."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("flopscope", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def page(kind: str, data: Any, *, title: str) -> str:
    """A self-contained HTML page that draws ``data``.

    Args:
        kind: what the data is: ``"report"`` (a report's dict), ``"diff"`` (``{"a": dict,
            "b": dict, "names": [a, b]}``), ``"table"`` (``{"columns": [...], "rows": [...]}``)
            ``"symbolic"`` (a symbolic report's dict), ``"generation"`` (what ``flopscope
            generate --format json`` writes) or ``"plan"`` (a plan's dict).
        data: JSON-ready data (no NaN or infinity).
        title: the page's title.

    Returns:
        The page, one HTML document.

    Raises:
        UsageError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown page kind {kind!r}: use one of {', '.join(KINDS)}")
    about = {"kind": kind, "versions": _versions(),
             "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        # nothing may be fetched: only what is inline runs, no connection of any kind is made
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{html.escape(title)}</title>\n<style>\n{_asset('report.css')}</style>\n"
        "</head>\n<body>\n<div id=\"flopscope\" class=\"fs\"><noscript>This page draws the report "
        "with JavaScript; the data is in the script element below.</noscript></div>\n"
        f"<script id=\"{_PAGE_ID}\" type=\"application/json\">{_script_json(about)}</script>\n"
        f"<script id=\"{_DATA_ID}\" type=\"application/json\">{_script_json(data)}</script>\n"
        f"<script>\n{_script()}</script>\n</body>\n</html>\n"
    )


def title_of(report: ReportData) -> str:
    """The page title of a report: the model and where it came from."""
    source = report.meta.get("source")
    name = report.model or "counted code"
    return f"flopscope: {name}" + (f" ({source})" if source and source != name else "")


def render_html(report: ReportData) -> str:
    """``report`` as a self-contained HTML page (``--format html``, :meth:`Report.to_html`).

    Args:
        report: the report, with its sections.

    Returns:
        The page; its data is ``report.to_dict()``.
    """
    return page("report", report.to_dict(), title=title_of(report))


def notebook_frame(text: str, *, height: int = 900) -> str:
    """A page inside an ``<iframe srcdoc>``, for Jupyter's ``_repr_html_``: the page's style and
    script stay inside the frame (the notebook's own look is untouched, and two reports in one
    notebook do not meet).

    Args:
        text: the page (from :func:`page`).
        height: the frame's height in CSS pixels.

    Returns:
        One ``<iframe>`` element.
    """
    return (f'<iframe srcdoc="{html.escape(text, quote=True)}" title="flopscope report" '
            f'style="width:100%;height:{height}px;border:1px solid #d9dee7;border-radius:6px">'
            "</iframe>")


def render_diff_html(a: ReportData, b: ReportData, names: Sequence[str] = ("A", "B")) -> str:
    """Two reports side by side (``flopscope diff A.json B.json --format html``): both headlines,
    every module's inclusive FLOPs, MACs and parameters in each, the changed ones highlighted,
    both icicles.

    Args:
        a: the report before.
        b: the report after.
        names: what to call them (the file names).

    Returns:
        The page; its data is ``{"a": a.to_dict(), "b": b.to_dict(), "names": [...]}``.
    """
    data = {"a": a.to_dict(), "b": b.to_dict(), "names": list(names)}
    return page("diff", data, title=f"flopscope diff: {names[0]} -> {names[1]}")


def render_generation_html(data: Mapping[str, Any]) -> str:
    """A generation (``flopscope generate ... --format html``): its steps (prefill, decode) as a
    chart and a table, the summary per token, and the report of all steps.

    Args:
        data: what ``flopscope generate --format json`` writes (``GenerationReport.to_dict()``
            with the command's additions).

    Returns:
        The page; its data is ``data``.
    """
    name = data.get("source") or data.get("report", {}).get("model", "model")
    return page("generation", data, title=f"flopscope generate: {name}")


def render_plan_html(data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    """A plan of layouts (``flopscope plan ... --format html``, ``Plan.to_html``): the layouts
    that fit, ranked, as a table; step time against peak memory per device as a chart, the
    Pareto front joined; where a layout's time and memory go (the best one's first, any other
    on a click); the dropped layouts with the reason. Keys the page does not know (a newer
    plan's) are shown as JSON. A serving plan (``"mode": "serve"``) is drawn as throughput
    against latency; a list of sweep points (``{"source", "gpus", "seq_len", "error",
    "plan"}``) as a table of their best layouts, a click drawing one plan.

    Args:
        data: ``Plan.to_dict()``, with ``"explain"``: ``{"part_names": {part: words}, "why":
            [line, ...]}`` (:meth:`flopscope.plan.planner.Plan.page_data`); or a serving plan's
            dict; or a sweep's points.

    Returns:
        The page; its data is ``data``.
    """
    if isinstance(data, Mapping):
        title = f"flopscope plan: {data.get('source', 'model')}"
    else:
        title = f"flopscope plan: a sweep of {len(data)} plans"
    return page("plan", data, title=title)


def render_table_html(title: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], *,
                      note: str = "") -> str:
    """A sortable, filterable table as a page (``flopscope zoo ... --format html``).

    Args:
        title: the page's heading.
        columns: the keys of ``rows`` to show, in order.
        rows: one mapping per row, plain numbers and strings (``None``: no value).
        note: a line under the heading.

    Returns:
        The page; its data is ``{"title", "note", "columns", "rows"}``.
    """
    data = {"title": title, "note": note, "columns": list(columns),
            "rows": [{c: r.get(c) for c in columns} for r in rows]}
    return page("table", data, title=title)


def render_symbolic_html(data: Mapping[str, Any]) -> str:
    """A symbolic report as a page (``SymbolicReport.to_html``, ``count --symbolic ...
    --format html``): the formulas of the total, per module and per operator; FLOPs, MACs and
    bytes of the total and of the top modules against each symbol over the formulas' domain;
    with ``seq_len``, the FLOPs per token and where attention's terms overtake the rest.

    Args:
        data: what ``SymbolicReport.page_data()`` returns: its ``to_dict()`` with ``"curves"``
            and ``"derived"``.

    Returns:
        The page.
    """
    return page("symbolic", data, title=f"flopscope symbolic: {data['model']}")


_SCRIPT = re.compile(r'<script id="(?P<id>[\w-]+)" type="application/json">(?P<body>.*?)</script>',
                     re.S)


def embedded_data(text: str) -> Any:
    """The data a page made by :func:`page` draws (for a report's page, ``report.to_dict()``;
    ``Report.from_dict`` reads it back).

    Args:
        text: the page.

    Returns:
        The data, parsed.

    Raises:
        UsageError: the text is not a flopscope page.
    """
    for m in _SCRIPT.finditer(text):
        if m.group("id") == _DATA_ID:
            return json.loads(m.group("body"))
    raise UsageError("not a flopscope HTML page: no embedded report data found")
