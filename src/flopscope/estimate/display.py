"""How estimates show themselves: the report sections of a roofline estimate and of a memory
profile (table columns, summary lines, JSON), and the roofline plot.

The edge of the estimate package, as :mod:`flopscope.render` is for reports: units appear only
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flopscope.estimate.bound import Estimate, Row
from flopscope.estimate.memory import MemoryProfile
from flopscope.estimate.profile import Hardware
from flopscope.estimate.regime import of_calibration, validation_words
from flopscope.render.units import human, human_bytes
from flopscope.report.sections import Column

__all__ = ["EstimateSection", "MemorySection", "estimate_columns", "estimate_lines",
           "human_seconds", "memory_lines", "plot_roofline", "prediction_lines"]


def human_seconds(seconds: float) -> str:
    """``1.5e-05`` -> ``"15.0 us"``; ``0`` -> ``"0"``.

    Args:
        seconds: a duration.

    Returns:
        The duration with a unit between ns and s.
    """
    if seconds == 0:
        return "0"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return f"{seconds / scale:,.3g} {unit}"
    return f"{seconds / 1e-9:,.3g} ns"


def _intensity(row: Row) -> str:
    value = row.intensity
    return "-" if value is None else f"{value:,.1f}"


def estimate_columns(estimate: Estimate) -> list[Column]:
    """The table columns of a roofline estimate: intensity (FLOP/B), estimated time, time share,
    and the bound.

    Args:
        estimate: the estimate.

    Returns:
        Columns of the report's tables.
    """
    def cells(table: dict[str, Row], fn: object) -> dict[str, str]:
        return {k: fn(r) for k, r in table.items()}  # type: ignore[operator]

    def share(row: Row) -> str:
        return f"{100 * estimate.share(row):.1f}%"

    total = estimate.total
    return [
        Column("FLOP/B", cells(estimate.by_module, _intensity), cells(estimate.by_op, _intensity),
               _intensity(total)),
        Column("est. time", cells(estimate.by_module, lambda r: human_seconds(r.time_s)),
               cells(estimate.by_op, lambda r: human_seconds(r.time_s)),
               human_seconds(total.time_s)),
        *([Column("predicted", cells(estimate.by_module, lambda r: human_seconds(r.predicted_s)),
                  cells(estimate.by_op, lambda r: human_seconds(r.predicted_s)),
                  human_seconds(total.predicted_s))] if estimate.calibrated else []),
        Column("time share", cells(estimate.by_module, share), cells(estimate.by_op, share),
               share(total)),
        Column("bound", cells(estimate.by_module, lambda r: r.bound),
               cells(estimate.by_op, lambda r: r.bound), total.bound),
    ]


def _describe(hw: Hardware) -> str:
    what = "measured" if hw.measured else "datasheet"
    return f"{hw.description or hw.name} ({what})"



def _tf32_words(estimate: Estimate) -> str:
    """Which float32 work the estimate took as TF32 (only where the machine has TF32 units)."""
    if "tf32" not in estimate.hardware.matrix:
        return ""
    if estimate.tf32 and estimate.tf32_convolution:
        return ", float32 products and convolutions as TF32"
    if estimate.tf32:
        return ", float32 products as TF32"
    return ", float32 convolutions as TF32 (cuDNN's default)" if estimate.tf32_convolution else ""

def estimate_lines(estimate: Estimate) -> list[str]:
    """A few lines that say what the estimate is and its range.

    Args:
        estimate: the estimate.

    Returns:
        Lines of text.
    """
    hw = estimate.hardware
    total = estimate.total
    lines = [
        f"roofline on {hw.name}: {_describe(hw)}, {human(int(hw.memory_bandwidth), 'B/s')}"
        + (f" (writes {human(int(hw.write_bandwidth), 'B/s')})" if hw.write_bandwidth else "")
        + _tf32_words(estimate),
        f"  estimated time (lower bound) {human_seconds(total.time_s)}; with element-wise chains "
        f"fused {human_seconds(total.fused_time_s)}; {total.bound}-bound overall "
        f"(compute-bound calls {human_seconds(total.compute_bound_s)}, memory-bound "
        f"{human_seconds(total.memory_bound_s)})",
    ]
    if len(estimate.by_phase) > 1:
        lines.append("  " + "; ".join(
            f"{phase}: {human_seconds(r.time_s)}"
            + (f" (predicted {human_seconds(r.predicted_s)})" if estimate.calibrated else "")
            for phase, r in estimate.by_phase.items()))
    if hw.has_cache:
        assert hw.cache_bytes is not None and hw.cache_bandwidth is not None
        lines.append(f"  last-level cache {human_bytes(hw.cache_bytes)} at "
                     f"{human(int(hw.cache_bandwidth), 'B/s')}: {human_bytes(total.dram_bytes)} of "
                     f"{human_bytes(total.bytes)} from main memory")
        caches = "caches above the last level"
    else:
        caches = "caches"
    lines.append(f"  ignores kernel launch, {caches}, fusion (see the fused figure), clocks below "
                 "peak: real time is longer")
    return lines + prediction_lines(estimate)


def prediction_lines(estimate: Estimate) -> list[str]:
    """What the estimate predicts beside its bound (:mod:`flopscope.estimate.predict`): the
    predicted time marked with its calibration's date, its host and device parts, whether the
    run is host-bound, and the error bars per family; ``uncalibrated`` without calibration data.

    Args:
        estimate: the estimate.

    Returns:
        Lines of text.
    """
    from flopscope.estimate.bound import HOST_BOUND_ADVICE

    cal = estimate.hardware.calibration
    if cal is None:
        return ["  prediction: uncalibrated (the profile has no calibration data; `flopscope "
                "calibrate --output FILE` writes one): the bound only"]
    total = estimate.total
    device = total.predicted_s - total.host_s
    lines = [f"  prediction ({cal.source()}): "
             f"{human_seconds(total.predicted_s)} = "
             f"host {human_seconds(total.host_s)} + device {human_seconds(device)} "
             "(per call: host time of its operator + work at the attained rate; "
             + ("one timeline on a CPU)" if estimate.overlapped is None else
                "summed over the calls)")]
    if estimate.overlapped is not None:
        step, idle = estimate.overlapped
        lines.append(f"  step with host and device overlapping (each kernel starts once "
                     f"launched and once the one before is done): {human_seconds(step)}, the "
                     f"device idle {human_seconds(idle)} of it")
    import torch

    if torch.get_num_threads() != cal.threads and not cal.device.startswith("cuda"):
        lines.append(f"  note: calibrated with {cal.threads} thread(s), torch now uses "
                     f"{torch.get_num_threads()}: recalibrate with --threads for this setting")
    regime = of_calibration(cal)
    if regime is not None and regime["differs"]:
        lines.append(f"  warning: {regime['warning']}")
    if total.uncalibrated_s:
        lines.append(f"  {human_seconds(total.uncalibrated_s)} of it at the bound: families "
                     "without calibration points")
    if cal.error_bars:
        bars = ", ".join(f"{fam} +-{100 * err:.0f}%" for fam, err in cal.error_bars.items()
                         if fam in estimate.by_family or fam == "total")
        lines.append("  error bars (from the validation: 90th percentile of |predicted / measured "
                     f"- 1| over its models{validation_words(cal.validation)}): {bars or '-'}")
    else:
        lines.append("  error bars: none in the profile (not validated)")
    if total.host_s > device:
        ratio = f"{total.host_s / device:,.1f}x" if device > 0 else "all"
        lines.append(f"  {HOST_BOUND_ADVICE.split(':')[0]}: host {ratio} the device work; "
                     f"{HOST_BOUND_ADVICE.split(': ', 1)[1]}")
    else:
        share = total.host_s / total.predicted_s if total.predicted_s else 0.0
        lines.append(f"  not host-bound: host time {100 * share:.0f}% of the prediction")
    return lines


def memory_lines(profile: MemoryProfile) -> list[str]:
    """A few lines about peak memory.

    Args:
        profile: the memory profile.

    Returns:
        Lines of text.
    """
    where = f"'{profile.peak_module}'" if profile.peak_module else "the root"
    parts = ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in profile.at_peak.items())
    return [
        f"peak memory {human_bytes(profile.peak_bytes)} ({profile.note}), reached in "
        f"{profile.peak_phase} at {where} ({profile.peak_op})",
        f"  live at the peak: {parts}",
        "  tensor storages only: no allocator rounding or caching, kernel workspaces or CUDA "
        "context",
    ]


@dataclass(frozen=True)
class EstimateSection:
    """A roofline estimate as a report section: ``"estimate"`` in JSON, its columns (intensity,
    estimated time, time share, bound) and its lines (the hardware, the lower bound).

    Attributes:
        estimate: the estimate.
    """

    estimate: Estimate
    key: str = "estimate"

    def to_dict(self) -> Any:
        """The estimate's JSON form."""
        return self.estimate.to_dict()

    def columns(self) -> Sequence[Column]:
        """See :func:`estimate_columns`."""
        return estimate_columns(self.estimate)

    def lines(self) -> Sequence[str]:
        """See :func:`estimate_lines`."""
        return estimate_lines(self.estimate)


