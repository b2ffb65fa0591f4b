"""Regenerate docs/validation.md: counted vs executed FLOPs, ``python -m benchmarks.validation``.

For each model: build it once with random weights (seed 0) in the chosen dtype, count one forward
pass with flopscope and measure the floating-point operations the CPU executed for the same
forward (:func:`flopscope.measure.measure_request`), overall and per module.  Every model's result
is kept as JSON under ``OUT/runs/``, written as soon as the model is done: a rerun skips the models
already measured with the same options (``--fresh`` starts over), and a model that fails is
recorded and tried again next time while the others keep their results.  The CSV
(``OUT/results.csv``), the log-log plot (``OUT/counted_vs_measured.png``) and the generated
section of the Markdown page are always written from every stored result of the requested models.

    .venv/bin/python -m benchmarks.validation --dtype float64 \\
        --out docs/validation --markdown docs/validation.md

Exit status 1 if a model failed or deviates more than ``--tolerance``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import plotting
from flopscope.measure import Backend, MeasureRequest, measure_sources

DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "squeezenet1_0", "alexnet", "vgg11")
MARK_BEGIN = "<!-- flopscope-validate:begin (generated; edit outside these markers) -->"
MARK_END = "<!-- flopscope-validate:end -->"
COMMAND = "python -m benchmarks.validation"

Record = dict[str, Any]


def source_of(name: str) -> str:
    """A SOURCE string for a model name (bare names are torchvision models).

    Args:
        name: ``resnet18`` or any SOURCE (``torchvision:resnet18``, ``path/f.py:factory``).

    Returns:
        The SOURCE.
    """
    return name if ":" in name else f"torchvision:{name}"


def label_of(source: str) -> str:
    """The short name shown in tables (``torchvision:resnet18`` -> ``resnet18``).

    Args:
        source: a SOURCE.

    Returns:
        The label.
    """
    return source.removeprefix("torchvision:")


def _slug(source: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", source).strip("_")


def run_file(out: Path, source: str) -> Path:
    """Where one model's result is stored.

    Args:
        out: the output directory.
        source: the model's SOURCE.

    Returns:
        ``OUT/runs/<source slug>.json``.
    """
    return out / "runs" / f"{_slug(source)}.json"


def load_record(out: Path, request: MeasureRequest) -> Record | None:
    """The stored result of ``request``, if one was measured with the same options.

    Args:
        out: the output directory.
        request: the request.

    Returns:
        The record, or ``None`` (none stored, options differ, or unreadable).
    """
    path = run_file(out, request.source)
    try:
        record: Record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("request") == request.to_dict() else None


def run(
    requests: Sequence[MeasureRequest],
    out: Path,
    *,
    backend: Backend | str = "auto",
    fresh: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[Record]:
    """Measure every request that has no stored result (all with ``fresh``); store each result.

    Args:
        requests: the models.
        out: the output directory (results under ``out/runs/``).
        backend: a backend name or object.
        fresh: measure every model again.
        progress: stage messages.

    Returns:
        One record per request, in order: ``{"source", "request", "seconds", "error",
        "result"}`` with ``result`` the :meth:`~flopscope.measure.MeasureResult.to_dict` document
        (``None`` if the model failed).
    """
    stored = {r.source: (None if fresh else load_record(out, r)) for r in requests}
    todo = [r for r in requests if stored[r.source] is None or stored[r.source]["error"]]
    skipped = len(requests) - len(todo)
    if progress is not None and skipped:
        progress(f"{skipped} model(s) already measured with these options (--fresh to redo)")

    def save(entry: Any) -> None:
        record = {
            "source": entry.request.source,
            "request": entry.request.to_dict(),
            "seconds": round(entry.seconds, 1),
            "error": entry.error,
            "result": entry.result.to_dict() if entry.result is not None else None,
        }
        path = run_file(out, entry.request.source)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        stored[entry.request.source] = record

    if todo:
        measure_sources(todo, backend=backend, progress=progress, on_entry=save)
    return [r for r in (stored[q.source] for q in requests) if r is not None]


def ratio(record: Record) -> float | None:
    """measured/counted of a record, ``None`` if it failed or nothing was counted.

    Args:
        record: a stored record.

    Returns:
        The ratio.
    """
    result = record.get("result")
    return None if result is None else result.get("ratio")


def _input_label(record: Record) -> str:
    res = record.get("result") or {}
    return ", ".join(res.get("inputs") or record["request"].get("inputs") or ["default"])


def write_csv(records: Sequence[Record], path: Path) -> None:
    """One row per model.

    Args:
        records: the records.
        path: the CSV file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "source", "dtype", "input", "counted_macs", "counted_flops",
                    "measured_flops", "measured_double", "measured_single", "ratio", "backend",
                    "region_seconds", "seconds", "error"])
        for rec in records:
            res = rec["result"] or {}
            by_prec = res.get("measured_by_precision", {})
            w.writerow([
                label_of(rec["source"]), rec["source"], rec["request"]["dtype"],
                _input_label(rec), res.get("counted_macs", ""), res.get("counted_flops", ""),
                res.get("measured_flops", ""), by_prec.get("double", 0) if res else "",
                by_prec.get("single", 0) if res else "",
                f"{res['ratio']:.6f}" if res.get("ratio") is not None else "",
                res.get("backend", ""), res.get("region_seconds", ""), rec["seconds"],
                rec["error"] or "",
            ])


