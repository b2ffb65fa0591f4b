"""``flopscope rules``: every operator flopscope has a rule for, with its counting convention
(the same text as docs/conventions.md)."""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any

from flopscope.cli._options import EXIT_OK, add_format, add_output, check_output, write_output

__all__ = ["add_subcommands", "rules_table", "run_rules"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``rules`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    rules = subparsers.add_parser("rules",
                                  help="every supported operator and its counting convention")
    add_format(rules, choices=("table", "markdown"))
    add_output(rules)
    rules.set_defaults(func=run_rules)


def _table() -> Any:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    import flopscope.rules as rules_pkg

    rows = rules_pkg.conventions()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, show_lines=False,
                  title=f"{len(rows)} rules covering {sum(len(r.ops) for r in rows)} operators",
                  title_justify="left")
    table.add_column("family", no_wrap=True)
    table.add_column("operators", no_wrap=True)
    table.add_column("convention", overflow="fold", min_width=30)
    last = ""
    for r in rows:
        if r.family != last and last:
            table.add_section()
        table.add_row(escape(r.family if r.family != last else ""), escape("\n".join(r.ops)),
                      escape(r.text))
        last = r.family
    return table


def rules_table(width: int = 140) -> str:
    """The rules as a plain-text table: family, operators (one per line, never cut), convention
    (wrapped at spaces; its text printed literally, brackets included, as in
    docs/conventions.md).

    Args:
        width: the line width.

    Returns:
        The table text.
    """
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False, emoji=False).print(_table())
    return buf.getvalue()


def run_rules(args: argparse.Namespace) -> int:
    """``flopscope rules [--format table|markdown] [--output FILE]``.

    Args:
        args: the parsed arguments.

    Returns:
        0.
    """
    import flopscope.rules as rules_pkg

    check_output(args.output)
    if args.format == "markdown":
        write_output(rules_pkg.conventions_markdown(), args.output)
        return EXIT_OK
    if args.output is None and sys.stdout.isatty():
        from rich.console import Console

        Console(highlight=False, emoji=False).print(_table())
        return EXIT_OK
    write_output(rules_table(), args.output)
    return EXIT_OK
