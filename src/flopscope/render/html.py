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
    from flopscope.report.report import Report
    from flopscope.report.symbolic import SymbolicReport

__all__ = ["CURVE_FIELDS", "KINDS", "embedded_data", "notebook_frame", "page",
           "render_diff_html", "render_generation_html", "render_html", "render_plan_html",
           "render_symbolic_html", "render_table_html", "symbolic_curves", "symbolic_derived"]

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


def title_of(report: Report) -> str:
    """The page title of a report: the model and where it came from."""
    source = report.meta.get("source")
    name = report.model or "counted code"
    return f"flopscope: {name}" + (f" ({source})" if source and source != name else "")


def render_html(report: Report) -> str:
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


def render_diff_html(a: Report, b: Report, names: Sequence[str] = ("A", "B")) -> str:
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
            [line, ...]}`` (:func:`flopscope.plan.display.plan_page_data`); or a serving plan's
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


# what a symbolic page plots: three fields, against each symbol, for the total and the modules
# right under the root (at most this many, the costliest first)
CURVE_FIELDS = ("flops", "macs", "bytes")
_CURVE_MODULES = 8


def _curve_range(report: SymbolicReport, name: str, fixed: Mapping[str, int],
                 points: int) -> list[int]:
    """The sizes of ``name`` to plot: from the smallest the domain allows (seq_len >= 2, ...)
    to 32 times the traced one, ``points`` of them, those outside the domain left out."""
    hi = 32 * report.hints.get(name, 1)
    lo = next((x for x in range(1, hi) if not report.violated(**{**fixed, name: x})), hi)
    xs = sorted({round(lo + (hi - lo) * i / (points - 1)) for i in range(points)})
    return [x for x in xs if not report.violated(**{**fixed, name: x})]


def _points(report: SymbolicReport, expr: Any, name: str, fixed: Mapping[str, int],
            xs: Sequence[int]) -> list[list[int]] | None:
    """``[[x, expr at x], ...]`` (exact integers), or ``None`` when the formula holds a
    data-dependent size."""
    import sympy  # type: ignore[import-untyped]

    out = []
    for x in xs:
        at = {**fixed, name: x}
        value = expr.xreplace({report.symbols[k]: sympy.Integer(v) for k, v in at.items()})
        if not value.is_number:
            return None
        out.append([x, int(value)])
    return out


def symbolic_curves(report: SymbolicReport, *, points: int = 33,
                    fields: Sequence[str] = CURVE_FIELDS) -> list[dict[str, Any]]:
    """Each field of the total and of the modules right under the root against each symbol,
    the other symbols at the sizes traced: ``points`` sizes from the smallest the formulas'
    domain allows to 32 times the traced size (the range of ``plot_symbolic``; sizes outside the
    domain left out). For ``seq_len``, the total's terms of degree two and above (attention) and
    the rest apart (``"split"``) and where the first overtakes the second (``"crossover"``,
    :meth:`SymbolicReport.crossover` at the same sizes of the others). A formula holding a
    data-dependent size has no curve.

    Args:
        report: the symbolic report.
        points: sizes per symbol.
        fields: of ``macs``, ``flops``, ``bytes`` (read + written), ``bytes_read``,
            ``bytes_written``.

    Returns:
        ``[{"symbol", "field", "module", "fixed": {name: size}, "points": [[x, value], ...]}]``
        (``module`` ``""``: the total), with ``"split": {"high": points, "rest": points}`` and
        ``"crossover"`` (a size or ``None``) on the total's ``seq_len`` curves.
    """
    by_module = report.by_module()
    # the modules right under the root with any cost, the costliest at the traced sizes first
    children = sorted((p for p in by_module if p and "." not in p
                       and (by_module[p].flops != 0 or by_module[p].bytes != 0)),
                      key=lambda p: -_at_hints(report, by_module[p].flops))
    out = []
    for name in report.symbols:
        fixed = {k: v for k, v in report.hints.items() if k != name and k in report.symbols}
        xs = _curve_range(report, name, fixed, points)
        if not xs:
            continue
        for field in fields:
            for module in ["", *children[:_CURVE_MODULES]]:
                cost = report.total() if module == "" else by_module[module]
                got = _points(report, getattr(cost, field), name, fixed, xs)
                if not got:
                    continue
                curve: dict[str, Any] = {"symbol": name, "field": field, "module": module,
                                         "fixed": fixed, "points": got}
                if module == "" and name == "seq_len":
                    high, rest = report.split(name, field)
                    if high != 0:
                        split = (_points(report, high, name, fixed, xs),
                                 _points(report, rest, name, fixed, xs))
                        if split[0] is not None and split[1] is not None:
                            curve["split"] = {"high": split[0], "rest": split[1]}
                            curve["crossover"] = report.crossover(name, field, None, **fixed)
                out.append(curve)
    return out


def _at_hints(report: SymbolicReport, expr: Any) -> int:
    """A formula at the traced sizes (0 when it holds a data-dependent size)."""
    import sympy

    value = expr.xreplace({report.symbols[k]: sympy.Integer(v) for k, v in report.hints.items()
                           if k in report.symbols})
    return int(value) if value.is_number else 0


def symbolic_derived(report: SymbolicReport) -> dict[str, Any]:
    """What the command line prints under a symbolic table, as data: with a ``seq_len`` symbol,
    the FLOPs of one more token (``per_token``: d(FLOPs)/d(seq_len) per sample, its formula
    and its value at the traced sizes) and the ``seq_len`` where the terms of degree
    two and above overtake the rest (``crossover``, the other symbols at 1, as the command line
    says it).

    Args:
        report: the symbolic report.

    Returns:
        ``{}`` without ``seq_len``; else ``{"per_token": {...}, "crossover": {...}}``.
    """
    if "seq_len" not in report.symbols:
        return {}
    import sympy

    per_token = report.flops_per_token("seq_len")
    at = per_token.xreplace({report.symbols[k]: sympy.Integer(v)
                             for k, v in report.hints.items() if k in report.symbols})
    ones = {k: 1 for k in report.symbols if k != "seq_len"}
    return {"per_token": {"symbol": "seq_len", "formula": str(per_token),
                          # a whole number, or a fraction (a term divided by the batch)
                          "at_hints": (int(at) if at.is_integer else float(at)) if at.is_number
                          else None, "hints": dict(report.hints)},
            "crossover": {"symbol": "seq_len", "field": "flops", "fixed": ones,
                          "at": report.crossover("seq_len")}}


def render_symbolic_html(report: SymbolicReport) -> str:
    """A symbolic report as a page (``SymbolicReport.to_html``, ``count --symbolic ...
    --format html``): the formulas of the total, per module and per operator; FLOPs, MACs and
    bytes of the total and of the top modules against each symbol over the formulas' domain;
    with ``seq_len``, the FLOPs per token and where attention's terms overtake the rest.

    Args:
        report: the symbolic report.

    Returns:
        The page; its data is ``report.to_dict()`` with ``"curves"`` (:func:`symbolic_curves`)
        and ``"derived"`` (:func:`symbolic_derived`).
    """
    data = {**report.to_dict(), "curves": symbolic_curves(report),
            "derived": symbolic_derived(report)}
    return page("symbolic", data, title=f"flopscope symbolic: {report.report.model}")


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
