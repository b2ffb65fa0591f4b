"""``flopscope diff A.json B.json``: per-module differences of two saved reports; exit 1 beyond
``--tolerance`` (a cost guard for CI). The comparison itself is :mod:`flopscope.report.diff`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flopscope.cli._options import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    add_depth,
    add_format,
    add_output,
    check_page_output,
    usage_error,
    write_output,
)
from flopscope.cli.types import tolerance

__all__ = ["add_subcommands", "read_report", "run_diff"]

_MAKE_ONE = "make one with 'flopscope count SOURCE --format json --output FILE'"


def add_subcommands(subparsers: Any) -> None:
    """Register ``diff`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    diff = subparsers.add_parser(
        "diff", help="compare two saved reports (exit 1 beyond tolerance)",
        description="Per-module differences between two reports saved with --format json.",
    )
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.add_argument("--tolerance", type=tolerance, default=0.0,
                      help="allowed relative change per module, e.g. 1%% (default 0)")
    add_depth(diff, default=2, help="levels of changed modules to list (all are checked)")
    add_format(diff, choices=("table", "html"),
               help="table (default), or html: both reports side by side as one page (with "
                    "--output FILE; the verdict goes to stderr)")
    add_output(diff)
    diff.set_defaults(func=run_diff)


if TYPE_CHECKING:
    from flopscope.report.report import Report


def read_report(path: str) -> Report:
    """Read a report saved with ``--format json``.

    Args:
        path: the file.

    Returns:
        The report.

    Raises:
        UsageError: the file cannot be read or is not a flopscope report (says how to make one).
    """
    from flopscope.errors import UsageError
    from flopscope.report.report import Report

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise usage_error(f"cannot read {path!r}: no such file") from None
    except UnicodeDecodeError:
        raise usage_error(
            f"{path!r} is not a flopscope report (not UTF-8 text); {_MAKE_ONE}"
        ) from None
    except OSError as e:
        raise usage_error(f"cannot read {path!r}: {e.strerror or e}") from None
    try:
        return Report.from_json(text)
    except UsageError as e:
        raise usage_error(f"{path!r} is not a flopscope report ({e}); {_MAKE_ONE}") from None


def _signed_pct(a: int, b: int) -> str:
    if a == b:
        return "0%"
    if a == 0:
        return "new"
    return f"{100 * (b - a) / abs(a):+.2f}%"


def _print_times(console: Any, a: Report, b: Report, args: argparse.Namespace) -> None:
    """Both reports profiled (``flopscope profile``): their measured time per module, before
    and after. Shown, never checked: time on a shared machine is noise beside counts."""
    from rich import box
    from rich.table import Table

    from flopscope.estimate.display import human_seconds
    from flopscope.report.diff import measured_times

    ta, tb = measured_times(a), measured_times(b)
    if ta is None or tb is None:
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  title="measured time (the median run of each; not checked against "
                        "--tolerance)", title_justify="left")
    for col in ("module", "time A", "time B", "Δ time"):
        table.add_column(col, justify="left" if col == "module" else "right", no_wrap=True)
    for path in [*ta, *(p for p in tb if p not in ta)]:
        if (0 if path == "" else path.count(".") + 1) > args.depth:
            continue
        x, y = ta.get(path), tb.get(path)
        change = f"{100 * (y - x) / x:+.1f}%" if x and y is not None else "-"
        table.add_row(path or "(root)", human_seconds(x) if x is not None else "-",
                      human_seconds(y) if y is not None else "-", change)
    console.print(table)


def run_diff(args: argparse.Namespace) -> int:
    """``flopscope diff A.json B.json``.

    Args:
        args: the parsed arguments (``a``, ``b``, ``tolerance``, ``depth``).

    Returns:
        0 when every module is within the tolerance, 1 otherwise.

    Raises:
        UsageError: a file is not a report.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from flopscope.render.units import human
    from flopscope.report.diff import diff_reports

    check_page_output(args.format, args.output)
    report_a, report_b = read_report(args.a), read_report(args.b)
    result = diff_reports(report_a, report_b)
    page = args.format == "html"
    if page:
        from flopscope.render.html import render_diff_html

        write_output(render_diff_html(report_a, report_b, (args.a, args.b)), args.output)
    beyond = {c.path for c in result.beyond(args.tolerance)}
    rows = [c for c in result.changes if c.counts_differ and c.depth <= args.depth]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  title=f"{args.a} (A) -> {args.b} (B)", title_justify="left")
    for col in ("module", "params A", "params B", "MACs A", "MACs B", "Δ MACs", "FLOPs A",
                "FLOPs B", "Δ FLOPs", ""):
        table.add_column(col, justify="left" if col == "module" else "right", no_wrap=True)
    for c in rows:
        va, vb = c.counts_a, c.counts_b
        over = c.path in beyond
        table.add_row(c.path or "(root)", human(va[0]), human(vb[0]), human(va[1]), human(vb[1]),
                      _signed_pct(va[1], vb[1]), human(va[2]), human(vb[2]),
                      _signed_pct(va[2], vb[2]),
                      (c.presence + " " if c.presence else "") + ("BEYOND" if over else ""))
    console = Console(file=sys.stderr if page else sys.stdout,
                      width=160 if not sys.stdout.isatty() else None, highlight=False)
    tol = f"{100 * args.tolerance:g}%"
    if rows and not page:
        console.print(table)
    if not page:
        _print_times(console, report_a, report_b, args)
    if beyond:
        names = [c.path or "(root)" for c in result.beyond(args.tolerance)]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        console.print(f"FAIL: {len(names)} module(s) differ by more than {tol}: {shown}")
        return EXIT_CHECK_FAILED
    changed = len(result.changes)
    console.print(f"OK: every module within {tol}" + (f" ({changed} changed)" if changed else
                                                        " (identical counts)"))
    return EXIT_OK
