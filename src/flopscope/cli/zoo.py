"""``flopscope zoo torchvision|timm|hf``: count many models, at one or several shapes, into one
table (shape-only, in worker processes). The sweep itself is :mod:`flopscope.zoo`; this module
shows progress and writes the table, keeping every finished row when interrupted."""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Sequence
from typing import Any

from flopscope.cli._options import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    PROG,
    add_format,
    add_output,
    check_page_output,
    print_error,
    usage_error,
    write_output,
)
from flopscope.cli.types import positive_int, positive_int_list
from flopscope.zoo import LIBRARIES, ZooRow, default_jobs, sweep, zoo_models

__all__ = ["add_subcommands", "run_zoo", "zoo_table"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``zoo`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    zoo = subparsers.add_parser(
        "zoo", help="count many models of a library into one table",
        description="Params, MACs, FLOPs and time to count of many models (shape-only).",
    )
    zoo.add_argument("library", choices=list(LIBRARIES))
    zoo.add_argument("--models", nargs="+", metavar="NAME",
                     help="model names (space or comma separated; 'all': every model the library "
                          "lists); default: every torchvision classification model, or a "
                          "selection of timm models or transformers model types")
    zoo.add_argument("--jobs", "-j", type=positive_int, default=None, metavar="N",
                     help="worker processes, each counting one model at a time on one thread "
                          "(default: one per core)")
    zoo.add_argument("--batch", type=positive_int_list, default=None, metavar="N[,N...]",
                     help="batch sizes to count every model at, e.g. 1,8,64")
    zoo.add_argument("--seq-len", type=positive_int_list, default=None, metavar="N[,N...]",
                     help="sequence lengths to count every hf model at, e.g. 128,2048,32768")
    add_format(zoo, choices=("markdown", "csv", "html"), default="markdown")
    add_output(zoo)
    zoo.set_defaults(func=run_zoo)


def zoo_table(rows: Sequence[ZooRow], fmt: str, library: str, *, times: bool = True) -> str:
    """The sweep's rows as CSV (plain numbers), a Markdown table (M params, G MACs/FLOPs) or a
    sortable HTML page (plain numbers).

    Args:
        rows: the finished rows.
        fmt: ``"csv"``, ``"markdown"`` or ``"html"``.
        library: the library swept (torchvision adds its published GFLOPS column).
        times: with the Markdown table's "count time" column (README's table leaves it out).

    Returns:
        The text.
    """
    from flopscope.render.units import scaled

    with_ref = library == "torchvision" and any(r.reference_gmacs for r in rows)
    if fmt == "html":
        from flopscope.render.html import render_table_html

        columns = ["model", "input", "params", "macs", "flops",
                   *(["reference_gmacs"] if with_ref else []), "uncounted_ops", "seconds", "error"]
        return render_table_html(f"flopscope zoo {library}", columns,
                                 [{**_csv_row(r), "seconds": r.seconds, "error": r.error}
                                  for r in rows],
                                 note="params, MACs and FLOPs of each model at its input" + (
                                     " (reference_gmacs: torchvision's published GMACs)"
                                     if with_ref else ""))
    if fmt == "csv":
        buf = io.StringIO()
        fields = ["model", "input", "params", "macs", "flops", "uncounted_ops", "seconds"]
        if with_ref:
            fields.insert(5, "reference_gmacs")
        fields.append("error")
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow(_csv_row(r))
        return buf.getvalue()
    header = ["model", "input", "params (M)", "MACs (G)", "FLOPs (G)"]
    if with_ref:
        header.append("torchvision GFLOPS")
    if times:
        header += ["count time (s)"]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join([":---", ":---"] + ["---:"] * (len(header) - 2)) + " |"]
    for r in rows:
        if r.error is not None:
            asked = " ".join(f"{k}={v}" for k, v in (("batch", r.batch), ("seq_len", r.seq_len))
                             if v is not None)
            cells = [f"`{r.model}`", asked, "", "", f"failed: {r.error}"]
            timing = [f"{r.seconds:.2f}"] if times else []
            cells += [""] * (len(header) - len(cells) - len(timing)) + timing
        else:
            cells = [f"`{r.model}`", r.input, scaled(r.params, "M"), scaled(r.macs, "G", 3),
                     scaled(r.flops, "G", 3)]
            if with_ref:
                ref = r.reference_gmacs
                cells.append(f"{ref:.3f}" if ref is not None else "")
            if times:
                cells.append(f"{r.seconds:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _csv_row(r: ZooRow) -> dict[str, Any]:
    """The CSV cells of a row: a failed model has only its name, time and error."""
    if r.error is not None:
        return {"model": r.model, "seconds": f"{r.seconds:.2f}", "error": r.error}
    return {"model": r.model, "input": r.input, "params": r.params, "macs": r.macs,
            "flops": r.flops, "uncounted_ops": r.uncounted_ops,
            "reference_gmacs": r.reference_gmacs, "seconds": f"{r.seconds:.2f}"}


def run_zoo(args: argparse.Namespace) -> int:
    """``flopscope zoo LIBRARY``: count every model, then write the table. On Ctrl-C the rows
    finished so far are written before the interrupt goes on (exit 130).

    Args:
        args: the parsed arguments (``library``, ``models``, ``format``, ``output``, ``jobs``,
            ``batch``, ``seq_len``).

    Returns:
        0, or 1 when a model failed.

    Raises:
        UsageError: the library is not installed, or ``--models`` names a model it does not
            have.
        KeyboardInterrupt: Ctrl-C, after the finished rows were written.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flopscope.errors import SourceError

    check_page_output(args.format, args.output)
    try:
        names = zoo_models(args.library, args.models)
    except ImportError:
        raise usage_error(
            f"zoo {args.library} needs {args.library}: pip install 'flopscope[vision]'"
        ) from None
    except SourceError as e:  # a misspelt name: before anything is counted
        raise usage_error(f"--models: {e}") from None
    batches: list[int | None] = list(getattr(args, "batch", None) or [None])
    seq_lens: list[int | None] = list(getattr(args, "seq_len", None) or [None])
    jobs = getattr(args, "jobs", None) or default_jobs()
    # rows come back as they finish; the table keeps the order of the names and shapes
    order = {(name, b, s): i for i, (name, b, s) in
             enumerate((n, b, s) for n in names for b in batches for s in seq_lens)}
    total = len(order)
    rows: list[ZooRow] = []
    console = Console(stderr=True)
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.fields[model]}"), console=console,
                      transient=True, disable=not console.is_terminal) as progress:
            task = progress.add_task(f"counting {args.library}", total=total, model="")
            for row in sweep(args.library, names,
                             on_start=lambda name: progress.update(task, model=name),
                             jobs=jobs, batches=batches, seq_lens=seq_lens):
                rows.append(row)
                rows.sort(key=lambda r: order.get((r.model, r.batch, r.seq_len), total))
                if row.error is not None:
                    progress.console.print(f"{PROG}: zoo: {row.model}: {row.error}",
                                           markup=False, highlight=False, soft_wrap=True)
                progress.advance(task)
    except KeyboardInterrupt:
        if rows:
            _write_quietly(zoo_table(rows, args.format, args.library), args.output)
        where = "stdout" if args.output in (None, "-") else args.output
        raise KeyboardInterrupt(
            f"zoo: {len(rows)} of {total} models finished"
            + (f", their rows written to {where}" if rows else "")
        ) from None
    write_output(zoo_table(rows, args.format, args.library), args.output)
    failed = [r.model for r in rows if r.error is not None]
    if failed:
        print_error(f"zoo: {len(failed)} of {total} model(s) failed: {', '.join(failed)}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _write_quietly(text: str, output: str | None) -> None:
    """Write the partial table without the ``wrote FILE`` line (the interrupt's one line says
    it); a failure to write must not hide the interrupt."""
    import contextlib
    import sys

    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with contextlib.suppress(OSError), open(output, "w", encoding="utf-8") as fh:
        fh.write(text)