def write_plot(records: Sequence[Record], path: Path, title: str) -> str | None:
    """Counted vs measured FLOPs on log-log axes with the line y = x.

    Args:
        records: the records (failed models are left out).
        path: the PNG file.
        title: the plot title.

    Returns:
        ``None`` on success, else why no plot was written.
    """
    points = [
        (label_of(r["source"]), r["result"]["counted_flops"], r["result"]["measured_flops"])
        for r in records
        if r["result"] is not None and r["result"]["counted_flops"]
    ]
    if not points:
        return "no model was both counted and measured"
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    fig, ax = plt.subplots(figsize=(6, 5.5))
    plotting.counted_vs_measured_axes(ax, [p[1] for p in points] + [p[2] for p in points],
                                      title=title, title_size=10)
    ax.scatter([p[1] for p in points], [p[2] for p in points], zorder=3)
    for name, x, y in points:
        ax.annotate(f"{name} ({y / x:.3f})", (x, y), textcoords="offset points",
                    xytext=(6, -10), fontsize=8)
    ax.legend(loc="upper left")
    plotting.save(plt, fig, path, dpi=120)
    return None


_PER_MODEL_NOTES = ("valgrind/callgrind:", "counters were multiplexed", "could not be read")


def _per_model(note: str) -> bool:
    return any(marker in note for marker in _PER_MODEL_NOTES)


def _n(value: Any) -> str:
    return "-" if value is None or value == "" else f"{value:,}"


