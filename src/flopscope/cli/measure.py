"""Command-line subcommands ``measure`` and ``validate`` (wired into ``flopscope`` by cli/__init__.py).

Results go to stdout, progress and diagnostics to stderr.  Exit status: 0 ok, 1 a check failed
(a model failed or is outside ``--tolerance``), 2 usage error (bad option, unavailable backend).

Also runnable on its own: ``python -m flopscope.cli.measure validate torchvision ...``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from flopscope.errors import BackendUnavailableError, FlopscopeError, UsageError

__all__ = ["add_subcommands", "main", "run_measure", "run_validate"]

_BACKENDS = ("auto", "perf", "papi", "valgrind")


def _err(msg: str) -> None:
    print(f"flopscope: {msg}", file=sys.stderr, flush=True)


def _progress(start: float) -> Any:
    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    return say


def add_subcommands(subparsers: Any) -> None:
    """Register ``measure`` and ``validate`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    m = subparsers.add_parser(
        "measure",
        help="measured vs counted FLOPs of one model",
        description="Run one forward pass of a model and compare the floating-point operations "
        "the CPU executed with flopscope's count, per top-level module where the backend allows.",
    )
    m.add_argument("source", help="model source, e.g. torchvision:resnet18")
    _common(m)
    m.add_argument("--batch-size", type=int, default=1, help="batch size (default 1)")
    m.add_argument("--json", action="store_true", help="print the result as JSON")
    m.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="exit 1 if |measured/counted - 1| exceeds this (e.g. 0.03)",
    )
    m.set_defaults(func=run_measure)

    v = subparsers.add_parser(
        "validate",
        help="counted vs measured FLOPs for a set of models (table, CSV, plot, Markdown)",
        description="The validation experiment: count and measure torchvision models (float64 "
        "by default) and report measured/counted per model.",
    )
    v.add_argument("suite", choices=["torchvision"], help="model collection")
    v.add_argument(
        "--models",
        default=",".join(_default_models()),
        help="comma-separated model names (default: %(default)s)",
    )
    _common(v, default_dtype="float64")
    v.add_argument(
        "--out",
        default="flopscope-validation",
        help="directory for results.csv and the plot (default: %(default)s)",
    )
    v.add_argument(
        "--markdown",
        default=None,
        help="update the generated section of this Markdown page (e.g. "
        "docs/validation.md); the plot and CSV are linked relative to it",
    )
    v.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="exit 1 if a model deviates more than this (default: %(default)s)",
    )
    v.set_defaults(func=run_validate)


def _default_models() -> tuple[str, ...]:
    from flopscope.measure.validate import DEFAULT_MODELS

    return DEFAULT_MODELS


def _common(p: argparse.ArgumentParser, default_dtype: str = "float32") -> None:
    p.add_argument(
        "--dtype", default=default_dtype, help="dtype of weights and inputs (default: %(default)s)"
    )
    p.add_argument(
        "--backend",
        choices=_BACKENDS,
        default="auto",
        help="measurement backend (default: auto = perf, else papi, else valgrind)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=1,
        help="module depth of the per-module comparison (default: 1 = top-level modules)",
    )
    p.add_argument(
        "--input-size",
        type=int,
        default=224,
        help="input image height and width (default: %(default)s)",
    )


def _backend_line(backend: str) -> tuple[str, str]:
    from flopscope.measure import select_backend

    chosen, reasons = select_backend(backend)
    why = "; ".join(f"{b.value}: {r}" for b, r in reasons.items())
    return chosen.value, why


def run_measure(args: argparse.Namespace) -> int:
    """``flopscope measure SOURCE``.

    Args:
        args: parsed arguments (source, dtype, backend, input_size, batch_size, json, tolerance).

    Returns:
        Exit status.
    """
    start = time.perf_counter()
    say = _progress(start)
    try:
        import torch

        import flopscope
        from flopscope.measure import ValgrindOptions, measure_source, resolve_source
        from flopscope.measure.validate import counted_segments

        chosen, why = _backend_line(args.backend)
        say(f"backend: {chosen}" + (f" (unavailable: {why})" if why else ""))
        say(f"counting {args.source} ({args.dtype}, {args.input_size}x{args.input_size})")
        model, inputs = resolve_source(
            args.source, dtype=args.dtype, input_size=args.input_size, batch_size=args.batch_size
        )
        with torch.no_grad():
            report = flopscope.count(model, *inputs, warn=False)
        segments = counted_segments(report, model, args.depth)
        del model, inputs
        say(f"counted {report.flops:,} FLOPs; measuring")
        m = measure_source(
            args.source,
            dtype=args.dtype,
            input_size=args.input_size,
            batch_size=args.batch_size,
            backend=chosen,
            valgrind=ValgrindOptions(segment_depth=args.depth),
            progress=say,
        )
    except (UsageError, BackendUnavailableError) as exc:
        _err(f"error: {exc}")
        return 2
    except FlopscopeError as exc:
        _err(f"error: {exc}")
        return 1
    cmp = m.compare(report.flops, segments)
    if args.json:
        print(
            json.dumps(
                {
                    "source": args.source,
                    "dtype": args.dtype,
                    "input_size": args.input_size,
                    "backend": m.backend,
                    "counted_flops": report.flops,
                    "counted_macs": report.macs,
                    "measured_flops": m.flops,
                    "ratio": cmp.ratio,
                    "measured_by_precision": dict(m.flops_by_precision),
                    "segments": [
                        {
                            "path": s.path,
                            "counted_flops": s.counted_flops,
                            "measured_flops": s.measured_flops,
                        }
                        for s in cmp.segments
                    ],
                    "notes": list(m.notes),
                    "region_seconds": m.region_seconds,
                },
                indent=2,
            )
        )
    else:
        print(
            f"{args.source} ({args.dtype}, input {args.input_size}x{args.input_size}, "
            f"batch {args.batch_size}), backend {m.backend}"
        )
        print(f"  counted  FLOPs: {report.flops:>18,}   (MACs {report.macs:,})")
        print(
            f"  measured FLOPs: {m.flops:>18,}   "
            + ", ".join(f"{k} {v:,}" for k, v in m.flops_by_precision.items())
        )
        print(f"  measured/counted: {cmp.ratio:.4f}")
        if cmp.segments:
            print(f"\n  {'module':<20} {'counted':>16} {'measured':>16} {'ratio':>8}")
            for s in cmp.segments:
                ratio = f"{s.ratio:.4f}" if s.counted_flops else "-"
                print(
                    f"  {s.path or '(root)':<20} {s.counted_flops:>16,} "
                    f"{s.measured_flops:>16,} {ratio:>8}"
                )
        if m.by_instruction:
            top = list(m.by_instruction.items())[:8]
            print("\n  top instructions by FLOPs: " + ", ".join(f"{k} {v:,}" for k, v in top))
        for note in m.notes:
            print(f"  note: {note}")
    if args.tolerance is not None and not cmp.within(args.tolerance):
        _err(f"measured/counted = {cmp.ratio:.4f} is outside the tolerance {args.tolerance}")
        return 1
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """``flopscope validate torchvision``.

    Args:
        args: parsed arguments (suite, models, dtype, backend, input_size, out, markdown,
            tolerance).

    Returns:
        Exit status: 1 if any model failed or deviates more than ``--tolerance``.
    """
    from flopscope.measure.validate import (
        render_table,
        results_markdown,
        run_validation,
        update_markdown,
        write_csv,
        write_plot,
    )

    start = time.perf_counter()
    say = _progress(start)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        _err("error: --models is empty")
        return 2
    try:
        chosen, why = _backend_line(args.backend)
    except (UsageError, BackendUnavailableError) as exc:
        _err(f"error: {exc}")
        return 2
    say(f"backend: {chosen}" + (f" (unavailable: {why})" if why else ""))
    if args.input_size != 224:
        say(
            f"note: input size reduced to {args.input_size}x{args.input_size} "
            "(counted and measured on the same input)"
        )
    results = run_validation(
        models,
        dtype=args.dtype,
        input_size=args.input_size,
        backend=chosen,
        depth=args.depth,
        progress=say,
    )
    out = Path(args.out)
    csv_path = out / "results.csv"
    plot_path = out / "counted_vs_measured.png"
    write_csv(results, csv_path)
    title = (
        f"torchvision, {args.dtype}, input {args.input_size}x{args.input_size}: "
        f"counted vs measured FLOPs ({chosen})"
    )
    plot_problem = write_plot(results, plot_path, title)
    if plot_problem:
        say(f"no plot: {plot_problem}")
    print(
        f"torchvision models, {args.dtype}, input {args.input_size}x{args.input_size}"
        + (" (reduced from 224)" if args.input_size != 224 else "")
        + f", backend {chosen}"
    )
    print(render_table(results))
    print(f"\nCSV: {csv_path}" + ("" if plot_problem else f"\nplot: {plot_path}"))
    if args.markdown:
        page = Path(args.markdown)
        command = "flopscope validate " + " ".join(
            shlex.quote(a)
            for a in [
                args.suite,
                "--models",
                ",".join(models),
                "--dtype",
                args.dtype,
                "--input-size",
                str(args.input_size),
                "--backend",
                args.backend,
                *(["--depth", str(args.depth)] if args.depth != 1 else []),
                "--out",
                args.out,
                "--markdown",
                args.markdown,
            ]
        )
        rel = _relative(out, page.parent)
        text = results_markdown(
            results,
            command=command,
            plot_name=None if plot_problem else f"{rel}/{plot_path.name}",
            csv_name=f"{rel}/{csv_path.name}",
        )
        update_markdown(page, text, "Validation: counted vs measured FLOPs")
        print(f"Markdown: {page}")
    bad = [r for r in results if r.comparison is None or not r.comparison.within(args.tolerance)]
    if bad:
        _err("outside tolerance or failed: " + ", ".join(r.name for r in bad))
        return 1
    return 0


def _relative(target: Path, base: Path) -> str:
    import os

    return Path(os.path.relpath(target.resolve(), base.resolve())).as_posix()


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m flopscope.cli.measure``).

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        Exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m flopscope.cli.measure")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
