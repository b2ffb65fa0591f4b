"""The ``flopscope`` command line: a thin layer over the library.

Results go to stdout, diagnostics to stderr. Exit codes: 0 ok, 1 a check failed (``diff`` beyond
tolerance, ``--strict`` with uncounted operators, a ``zoo`` model that failed), 2 a usage error.
Every usage error is one line on stderr that says what to fix; set ``FLOPSCOPE_TRACEBACK=1`` to
see the traceback behind it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flopscope.cli._options import (
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CheckFailed,
    Parser,
    non_negative_int,
    one_line,
    positive_int,
    print_error,
    print_traceback_if_asked,
    tolerance,
    unit_prefix,
    usage_error,
    write_output,
)
from flopscope.errors import UsageError

__all__ = ["main", "main_entry"]

TIMM_ZOO = (
    "resnet18", "resnet50", "resnext50_32x4d", "efficientnet_b0", "efficientnet_b3",
    "mobilenetv3_large_100", "mobilenetv4_conv_small", "convnext_tiny", "convnext_base",
    "regnety_016", "vit_tiny_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
    "swin_tiny_patch4_window7_224", "beit_base_patch16_224", "eva02_tiny_patch14_224",
    "levit_128", "mixer_b16_224", "poolformer_s12", "coat_lite_tiny", "convmixer_768_32",
    "edgenext_small", "fastvit_t8", "efficientvit_b0", "ghostnet_100", "mobilevit_s",
)

_Parser = Parser
_Usage = UsageError
_one_line = one_line
_err = print_error
_write = write_output
_usage_error = usage_error
_unit = unit_prefix
_positive = positive_int
_depth = non_negative_int
_tolerance = tolerance
_debug = print_traceback_if_asked


def _load_rules_file(path: str) -> Mapping[Any, Any]:
    """Read a user rules file: a Python file that defines ``RULES``, a mapping for ``rules=``."""
    from flopscope.rules import RuleSet

    file = Path(path)
    if not file.is_file():
        raise _usage_error(f"--rules file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"flopscope_user_rules_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise _usage_error(f"--rules {path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise _usage_error(f"importing --rules {path!r} raised {type(e).__name__}: {e}") from e
    rules = getattr(module, "RULES", None)
    if not isinstance(rules, (Mapping, RuleSet)):
        raise _usage_error(
            f"--rules {path!r} must define RULES, a dict of operator name, module class or "
            "module path -> rule (found "
            f"{'nothing' if rules is None else type(rules).__name__})"
        )
    return rules


# -- count -----------------------------------------------------------------------------------------
def _cmd_count(args: argparse.Namespace) -> int:
    import flopscope
    from flopscope import sources
    from flopscope.render import By, Format, render, report_warnings, rich_report
    from flopscope.report import SourceInfo

    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise _usage_error(
            f"cannot plot to {args.plot!r}: use a file name ending in .png, .svg or .pdf"
        )
    specs = [sources.parse_input(text) for text in args.input]
    config = sources.parse_config(args.config)
    rules = _load_rules_file(args.rules) if args.rules else None
    loaded = sources.load_model(
        args.source, inputs=specs, batch=args.batch, seq_len=args.seq_len, config=config,
        shape_only=args.shape_only,
    )
    try:
        report = flopscope.count(
            loaded.model, loaded.inputs, shape_only=args.shape_only, backward=args.backward,
            strict=args.strict, rules=rules, warn=False,
        )
    except flopscope.ForwardError as e:
        where = f" in module '{e.module_path}'" if e.module_path else ""
        cause = e.__cause__
        reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(e)
        shapes = ", ".join(loaded.meta.get("inputs", [])) or "the default input"
        raise _usage_error(
            f"{args.source} rejected its input ({shapes}){where}: {_one_line(reason, 240)}; "
            "pass shapes it accepts with --input"
        ) from e
    except flopscope.StrictModeError as e:
        raise CheckFailed(f"--strict: {e}") from e
    report = dataclasses.replace(report, meta=report.meta.merged(SourceInfo.from_dict(loaded.meta)))

    depth = args.depth if args.depth is not None else 2
    by = By(args.by)
    fmt = Format(args.format)
    if fmt is Format.TABLE and args.output is None and sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_report(report, depth=depth, by=by, unit=args.unit))
    else:
        _write(render(report, fmt, depth=depth, by=by, unit=args.unit), args.output)
    if fmt not in (Format.TABLE, Format.MARKDOWN):
        for w in report_warnings(report):
            print(f"warning: {w.title}: {', '.join(w.items)} ({w.advice})", file=sys.stderr)
    if args.plot:
        from flopscope.plot import plot_report

        plot_report(report, args.plot, by=by.value,
                    depth=args.depth if args.depth is not None else 1)
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK


# -- diff ------------------------------------------------------------------------------------------
def _read_report(path: str) -> Any:
    from flopscope.errors import UsageError
    from flopscope.report import Report

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _usage_error(f"cannot read {path!r}: no such file") from None
    except UnicodeDecodeError:
        raise _usage_error(
            f"{path!r} is not a flopscope report (not UTF-8 text); make one with "
            "'flopscope count SOURCE --format json --output FILE'"
        ) from None
    except OSError as e:
        raise _usage_error(f"cannot read {path!r}: {e.strerror or e}") from None
    try:
        return Report.from_json(text)
    except UsageError as e:
        raise _usage_error(
            f"{path!r} is not a flopscope report ({e}); make one with "
            "'flopscope count SOURCE --format json --output FILE'"
        ) from None


def _rel(a: int, b: int) -> float:
    if a == b:
        return 0.0
    if a == 0:
        return math.inf
    return abs(b - a) / abs(a)


def _signed_pct(a: int, b: int) -> str:
    if a == b:
        return "0%"
    if a == 0:
        return "new"
    return f"{100 * (b - a) / abs(a):+.2f}%"


def _cmd_diff(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from flopscope.units import human

    a, b = _read_report(args.a), _read_report(args.b)
    sa, sb = a.by_module(), b.by_module()
    paths = list(sa) + [p for p in sb if p not in sa]
    beyond: list[str] = []
    rows = []
    for path in paths:
        ma, mb = sa.get(path), sb.get(path)
        va = (ma.params.inclusive, ma.inclusive.macs, ma.inclusive.flops) if ma else (0, 0, 0)
        vb = (mb.params.inclusive, mb.inclusive.macs, mb.inclusive.flops) if mb else (0, 0, 0)
        if va == vb:
            continue
        worst = max(_rel(x, y) for x, y in zip(va, vb, strict=True))
        if worst > args.tolerance:
            beyond.append(path or "(root)")
        level = 0 if path == "" else path.count(".") + 1
        if level <= args.depth:
            status = "only in A" if mb is None else "only in B" if ma is None else ""
            rows.append((path or "(root)", va, vb, status, worst > args.tolerance))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  title=f"{args.a} (A) -> {args.b} (B)", title_justify="left")
    for col in ("module", "params A", "params B", "MACs A", "MACs B", "Δ MACs", "FLOPs A",
                "FLOPs B", "Δ FLOPs", ""):
        table.add_column(col, justify="left" if col == "module" else "right", no_wrap=True)
    for path, va, vb, status, over in rows:
        table.add_row(path, human(va[0]), human(vb[0]), human(va[1]), human(vb[1]),
                      _signed_pct(va[1], vb[1]), human(va[2]), human(vb[2]),
                      _signed_pct(va[2], vb[2]),
                      (status + " " if status else "") + ("BEYOND" if over else ""))
    console = Console(file=sys.stdout, width=160 if not sys.stdout.isatty() else None,
                      highlight=False)
    tol = f"{100 * args.tolerance:g}%"
    if rows:
        console.print(table)
    if beyond:
        shown = ", ".join(beyond[:8]) + (f" and {len(beyond) - 8} more" if len(beyond) > 8 else "")
        console.print(f"FAIL: {len(beyond)} module(s) differ by more than {tol}: {shown}")
        return EXIT_CHECK_FAILED
    changed = sum(1 for p in paths if (p in sa) != (p in sb) or p in sa and p in sb and (
        sa[p].inclusive != sb[p].inclusive or sa[p].params != sb[p].params))
    console.print(f"OK: every module within {tol}" + (f" ({changed} changed)" if changed else
                                                        " (identical counts)"))
    return EXIT_OK


# -- rules -----------------------------------------------------------------------------------------
def _cmd_rules(args: argparse.Namespace) -> int:
    import flopscope.rules as rules_pkg

    rows = rules_pkg.conventions()
    if args.format == "markdown":
        helper: Callable[[], str] | None = getattr(rules_pkg, "conventions_markdown", None)
        if helper is not None:
            text = helper()
        else:
            lines = ["| family | operators | convention |", "| :--- | :--- | :--- |"]
            lines += [
                f"| {r.family} | {', '.join(f'`{op}`' for op in r.ops)} | "
                f"{r.text.replace('|', chr(92) + '|')} |"
                for r in rows
            ]
            text = "\n".join(lines) + "\n"
        _write(text, args.output)
        return EXIT_OK
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, show_lines=False,
                  title=f"{len(rows)} rules covering {sum(len(r.ops) for r in rows)} operators",
                  title_justify="left")
    table.add_column("family", no_wrap=True)
    table.add_column("operators", overflow="fold", max_width=44)
    table.add_column("convention", overflow="fold")
    last = ""
    for r in rows:
        if r.family != last and last:
            table.add_section()
        table.add_row(r.family if r.family != last else "", "\n".join(r.ops), r.text)
        last = r.family
    if args.output:
        import io

        buf = io.StringIO()
        Console(file=buf, width=140, no_color=True, highlight=False).print(table)
        _write(buf.getvalue(), args.output)
    else:
        Console(file=sys.stdout, width=None if sys.stdout.isatty() else 140,
                highlight=False).print(table)
    return EXIT_OK


# -- zoo -------------------------------------------------------------------------------------------
def _zoo_names(library: str, models: Sequence[str] | None) -> list[str]:
    if models:
        return [m for item in models for m in item.split(",") if m]
    if library == "torchvision":
        import torchvision.models as tvm  # type: ignore[import-untyped]

        return list(tvm.list_models(module=tvm))
    return list(TIMM_ZOO)


def _cmd_zoo(args: argparse.Namespace) -> int:
    import warnings

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import flopscope
    from flopscope import sources

    try:
        names = _zoo_names(args.library, args.models)
    except ImportError:
        raise _usage_error(
            f"zoo {args.library} needs {args.library}: pip install 'flopscope[vision]'"
        ) from None
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[model]}"), console=console,
                  transient=True) as progress:
        task = progress.add_task(f"counting {args.library}", total=len(names), model="")
        for name in names:
            progress.update(task, model=name)
            start = time.perf_counter()
            row: dict[str, Any] = {"model": name}
            try:
                with warnings.catch_warnings():  # constructors' FutureWarnings would drown the bar
                    warnings.simplefilter("ignore")
                    loaded = sources.load_model(f"{args.library}:{name}", shape_only=True)
                    report = flopscope.count(loaded.model, loaded.inputs, shape_only=True,
                                             warn=False)
                row.update(
                    input=" ".join(loaded.meta.get("inputs", [])),
                    params=report.params, macs=report.macs, flops=report.flops,
                    uncounted_ops=len(report.uncounted),
                    reference_gmacs=loaded.meta.get("reference_gmacs"),
                )
            except Exception as e:  # noqa: BLE001  (one failing model must not stop the sweep)
                failed.append(name)
                row["error"] = _one_line(f"{type(e).__name__}: {e}", 160)
                progress.console.print(f"{PROG}: zoo: {name}: {row['error']}", markup=False)
            row["seconds"] = time.perf_counter() - start
            results.append(row)
            progress.advance(task)
    _write(_zoo_table(results, args.format, args.library), args.output)
    if failed:
        _err(f"zoo: {len(failed)} of {len(names)} model(s) failed: {', '.join(failed)}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _zoo_table(results: list[dict[str, Any]], fmt: str, library: str) -> str:
    with_ref = library == "torchvision" and any(r.get("reference_gmacs") for r in results)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        fields = ["model", "input", "params", "macs", "flops", "uncounted_ops", "seconds"]
        if with_ref:
            fields.insert(5, "reference_gmacs")
        fields.append("error")
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        for r in results:
            writer.writerow({**r, "seconds": f"{r['seconds']:.2f}"})
        return buf.getvalue()
    header = ["model", "input", "params (M)", "MACs (G)", "FLOPs (G)"]
    if with_ref:
        header.append("torchvision GFLOPS")
    header += ["count time (s)"]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join([":---", ":---"] + ["---:"] * (len(header) - 2)) + " |"]
    for r in results:
        if "error" in r:
            cells = [f"`{r['model']}`", "", "", "", f"failed: {r['error']}"]
            cells += [""] * (len(header) - len(cells) - 1) + [f"{r['seconds']:.2f}"]
        else:
            cells = [f"`{r['model']}`", r["input"], f"{r['params'] / 1e6:.2f}",
                     f"{r['macs'] / 1e9:.3f}", f"{r['flops'] / 1e9:.3f}"]
            if with_ref:
                ref = r.get("reference_gmacs")
                cells.append(f"{ref:.3f}" if ref is not None else "")
            cells.append(f"{r['seconds']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- parser ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``flopscope`` (with the measurement commands when available).

    Returns:
        The parser; each subcommand sets ``func(args) -> int``.
    """
    parser = _Parser(
        prog=PROG,
        description="Parameters, MACs and FLOPs of PyTorch models, per module and per operator.",
        epilog="Exit codes: 0 ok, 1 a check failed, 2 usage error.",
    )
    from flopscope import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    count = sub.add_parser(
        "count", help="count a model and print the report",
        description="Count one forward (and with --backward, backward) pass of a model.",
        epilog="SOURCE: torchvision:NAME, timm:NAME, hf:MODEL_TYPE, hf:path/to/config.json, "
               "path/to/file.py:factory or package.module:factory. Example: flopscope count "
               "hf:llama --shape-only --config num_hidden_layers=2 --seq-len 512",
    )
    count.add_argument("source", metavar="SOURCE", help="the model (see below)")
    count.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                       help="an input shape such as 1x3x224x224 or 1x128:int64; repeat for "
                            "several inputs (replaces the source's default inputs)")
    count.add_argument("--batch", type=_positive, help="batch size (first dimension of inputs)")
    count.add_argument("--seq-len", type=_positive,
                       help="sequence length of hf: token inputs (default 128)")
    count.add_argument("--backward", action="store_true", help="count forward + backward")
    count.add_argument("--shape-only", action="store_true",
                       help="no arithmetic: fake/meta tensors, same counts, little memory")
    count.add_argument("--depth", type=_depth, default=None,
                       help="levels of the module tree to show (table default 2, plot default 1)")
    count.add_argument("--by", choices=["module", "op"], default="module",
                       help="break down by module tree or by operator")
    count.add_argument("--format", choices=["table", "markdown", "json", "csv"], default="table")
    count.add_argument("--output", metavar="FILE", help="write the result to FILE, not stdout")
    count.add_argument("--plot", metavar="FILE", help="also write a chart (.png, .svg or .pdf)")
    count.add_argument("--strict", action="store_true",
                       help="fail (exit 1) when an operator has no rule")
    count.add_argument("--unit", type=_unit, default=None, metavar="auto|K|M|G|T",
                       help="fixed prefix for MACs and FLOPs (default auto)")
    count.add_argument("--rules", metavar="FILE.py",
                       help="a Python file defining RULES, a dict of extra rules")
    count.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="override an hf: config setting (repeatable)")
    count.set_defaults(func=_cmd_count)

    diff = sub.add_parser(
        "diff", help="compare two saved reports (exit 1 beyond tolerance)",
        description="Per-module differences between two reports saved with --format json.",
    )
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.add_argument("--tolerance", type=_tolerance, default=0.0,
                      help="allowed relative change per module, e.g. 1%% (default 0)")
    diff.add_argument("--depth", type=_depth, default=2,
                      help="levels of changed modules to list (all are checked)")
    diff.set_defaults(func=_cmd_diff)

    rules = sub.add_parser("rules", help="every supported operator and its counting convention")
    rules.add_argument("--format", choices=["table", "markdown"], default="table")
    rules.add_argument("--output", metavar="FILE")
    rules.set_defaults(func=_cmd_rules)

    zoo = sub.add_parser(
        "zoo", help="count many models of a library into one table",
        description="Params, MACs, FLOPs and time to count of many models (shape-only).",
    )
    zoo.add_argument("library", choices=["torchvision", "timm"])
    zoo.add_argument("--models", nargs="+", metavar="NAME",
                     help="model names (space or comma separated); default: every torchvision "
                          "classification model, or a selection of timm models")
    zoo.add_argument("--format", choices=["csv", "markdown"], default="markdown")
    zoo.add_argument("--output", metavar="FILE")
    zoo.set_defaults(func=_cmd_zoo)

    _add_measure(sub)
    return parser


def _add_measure(sub: Any) -> None:
    """Register ``measure`` and ``validate`` (:mod:`flopscope.cli.measure`); if that module
    cannot load, the two commands still exist and say why they cannot run (counting is
    unaffected)."""
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


# -- entry points ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit code: 0 ok, 1 a check failed, 2 usage error.
    """
    from flopscope.errors import FlopscopeError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        code: int = args.func(args)
        return code
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except CheckFailed as e:
        _debug()
        _err(f"check failed: {e}")
        return EXIT_CHECK_FAILED
    except (FlopscopeError, ImportError) as e:
        _debug()
        _err(f"error: {e}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001  (one line, never a traceback; FLOPSCOPE_TRACEBACK=1 shows it)
        _debug()
        _err(f"error: {type(e).__name__}: {e} (set FLOPSCOPE_TRACEBACK=1 to see where)")
        return EXIT_USAGE


def main_entry() -> None:
    """Console-script entry point: ``sys.exit(main())``; Ctrl-C at any moment exits 130 with
    one line."""
    try:
        code = main()
    except KeyboardInterrupt:
        print_error("interrupted")
        code = EXIT_INTERRUPTED
    sys.exit(code)