def _module_section(record: Record) -> list[str]:
    res = record["result"]
    if res is None or len(res["modules"]) < 2:
        return []
    lines = [f"**{label_of(record['source'])}** per module "
             "((outside) = code outside the listed modules):", ""]
    extra = [n for n in res["notes"] if _per_model(n)]
    lines += [f"- {n}" for n in extra] + ([""] if extra else [])
    lines += ["| module | counted FLOPs | measured FLOPs | measured/counted | share of gap |",
              "|---|---:|---:|---:|---:|"]
    gap = res["measured_flops"] - res["counted_flops"]
    for m in res["modules"]:
        diff = m["measured_flops"] - m["counted_flops"]
        share = f"{diff / gap:.0%}" if gap else "-"
        shown = "-" if not m["measured_flops"] else "n/a"
        r = f"{m['ratio']:.4f}" if m["counted_flops"] else shown
        name = f"`{m['path']}`" if m["path"] else "(outside)"
        lines.append(f"| {name} | {m['counted_flops']:,} | {m['measured_flops']:,} | {r} | "
                     f"{share} |")
    lines.append("")
    return lines


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def results_markdown(records: Sequence[Record], *, command: str, plot_name: str | None,
                     csv_name: str) -> str:
    """The generated part of the validation page.

    Args:
        records: the records.
        command: the command that produced them.
        plot_name: the plot's path relative to the page (``None``: no plot).
        csv_name: the CSV's path relative to the page.

    Returns:
        Markdown.
    """
    first = next((r["result"] for r in records if r["result"] is not None), None)
    lines = ["", f"Generated by `{command}`", "",
             f"Machine: {platform.machine()}, {_cpu_name()}, {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}."
             + (f" Backend: {first['backend']}." if first else ""), ""]
    if first is not None:
        lines += [f"- {n}" for n in first["notes"] if not _per_model(n)] + [""]
    lines += ["| model | input | counted MACs | counted FLOPs | measured FLOPs | measured/counted |"
              " measured region | total time |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rec in records:
        res = rec["result"]
        r = ratio(rec)
        shown = f"**{r:.4f}**" if r is not None else ("-" if res else "failed")
        region = f"{res['region_seconds']:.1f} s" if res else "-"
        lines.append(
            f"| {label_of(rec['source'])} | {_input_label(rec)} | "
            f"{_n(res['counted_macs'] if res else None)} | "
            f"{_n(res['counted_flops'] if res else None)} | "
            f"{_n(res['measured_flops'] if res else None)} | {shown} | {region} | "
            f"{rec['seconds']:.0f} s |"
        )
    lines.append("")
    failed = [r for r in records if r["error"]]
    lines += [f"- **{label_of(r['source'])} failed**: `{r['error']}`" for r in failed]
    if failed:
        lines.append("")
    if plot_name:
        lines += [f"![counted vs measured FLOPs, log-log, with y = x]({plot_name})", ""]
    lines += [f"Raw numbers: [{csv_name}]({csv_name}); one JSON document per model under "
              "`runs/` beside it.", ""]
    for rec in records:
        lines += _module_section(rec)
    return "\n".join(lines)


def update_markdown(path: Path, generated: str, title: str) -> None:
    """Replace the generated section of ``path`` (between the markers), keeping the rest.

    Args:
        path: the Markdown page (created if missing).
        generated: the generated Markdown.
        title: the title of a new page.
    """
    block = f"{MARK_BEGIN}\n{generated}\n{MARK_END}"
    if path.exists():
        text = path.read_text()
        if MARK_BEGIN in text and MARK_END in text:
            before, rest = text.split(MARK_BEGIN, 1)
            after = rest.split(MARK_END, 1)[1]
            path.write_text(before + block + after)
            return
        path.write_text(text.rstrip("\n") + "\n\n" + block + "\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {title}\n\n## Results\n\n{block}\n")


def _relative(target: Path, base: Path) -> str:
    return Path(os.path.relpath(target.resolve(), base.resolve())).as_posix()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL",
                   help="model names (torchvision) or SOURCE strings (default: %(default)s)")
    p.add_argument("--dtype", default="float64", help="dtype (default: %(default)s)")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                   help="input shape, e.g. 1x3x224x224 (default: each source's own input)")
    p.add_argument("--batch", type=int, default=None, help="batch size")
    p.add_argument("--depth", type=int, default=1,
                   help="module depth of the per-module tables (default: %(default)s)")
    p.add_argument("--backend", default="auto", help="auto, perf, papi or valgrind")
    p.add_argument("--out", default="docs/validation",
                   help="directory for runs/, results.csv and the plot (default: %(default)s)")
    p.add_argument("--markdown", default=None,
                   help="update the generated section of this page (e.g. docs/validation.md)")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="exit 1 beyond this relative deviation (default: %(default)s)")
    p.add_argument("--fresh", action="store_true", help="measure every model again")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the experiment and write its outputs.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0, or 1 if a model failed or deviates more than ``--tolerance``.
    """
    args = _parser().parse_args(argv)
    start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    requests = [
        MeasureRequest(source_of(m), inputs=tuple(args.input), batch=args.batch,
                       dtype=args.dtype, depth=args.depth)
        for m in args.models
    ]
    out = Path(args.out)
    records = run(requests, out, backend=args.backend, fresh=args.fresh, progress=say)
    csv_path = out / "results.csv"
    plot_path = out / "counted_vs_measured.png"
    write_csv(records, csv_path)
    backend = next((r["result"]["backend"] for r in records if r["result"]), args.backend)
    shape = ", ".join(args.input) or "default input"
    problem = write_plot(records, plot_path,
                         f"{args.dtype}, {shape}: counted vs measured FLOPs ({backend})")
    if problem:
        say(f"no plot: {problem}")
    for rec in records:
        r = ratio(rec)
        print(f"{label_of(rec['source']):<24} "
              + (f"{r:.4f}" if r is not None else f"FAILED {rec['error']}"))
    if args.markdown:
        page = Path(args.markdown)
        argv_text = " ".join(["--models", *args.models, "--dtype", args.dtype,
                              *[f"--input {s}" for s in args.input],
                              *(["--batch", str(args.batch)] if args.batch else []),
                              *(["--depth", str(args.depth)] if args.depth != 1 else []),
                              "--backend", args.backend, "--out", args.out,
                              "--markdown", args.markdown])
        rel = _relative(out, page.parent)
        text = results_markdown(records, command=f"{COMMAND} {argv_text}",
                                plot_name=None if problem else f"{rel}/{plot_path.name}",
                                csv_name=f"{rel}/{csv_path.name}")
        update_markdown(page, text, "Validation: counted vs measured FLOPs")
        say(f"wrote {page}")
    bad = [label_of(r["source"]) for r in records
           if ratio(r) is None or abs(ratio(r) - 1) > args.tolerance]  # type: ignore[operator]
    if bad:
        print(f"outside tolerance or failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
