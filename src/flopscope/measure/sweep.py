"""Measure a list of models, keeping going when one fails: what ``flopscope validate`` runs.

A failure (a model that cannot be built, a measurement that breaks) is recorded in its
:class:`SweepEntry` and the sweep goes on; ``on_entry`` sees each entry as soon as it is done, so
a caller can save partial results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flopscope.errors import FlopscopeError
from flopscope.measure.backend import Backend, ProgressFn
from flopscope.measure.registry import BackendName
from flopscope.measure.request import MeasureRequest, MeasureResult, measure_request

__all__ = ["SweepEntry", "measure_sources", "render_sweep"]


@dataclass(frozen=True)
class SweepEntry:
    """One model of a sweep.

    Attributes:
        request: what was asked.
        result: counted vs measured (``None`` if it failed).
        error: ``"ErrorType: message"`` if it failed.
        seconds: wall time spent on this model.
    """

    request: MeasureRequest
    result: MeasureResult | None = None
    error: str | None = None
    seconds: float = 0.0

    def within(self, tolerance: float) -> bool:
        """Whether it was measured and measured/counted is within ``tolerance``.

        Args:
            tolerance: allowed relative difference (``0.03`` = 3 %).

        Returns:
            False for a failed entry.
        """
        return self.result is not None and self.result.within(tolerance)


def measure_sources(
    requests: Sequence[MeasureRequest],
    *,
    backend: Backend | BackendName | str = BackendName.AUTO,
    progress: ProgressFn | None = None,
    on_entry: Callable[[SweepEntry], None] | None = None,
) -> list[SweepEntry]:
    """Count and measure each request in turn; failures are recorded, not raised.

    Args:
        requests: the models.
        backend: a backend object or name (resolved once, for every model).
        progress: stage messages, prefixed with ``[i/n SOURCE]``.
        on_entry: called with each entry when it is done (to save partial results).

    Returns:
        One entry per request, in order.

    Raises:
        UsageError: an unknown backend name.
        BackendUnavailableError: the backend cannot run here.
    """
    from flopscope.measure.registry import resolve_backend

    chosen, note = resolve_backend(backend)
    if progress is not None:
        progress(note)
    entries: list[SweepEntry] = []
    for i, request in enumerate(requests, 1):
        t0 = time.perf_counter()

        def say(msg: str, _i: int = i, _src: str = request.source) -> None:
            if progress is not None:
                progress(f"[{_i}/{len(requests)} {_src}] {msg}")

        try:
            result = measure_request(request, backend=chosen, progress=say)
            entry = SweepEntry(request, result, None, time.perf_counter() - t0)
            say(f"measured/counted = {result.ratio:.4f}")
        except (FlopscopeError, Exception) as exc:  # noqa: BLE001 - one model's failure is data
            entry = SweepEntry(request, None, f"{type(exc).__name__}: {exc}",
                               time.perf_counter() - t0)
            say(f"FAILED: {entry.error}")
        entries.append(entry)
        if on_entry is not None:
            on_entry(entry)
    return entries


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def render_sweep(entries: Sequence[SweepEntry], tolerance: float | None = None) -> str:
    """A fixed-width text table: one line per model.

    Args:
        entries: the sweep.
        tolerance: if given, a last column says ``ok`` or ``OUTSIDE`` for each model.

    Returns:
        The table.
    """
    head = f"{'source':<32} {'counted FLOPs':>17} {'measured FLOPs':>17} {'measured/counted':>16}"
    head += f" {'time':>7}" + ("  check" if tolerance is not None else "")
    lines = [head, "-" * len(head)]
    for e in entries:
        r = e.result
        ratio = "FAILED" if r is None else (f"{r.ratio:.4f}" if r.comparison.counted_flops else "-")
        line = (
            f"{e.request.source:<32} {_n(r.comparison.counted_flops if r else None):>17} "
            f"{_n(r.comparison.measured_flops if r else None):>17} {ratio:>16} {e.seconds:>6.0f}s"
        )
        if tolerance is not None:
            line += "  " + ("ok" if e.within(tolerance) else "OUTSIDE" if r else "failed")
        lines.append(line)
        if e.error:
            lines.append(f"    error: {e.error.splitlines()[0]}")
    return "\n".join(lines) + "\n"
