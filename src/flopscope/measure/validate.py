"""Counted vs measured FLOPs for a set of torchvision models (the validation experiment).

For each model: build it with random weights in the chosen dtype, count one forward pass with
:func:`flopscope.count`, measure the same forward pass with a :mod:`flopscope.measure` backend,
and compare, per top-level module where the backend allows it.  Results are written as a text
table, a CSV file, a log-log scatter plot (counted vs measured, with the line y = x) and a
Markdown section.  A model that fails is reported with its error; the others still run.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopscope.errors import MeasureError
from flopscope.measure.result import Comparison, Measurement
from flopscope.measure.valgrind import ValgrindOptions

__all__ = [
    "DEFAULT_MODELS",
    "ModelResult",
    "counted_segments",
    "render_table",
    "run_validation",
    "update_markdown",
    "write_csv",
    "write_plot",
]

DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "squeezenet1_0", "alexnet", "vgg11")
MARK_BEGIN = "<!-- flopscope-validate:begin (generated; edit outside these markers) -->"
MARK_END = "<!-- flopscope-validate:end -->"

ProgressFn = Callable[[str], None]


@dataclass
class ModelResult:
    """One model's counted and measured FLOPs.

    Attributes:
        name: torchvision model name.
        input_size: input height and width.
        dtype: dtype name.
        counted_flops: FLOPs counted by flopscope (``None`` if counting failed).
        counted_macs: MACs counted by flopscope.
        counted_by_segment: counted FLOPs per top-level module (``""`` = root's own ops).
        uncounted: ops without a rule and their call counts.
        measurement: the measurement (``None`` if it failed).
        error: what failed, if anything.
        seconds: wall time spent on this model.
    """

    name: str
    input_size: int
    dtype: str
    counted_flops: int | None = None
    counted_macs: int | None = None
    counted_by_segment: dict[str, int] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)
    measurement: Measurement | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def comparison(self) -> Comparison | None:
        """Counted vs measured, when both exist."""
        if self.measurement is None or self.counted_flops is None:
            return None
        return self.measurement.compare(self.counted_flops, self.counted_by_segment)


def counted_segments(report: Any, model: Any, depth: int = 1) -> dict[str, int]:
    """Counted FLOPs per segment module of ``model`` (see ``segment_modules``), and ``""`` for
    everything outside them.

    Args:
        report: a :class:`flopscope.Report` of one forward of ``model``.
        model: the model.
        depth: module depth of the split (1 = top-level children).

    Returns:
        Inclusive FLOPs per segment module path; ``""`` is the rest of the total.
    """
    from flopscope.measure.workload import segment_modules

    stats = report.by_module()
    out: dict[str, int] = {}
    for path, _module in segment_modules(model, depth):
        if path in stats:
            out[path] = int(stats[path].inclusive.flops)
    out[""] = int(report.flops) - sum(out.values())
    return out


def _count(
    name: str, dtype: str, input_size: int, depth: int = 1
) -> tuple[int, int, dict[str, int], dict[str, int]]:
    import flopscope
    from flopscope.measure.workload import resolve_source

    model, inputs = resolve_source(f"torchvision:{name}", dtype=dtype, input_size=input_size)
    import torch

    with torch.no_grad():
        report = flopscope.count(model, *inputs, warn=False)
    return (
        int(report.flops),
        int(report.macs),
        counted_segments(report, model, depth),
        dict(report.uncounted),
    )


def _prefixed(say: ProgressFn, prefix: str) -> ProgressFn:
    def inner(msg: str) -> None:
        say(prefix + msg)

    return inner


def run_validation(
    models: Sequence[str],
    *,
    dtype: str = "float64",
    input_size: int = 224,
    backend: str = "auto",
    depth: int = 1,
    progress: ProgressFn | None = None,
    measure_fn: Callable[..., Measurement] | None = None,
) -> list[ModelResult]:
    """Count and measure each model; failures are recorded, not raised.

    Args:
        models: torchvision model names.
        dtype: dtype of weights and inputs.
        input_size: input height and width.
        backend: measurement backend (``auto``, ``perf``, ``papi``, ``valgrind``).
        depth: module depth of the per-module comparison (1 = top-level children).
        progress: stage messages (model name, stage, elapsed seconds).
        measure_fn: replaces :func:`flopscope.measure.measure_source` (for tests).

    Returns:
        One result per model, in order.
    """
    from flopscope.measure import measure_source

    measure_one = measure_fn or measure_source
    results: list[ModelResult] = []
    t_all = time.perf_counter()
    for i, name in enumerate(models, 1):
        t0 = time.perf_counter()
        res = ModelResult(name, input_size, dtype)

        def say(msg: str, _name: str = name, _i: int = i, _t0: float = t0) -> None:
            if progress is not None:
                progress(
                    f"[{_i}/{len(models)} {_name}] {msg} "
                    f"(model {time.perf_counter() - _t0:.0f} s, "
                    f"total {time.perf_counter() - t_all:.0f} s)"
                )

        try:
            say("counting")
            res.counted_flops, res.counted_macs, res.counted_by_segment, res.uncounted = _count(
                name, dtype, input_size, depth
            )
            say(f"counted {res.counted_flops:,} FLOPs; measuring")
            res.measurement = measure_one(
                f"torchvision:{name}",
                dtype=dtype,
                input_size=input_size,
                backend=backend,
                valgrind=ValgrindOptions(segment_depth=depth),
                progress=_prefixed(say, "measure: "),
            )
            cmp = res.comparison
            assert cmp is not None
            say(f"measured {res.measurement.flops:,} FLOPs, measured/counted = {cmp.ratio:.4f}")
        except (MeasureError, Exception) as exc:  # noqa: BLE001 - one model's failure is data
            res.error = f"{type(exc).__name__}: {exc}"
            say(f"FAILED: {res.error}")
        res.seconds = time.perf_counter() - t0
        results.append(res)
    return results


def _fmt(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def render_table(results: Sequence[ModelResult]) -> str:
    """A fixed-width text table of the results.

    Args:
        results: the results.

    Returns:
        The table (one line per model).
    """
    head = (
        f"{'model':<16} {'input':>7} {'counted FLOPs':>17} {'measured FLOPs':>17} "
        f"{'measured/counted':>16} {'time':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        cmp = r.comparison
        ratio = f"{cmp.ratio:.4f}" if cmp is not None else "FAILED"
        lines.append(
            f"{r.name:<16} {r.input_size:>4}px {_fmt(r.counted_flops):>17} "
            f"{_fmt(r.measurement.flops if r.measurement else None):>17} {ratio:>16} "
            f"{r.seconds:>6.0f}s"
        )
        if r.error:
            lines.append(f"    error: {r.error.splitlines()[0]}")
    return "\n".join(lines)


def write_csv(results: Sequence[ModelResult], path: Path) -> None:
    """Write one row per model.

    Args:
        results: the results.
        path: destination CSV file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "model",
                "dtype",
                "input_size",
                "counted_macs",
                "counted_flops",
                "measured_flops",
                "measured_double",
                "measured_single",
                "ratio",
                "backend",
                "region_seconds",
                "seconds",
                "error",
            ]
        )
        for r in results:
            m = r.measurement
            cmp = r.comparison
            w.writerow(
                [
                    r.name,
                    r.dtype,
                    r.input_size,
                    r.counted_macs,
                    r.counted_flops,
                    m.flops if m else "",
                    m.flops_by_precision.get("double", 0) if m else "",
                    m.flops_by_precision.get("single", 0) if m else "",
                    f"{cmp.ratio:.6f}" if cmp else "",
                    m.backend if m else "",
                    f"{m.region_seconds:.1f}" if m else "",
                    f"{r.seconds:.1f}",
                    r.error or "",
                ]
            )


