"""The machine's regime: the cost of a parallel region, at calibration and now (docs/prediction.md,
rounds 10-11).

On this machine a process runs in one of two regimes, fixed for the process: at 2 threads its
forwards took 1.3-1.4x longer in the slow one (1.05-1.17x at 1 thread), and the cost of a
parallel region marks it: an ``add`` of 2^16 float32 elements into a kept output took about 6 us
in a fast process and 7.6-8 us in a slow one (round 10, 2 threads). A calibration measures it
(:attr:`Calibration.parallel_add_s <flopscope.estimate.calibration.Calibration.parallel_add_s>`);
a prediction measures it again in its own process (:func:`now`, once per process and thread
count) and says when the two differ by more than :data:`TOLERANCE` (:func:`check`): the
prediction was calibrated in the other regime, and its error bar is the validation's for that
case where the validation measured one.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from flopscope.estimate.calibration import Calibration

__all__ = ["ELEMENTS", "TOLERANCE", "check", "now", "of_calibration", "parallel_add_s",
           "validation_words"]

ELEMENTS = 1 << 16
"""Elements of the probe's ``add`` (float32: 256 KiB per operand, in the caches)."""

TOLERANCE = 0.15
"""How far apart (relative) the probe's times may be and still be one regime: the two regimes
measured were 27-33% apart (6 against 7.6-8 us), one regime's probes within about 10%."""

_SEEN: dict[int, float] = {}


def parallel_add_s(batches: int = 7, calls: int = 500) -> float:
    """Seconds per call of an ``add`` of :data:`ELEMENTS` float32 elements into a kept output,
    in a loop: the median of ``batches`` batches of ``calls`` calls, after 100 unmeasured ones
    (at more than one thread, a parallel region with little work: mostly the threads' fork and
    join; at one, the add itself).

    Args:
        batches: timed batches.
        calls: calls per batch.

    Returns:
        Seconds per call (wall time).
    """
    x, y, out = torch.randn(ELEMENTS), torch.randn(ELEMENTS), torch.empty(ELEMENTS)
    for _ in range(100):
        torch.add(x, y, out=out)
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            torch.add(x, y, out=out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def now() -> float:
    """:func:`parallel_add_s` in this process at torch's thread count now, measured once per
    process and thread count (the regime is the process's)."""
    threads = torch.get_num_threads()
    if threads not in _SEEN:
        _SEEN[threads] = parallel_add_s()
    return _SEEN[threads]


def check(calibrated_s: float, now_s: float,
          error_bars: dict[str, float] | None = None) -> dict[str, Any]:
    """Whether a process whose probe took ``now_s`` runs in the regime of a calibration whose
    probe took ``calibrated_s``.

    Args:
        calibrated_s: the calibration's :func:`parallel_add_s`.
        now_s: this process's.
        error_bars: the validation's 90th-percentile errors of whole models with the regime as
            calibrated and differing (``"as calibrated"``, ``"differs"``), where it split them.

    Returns:
        ``{"calibration_parallel_add_s", "parallel_add_s", "ratio", "differs"}``, and where it
        differs a ``"warning"`` (with the validation's error bar for that case where given).
    """
    ratio = now_s / calibrated_s
    differs = abs(ratio - 1) > TOLERANCE
    out: dict[str, Any] = {"calibration_parallel_add_s": calibrated_s, "parallel_add_s": now_s,
                           "ratio": ratio, "differs": differs}
    if differs:
        slower = "slower" if ratio > 1 else "faster"
        bar = (error_bars or {}).get("differs")
        out["warning"] = (
            f"this process runs in another regime than the calibration's: a parallel region "
            f"(an add of 2^16 elements) takes {now_s * 1e6:.1f} us here against "
            f"{calibrated_s * 1e6:.1f} us when calibrated ({ratio:.2f}x, {slower}); whole "
            "models ran 1.3-1.4x apart between the regimes at 2 threads"
            + (f"; the validation's error bar with the regime differing: +-{100 * bar:.0f}%"
               if bar is not None else "")
            + "; recalibrate in this process's regime for the calibrated error bar")
    return out


def of_calibration(cal: Calibration) -> dict[str, Any] | None:
    """:func:`check` of this process against a CPU calibration that measured its regime, at
    its thread count (``None``: a GPU's, a reference's, one without the probe, one at 1 thread,
    or torch now at another thread count, which the prediction notes apart). At 1 thread the
    probe is a serial add, not a parallel region: its spread (9-13 us in round 11's runs) is
    the load, not a regime, so it warns of nothing."""
    if (not cal.parallel_add_s or cal.reference or cal.device.startswith("cuda")
            or cal.threads < 2 or torch.get_num_threads() != cal.threads):
        return None
    split = cal.validation.get("p90_by_regime", {})
    return check(cal.parallel_add_s, now(), dict(split) if isinstance(split, dict) else None)


def validation_words(validation: Any) -> str:
    """``, validated DATE at THREADS thread(s), load LO-HI, N models`` from a calibration's
    :attr:`~flopscope.estimate.calibration.Calibration.validation` (empty where not recorded)."""
    if not validation or not isinstance(validation, dict):
        return ""
    if "runs" in validation:  # a GPU check's (benchmarks/gpu_profile.py): its runs of the cases
        runs = validation["runs"]
        where = (f"{runs} run(s) of the GPU check, other sessions' machines among them"
                 if runs > 1 else "the GPU check's run")
        return f", validated on {validation.get('models', '?')} models and steps in {where}"
    load = validation.get("load", [])
    where = (f", load {min(load):.1f}-{max(load):.1f}" if isinstance(load, list) and load else "")
    return (f", validated {str(validation.get('date', '?'))[:16]} at "
            f"{validation.get('threads', '?')} thread(s){where}, "
            f"{validation.get('models', '?')} models")