@dataclass(frozen=True)
class MemorySection:
    """A memory profile as a report section: ``"memory"`` in JSON and its lines.

    Attributes:
        profile: the profile.
    """

    profile: MemoryProfile
    key: str = "memory"

    def to_dict(self) -> Any:
        """The profile's JSON form."""
        return self.profile.to_dict()

    def columns(self) -> Sequence[Column]:
        """None."""
        return ()

    def lines(self) -> Sequence[str]:
        """See :func:`memory_lines`."""
        return memory_lines(self.profile)


def plot_roofline(estimate: Estimate, path: str | Path, *, top: int = 40) -> None:
    """Write a roofline chart: each operator (per dtype) as a point at (arithmetic intensity,
    attained FLOP/s under the estimate), its size by share of time; the roofs of the dtypes
    that appear (matrix and vector peaks, memory bandwidth) drawn as lines.

    Args:
        estimate: the estimate.
        path: a .png, .svg or .pdf file.
        top: how many operators (by time) to draw and label.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from flopscope.render.plot import require_matplotlib

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hw = estimate.hardware
    points = sorted(((op, key, r) for (op, key), r in estimate.by_op_dtype.items()
                     if r.flops and r.bytes and r.time_s),
                    key=lambda p: -p[2].time_s)[:top]
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    xs = [r.intensity or 0.0 for _, _, r in points]
    lo = min([*xs, 0.01]) / 2
    hi = max([*xs, 1e3]) * 2
    bw = hw.memory_bandwidth
    keys = sorted({key for _, key, _ in points}) or ["fp32"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for i, key in enumerate(keys):
        colour = colours[i % len(colours)]
        mkey = "tf32" if key == "fp32" and estimate.tf32 else key
        matrix, vector = hw.peak(mkey, True), hw.peak(key, False)
        which = "matrix roof" if vector != matrix else "roof"
        ax.plot(grid, [min(matrix, bw * x) for x in grid], color=colour, lw=1.5,
                label=f"{mkey} {which} {human(int(matrix), 'FLOP/s')}")
        if vector != matrix:
            ax.plot(grid, [min(vector, bw * x) for x in grid], color=colour, lw=1, ls="--",
                    label=f"{key} vector roof {human(int(vector), 'FLOP/s')}")
    share_total = estimate.total.time_s or 1.0
    for _, key, r in points:
        colour = colours[keys.index(key) % len(colours)]
        size = 20 + 2000 * r.time_s / share_total
        ax.scatter([r.intensity or 0.0], [r.attained_flops_per_s], s=size, color=colour, alpha=0.5,
                   edgecolors="black", linewidths=0.5)
    for op, _, r in points[:10]:
        short = op.removeprefix("aten.").removesuffix(".default")
        ax.annotate(short, (r.intensity or 0.0, r.attained_flops_per_s), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attained FLOP/s under the roofline (upper bound)")
    kind = "measured" if hw.measured else "datasheet peaks"
    ax.set_title(f"roofline on {hw.name} ({kind}, {human(int(bw), 'B/s')}); "
                 f"point area = share of estimated time", fontsize=9)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(str(path))
    plt.close(fig)