def write_plot(results: Sequence[ModelResult], path: Path, title: str) -> str | None:
    """Scatter counted vs measured FLOPs on log-log axes with the line y = x.

    Args:
        results: the results (failed models are left out).
        path: destination image (PNG).
        title: plot title.

    Returns:
        ``None`` on success, else why no plot was written (matplotlib missing, no data).
    """
    points = [
        (r.name, r.counted_flops, r.measurement.flops)
        for r in results
        if r.measurement is not None and r.counted_flops
    ]
    if not points:
        return "no model was both counted and measured"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'flopscope[plot]')"
    fig, ax = plt.subplots(figsize=(6, 5.5))
    xs = [p[1] for p in points]
    ys = [p[2] for p in points]
    lo = 10 ** math.floor(math.log10(min(xs + ys) / 1.5))
    hi = 10 ** math.ceil(math.log10(max(xs + ys) * 1.5))
    ax.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1, label="y = x")
    ax.scatter(xs, ys, zorder=3)
    for name, x, y in points:
        ax.annotate(
            f"{name} ({y / x:.3f})", (x, y), textcoords="offset points", xytext=(6, -10), fontsize=8
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("counted FLOPs (flopscope)")
    ax.set_ylabel("measured FLOPs (executed instructions)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left")
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _segment_section(r: ModelResult) -> list[str]:
    cmp = r.comparison
    if cmp is None or not cmp.segments:
        return []
    lines = [f"**{r.name}** per module ((outside) = code outside the listed modules):", ""]
    if r.measurement is not None:
        extra = [n for n in r.measurement.notes if _per_model(n)]
        lines += [f"- {n}" for n in extra] + ([""] if extra else [])
    lines += [
        "| module | counted FLOPs | measured FLOPs | measured/counted | share of gap |",
        "|---|---:|---:|---:|---:|",
    ]
    gap = cmp.measured_flops - cmp.counted_flops
    for s in cmp.segments:
        share = f"{s.difference / gap:.0%}" if gap else "-"
        ratio = f"{s.ratio:.4f}" if s.counted_flops else ("-" if not s.measured_flops else "n/a")
        lines.append(
            f"| {f'`{s.path}`' if s.path else '(outside)'} | {s.counted_flops:,} | "
            f"{s.measured_flops:,} | {ratio} | {share} |"
        )
    lines.append("")
    return lines


_PER_MODEL_NOTES = ("valgrind/callgrind:", "counters were multiplexed", "could not be read")


def _per_model(note: str) -> bool:
    return any(marker in note for marker in _PER_MODEL_NOTES)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def results_markdown(
    results: Sequence[ModelResult], *, command: str, plot_name: str | None, csv_name: str
) -> str:
    """The generated part of the validation page.

    Args:
        results: the results.
        command: the command that produced them.
        plot_name: plot path relative to the page (``None`` if no plot).
        csv_name: CSV path relative to the page.

    Returns:
        Markdown text.
    """
    first = next((r.measurement for r in results if r.measurement is not None), None)
    lines = [
        "",
        f"Generated by `{command}`",
        "",
        f"Machine: {platform.machine()}, {_cpu_name()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}. " + (f"Backend: {first.backend}." if first else ""),
        "",
    ]
    if first is not None:
        shared = [n for n in first.notes if not _per_model(n)]
        lines += [f"- {n}" for n in shared] + [""]
    lines += [
        (
            "| model | input | counted MACs | counted FLOPs | measured FLOPs | measured/counted |"
            " measured region | total time |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cmp = r.comparison
        ratio = f"**{cmp.ratio:.4f}**" if cmp else "failed"
        region = f"{r.measurement.region_seconds:.1f} s" if r.measurement else "-"
        lines.append(
            f"| {r.name} | {r.input_size}x{r.input_size} | {_fmt(r.counted_macs)} | "
            f"{_fmt(r.counted_flops)} | {_fmt(r.measurement.flops if r.measurement else None)} | "
            f"{ratio} | {region} | {r.seconds:.0f} s |"
        )
    lines.append("")
    failed = [r for r in results if r.error]
    for r in failed:
        lines.append(f"- **{r.name} failed**: `{r.error}`")
    if failed:
        lines.append("")
    if plot_name:
        lines += [f"![counted vs measured FLOPs, log-log, with y = x]({plot_name})", ""]
    lines += [f"Raw numbers: [{csv_name}]({csv_name}).", ""]
    for r in results:
        lines += _segment_section(r)
    return "\n".join(lines)


def update_markdown(path: Path, generated: str, title: str) -> None:
    """Replace the generated section of ``path`` (between markers), keeping the rest.

    Args:
        path: the Markdown page (created if missing).
        generated: the generated Markdown.
        title: page title used when the page is created.
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
