"""``flopscope rules [NAME ...]``: every operator flopscope has a rule for, one row each, with its
family and its counting convention (the same text as docs/conventions.md)."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from typing import Any

from flopscope.cli._options import (
    EXIT_OK,
    add_format,
    add_output,
    did_you_mean,
    usage_error,
    write_output,
)

__all__ = ["add_subcommands", "rules_table", "run_rules"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``rules`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    rules = subparsers.add_parser(
        "rules", help="every supported operator and its counting convention",
        description="One row per operator: its family and its convention (the formula of its "
                    "MACs and FLOPs), as in docs/conventions.md.")
    rules.add_argument("names", nargs="*", metavar="NAME",
                       help="show only operators whose name contains one of these (e.g. addmm, "
                            "softmax, aten::conv)")
    add_format(rules, choices=("table", "markdown"))
    add_output(rules)
    rules.set_defaults(func=run_rules)


def _selected(names: Sequence[str]) -> list[tuple[str, Any]]:
    """(operator, its convention row) of every operator, or of those whose name contains one of
    ``names``, in the order of docs/conventions.md.

    Raises:
        UsageError: a name matches no operator (close names suggested).
    """
    import flopscope.rules as rules_pkg

    rows = [(op, row) for row in rules_pkg.conventions() for op in row.ops]
    if not names:
        return rows
    for name in names:
        if not any(name in op for op, _ in rows):
            ops = [op for op, _ in rows]
            bare = {op.split("::", 1)[-1]: op for op in ops}
            raise usage_error(f"no rule covers an operator named like {name!r}"
                              f"{did_you_mean(name, [*ops, *bare])}; 'flopscope rules' lists them "
                              "all")
    return [(op, row) for op, row in rows if any(name in op for name in names)]


def _table(names: Sequence[str] = ()) -> Any:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    import flopscope.rules as rules_pkg

    selected = _selected(names)
    rules = rules_pkg.conventions()
    title = (f"{len(rules)} rules covering {sum(len(r.ops) for r in rules)} operators" if not names
             else f"{len(selected)} of the operators with a rule")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, show_lines=False,
                  title=title, title_justify="left")
    table.add_column("operator", no_wrap=True)
    table.add_column("family", no_wrap=True)
    table.add_column("convention (MACs and FLOPs)", overflow="fold", min_width=30)
    for op, row in selected:
        table.add_row(escape(op), escape(row.family), escape(row.text))
    return table


def rules_table(width: int = 160, names: Sequence[str] = ()) -> str:
    """The rules as a plain-text table, one row per operator: operator (never cut), family,
    convention (wrapped at spaces; its text printed literally, brackets included, as in
    docs/conventions.md).

    Args:
        width: the line width.
        names: only operators whose name contains one of these (all when empty).

    Returns:
        The table text.

    Raises:
        UsageError: a name matches no operator.
    """
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False, emoji=False).print(
        _table(names))
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def run_rules(args: argparse.Namespace) -> int:
    """``flopscope rules [NAME ...] [--format table|markdown] [--output FILE]``.

    Args:
        args: the parsed arguments.

    Returns:
        0.

    Raises:
        UsageError: a name matches no operator, or names with ``--format markdown``.
    """
    import flopscope.rules as rules_pkg

    if args.format == "markdown":
        if args.names:
            raise usage_error("--format markdown writes the whole conventions page; drop the "
                              "operator names, or use the table")
        write_output(rules_pkg.conventions_markdown(), args.output)
        return EXIT_OK
    if args.output is None and sys.stdout.isatty():
        from rich.console import Console

        Console(highlight=False, emoji=False).print(_table(args.names))
        return EXIT_OK
    write_output(rules_table(names=args.names), args.output)
    return EXIT_OK
