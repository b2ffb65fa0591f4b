"""Measure the floating-point operations a piece of code actually executes, and compare them with
flopscope's count.

Backends (each implements :class:`Backend`: is it available and why not; measure a workload):

* ``perf`` - hardware FP events via ``perf_event_open`` (Intel ``FP_ARITH_INST_RETIRED.*``, AMD
  ``RETIRED_SSE_AVX_FLOPS``), in process (:mod:`.perf`);
* ``papi`` - PAPI presets ``PAPI_DP_OPS`` / ``PAPI_SP_OPS``, in process (:mod:`.papi`);
* ``valgrind`` - no hardware counters needed: per-instruction execution counts from callgrind,
  instructions disassembled and classified, in a child process, per module (:mod:`.valgrind`);
* ``auto`` - the first available of perf, papi, valgrind (:mod:`.registry`);
* :class:`FakeBackend` - a test double for code above the backends.

A model given by a SOURCE string is built once, where the backend runs it, and counted there
(:func:`measure_request`, what ``flopscope measure`` calls)::

    from flopscope.measure import MeasureRequest, measure_request
    result = measure_request(MeasureRequest("torchvision:resnet18", dtype="float64"))
    result.ratio, result.comparison.segments, result.to_dict()

Any callable or model object (:func:`measure`, :func:`measure_model`)::

    m = measure_model(model, x, backend="auto")
    print(m.flops, m.flops_by_precision, m.notes)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from flopscope.errors import BackendUnavailableError, MeasureError
from flopscope.measure.backend import (
    Backend,
    FakeBackend,
    InProcessBackend,
    MeasuredRun,
    ProgressFn,
)
from flopscope.measure.classify import FpInstruction, Precision, classify
from flopscope.measure.registry import (
    BackendName,
    backend_named,
    backend_status,
    resolve_backend,
    select_backend,
)
from flopscope.measure.request import (
    MeasureRequest,
    MeasureResult,
    SourceWorkload,
    check_request,
    counted_segments,
    measure_request,
)
from flopscope.measure.result import Comparison, Measurement, SegmentComparison
from flopscope.measure.sweep import SweepEntry, measure_sources, render_sweep
from flopscope.measure.valgrind import ValgrindBackend, ValgrindOptions
from flopscope.measure.workload import CallableWorkload, Region, Workload, model_workload

__all__ = [
    "Backend",
    "BackendName",
    "BackendUnavailableError",
    "CallableWorkload",
    "Comparison",
    "FakeBackend",
    "FpInstruction",
    "InProcessBackend",
    "MeasureError",
    "MeasureRequest",
    "MeasureResult",
    "MeasuredRun",
    "Measurement",
    "Precision",
    "Region",
    "SegmentComparison",
    "SourceWorkload",
    "SweepEntry",
    "ValgrindBackend",
    "ValgrindOptions",
    "Workload",
    "backend_named",
    "backend_status",
    "check_request",
    "classify",
    "counted_segments",
    "measure",
    "measure_model",
    "measure_request",
    "measure_sources",
    "render_sweep",
    "resolve_backend",
    "select_backend",
]


def _backend_for(
    backend: Backend | BackendName | str, valgrind: ValgrindOptions | None
) -> tuple[Backend, str]:
    chosen, note = resolve_backend(backend)
    if valgrind is not None and isinstance(chosen, ValgrindBackend):
        chosen = ValgrindBackend(valgrind)
    return chosen, note


def measure(
    fn: Callable[..., object],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: Backend | BackendName | str = BackendName.AUTO,
    module: Any = None,
    valgrind: ValgrindOptions | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Measure the floating-point operations executed by ``fn(*args, **kwargs)``.

    Args:
        fn: the code to measure.  For the valgrind backend it runs in a child process, so ``fn``
            and its arguments must be picklable (a module-level function, an ``nn.Module``).
        args: positional arguments.
        kwargs: keyword arguments.
        backend: ``auto``, ``perf``, ``papi``, ``valgrind`` or a :class:`Backend` object.
        module: a model whose modules split the valgrind result per module.
        valgrind: options of the valgrind backend.
        progress: called with a message at each stage (valgrind runs take minutes).

    Returns:
        The measurement; its first note names the backend and why others were not used.

    Raises:
        UsageError: for an unknown backend.
        BackendUnavailableError: if the backend cannot run here.
        MeasureError: if the measurement fails.
    """
    chosen, note = _backend_for(backend, valgrind)
    workload = CallableWorkload(fn, tuple(args), dict(kwargs or {}), module)
    m = chosen.measure(workload, progress=progress).measurement
    return replace(m, notes=(note, *m.notes))


def measure_model(
    model: Any,
    *inputs: Any,
    backend: Backend | BackendName | str = BackendName.AUTO,
    valgrind: ValgrindOptions | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Measure one forward pass ``model(*inputs)`` under ``torch.no_grad()``.

    Args:
        model: an ``nn.Module`` (picklable, for the valgrind backend).
        *inputs: its positional inputs.
        backend: ``auto``, ``perf``, ``papi``, ``valgrind`` or a :class:`Backend` object.
        valgrind: options of the valgrind backend.
        progress: stage messages.

    Returns:
        The measurement, per top-level module with the valgrind backend.

    Raises:
        UsageError: for an unknown backend.
        BackendUnavailableError: if the backend cannot run here.
        MeasureError: if the measurement fails.
    """
    chosen, note = _backend_for(backend, valgrind)
    m = chosen.measure(model_workload(model, inputs), progress=progress).measurement
    return replace(m, notes=(note, *m.notes))
