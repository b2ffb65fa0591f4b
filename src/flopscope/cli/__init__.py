"""The ``flopscope`` command line: a thin layer over the library.

One module per subcommand (``count``, ``diff``, ``generate``, ``rules``, ``zoo``, ``measure``
with ``validate``), all speaking one grammar (:mod:`flopscope.cli._options`): the same flag names,
one-line errors with suggestions, the same exit codes.

Results go to stdout, diagnostics to stderr. Exit codes: 0 ok, 1 a check failed (``diff`` beyond
tolerance, ``--strict`` with uncounted operators, a ``zoo`` model that failed), 2 a usage error,
130 interrupted (Ctrl-C). Every usage error is one line on stderr that says what to fix; set
``FLOPSCOPE_TRACEBACK=1`` to see the traceback behind it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flopscope.cli import interrupt

if TYPE_CHECKING:
    import argparse

    from flopscope.cli._options import Parser

# Nothing else is imported here: ``python -m flopscope`` installs its Ctrl-C handler
# (:mod:`flopscope.cli.interrupt`) before importing this package, and the console script as
# main_entry starts; the subcommands (and torch) are imported by main(), where an interrupt is
# reported as one line.

__all__ = ["build_parser", "main", "main_entry"]


def build_parser() -> Parser:
    """The argument parser of ``flopscope``, every subcommand included.

    Returns:
        The parser; each subcommand sets ``func(args) -> int``.
    """
    from flopscope import __version__
    from flopscope.cli import calibrate, count, diff, generate, plan, profile, rules, zoo
    from flopscope.cli._options import PROG, Parser

    parser = Parser(
        prog=PROG,
        description="Parameters, MACs and FLOPs of PyTorch models, per module and per operator.",
        epilog="Exit codes: 0 ok, 1 a check failed, 2 usage error, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in (count, diff, generate, plan, profile, rules, zoo, calibrate):
        module.add_subcommands(sub)
    _add_measure(sub)
    parser.subcommands = {k: v for k, v in sub.choices.items() if isinstance(v, Parser)}
    return parser


def _add_measure(sub: Any) -> None:
    """Register ``measure`` and ``validate`` (:mod:`flopscope.cli.measure`); if that module
    cannot load, the two commands still exist and say why they cannot run (counting is
    unaffected)."""
    import argparse

    from flopscope.cli._options import usage_error

    try:
        from flopscope.cli import measure as measure_cli

        measure_cli.add_subcommands(sub)
    except Exception as e:  # noqa: BLE001  (a broken optional part must not break counting)
        reason = f"{type(e).__name__}: {e}"

        def unavailable(args: argparse.Namespace) -> int:
            raise usage_error(f"measurement commands unavailable ({reason})")

        for name in ("measure", "validate"):
            if name not in sub.choices:
                p = sub.add_parser(name, help="(unavailable)", add_help=False)
                p.add_argument("rest", nargs=argparse.REMAINDER)
                p.set_defaults(func=unavailable)


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string, of every subcommand, that takes one value (``--input``,
    ``--tolerance``)."""
    import argparse

    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _value_options(sub)
        elif action.option_strings and action.nargs is None and not isinstance(
                action, (argparse._StoreConstAction, argparse._CountAction,
                         argparse._HelpAction, argparse._VersionAction)):
            found.update(action.option_strings)
    return found


def _join_dash_values(argv: list[str], options: set[str]) -> list[str]:
    """``--input -1x3x224x224`` as ``--input=-1x3x224x224``: argparse takes a value that starts
    with ``-`` (and is not a plain negative number) for an option and says "expected one
    argument"; joined, the value reaches the option's own check and its message."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if (token in options and i + 1 < len(argv) and argv[i + 1].startswith("-")
                and argv[i + 1] != "--" and argv[i + 1] not in options
                and not argv[i + 1][1:2].isalpha() and not argv[i + 1].startswith("--")):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit code: 0 ok, 1 a check failed, 2 usage error, 130 interrupted.
    """
    from flopscope.cli import progress
    from flopscope.cli._options import (
        EXIT_CHECK_FAILED,
        EXIT_INTERRUPTED,
        EXIT_USAGE,
        CheckFailed,
        print_error,
        print_traceback_if_asked,
    )
    from flopscope.errors import FlopscopeError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(_join_dash_values(argv, _value_options(parser)))
        if extra:
            raise parser.unrecognized(getattr(args, "command", None), extra)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        with progress.shown():  # what a long command is doing, on a terminal's stderr
            code: int = args.func(args)
        return code
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except KeyboardInterrupt as e:
        print_error("interrupted" + (f" ({e})" if str(e) else ""))
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001  (one line, never a traceback; FLOPSCOPE_TRACEBACK=1 shows it)
        print_traceback_if_asked()
        if interrupt.interrupted():  # an error the interrupt caused (a half-imported module)
            print_error("interrupted")
            return EXIT_INTERRUPTED
        if isinstance(e, CheckFailed):
            print_error(f"check failed: {e}")
            return EXIT_CHECK_FAILED
        if isinstance(e, (FlopscopeError, ImportError)):
            print_error(f"error: {e}")
            return EXIT_USAGE
        print_error(f"error: {type(e).__name__}: {e} (set FLOPSCOPE_TRACEBACK=1 to see where)")
        return EXIT_USAGE


def main_entry() -> None:
    """Console-script entry point: ``sys.exit(main())``; Ctrl-C at any moment (also while an
    error is printed, or while the interpreter shuts down) exits 130 with one line
    (:mod:`flopscope.cli.interrupt`)."""
    interrupt.install()
    try:
        code = main()
    except KeyboardInterrupt:  # before main() could say it (while it imported): one line here
        code = interrupt.EXIT_INTERRUPTED
        interrupt.say()
    except Exception:  # an error the interrupt caused before main() could catch it
        if not interrupt.interrupted():
            raise
        code = interrupt.EXIT_INTERRUPTED
        interrupt.say()
    interrupt.finish(code)
