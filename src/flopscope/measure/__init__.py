"""Measure the floating-point operations a piece of code actually executes.

Backends (:class:`Backend`):

* ``perf`` - hardware FP events via ``perf_event_open`` (Intel ``FP_ARITH_INST_RETIRED.*``, AMD
  ``RETIRED_SSE_AVX_FLOPS``), in process;
* ``papi`` - PAPI presets ``PAPI_DP_OPS`` / ``PAPI_SP_OPS``, in process;
* ``valgrind`` - no hardware counters needed: per-instruction execution counts from callgrind,
  instructions disassembled and classified; runs the workload in a child process, per top-level
  module;
* ``auto`` - the first available of perf, papi, valgrind.

Example::

    from flopscope.measure import measure_model
    m = measure_model(model, x, backend="auto")
    print(m.flops, m.flops_by_precision, m.notes)
"""

from __future__ import annotations

import enum
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flopscope.errors import BackendUnavailableError, MeasureError, UsageError
from flopscope.measure import papi as _papi
from flopscope.measure import perf as _perf
from flopscope.measure import valgrind as _valgrind
from flopscope.measure.classify import FpInstruction, Precision, classify
from flopscope.measure.result import Comparison, Measurement, SegmentComparison
from flopscope.measure.valgrind import ValgrindOptions
from flopscope.measure.workload import (
    WorkloadSpec,
    build_model_workload,
    resolve_source,
    write_pickled,
)

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "Comparison",
    "FpInstruction",
    "MeasureError",
    "Measurement",
    "Precision",
    "SegmentComparison",
    "ValgrindOptions",
    "backend_status",
    "classify",
    "measure",
    "measure_model",
    "measure_source",
    "resolve_source",
    "select_backend",
]

ProgressFn = Callable[[str], None]


class Backend(str, enum.Enum):
    """A measurement backend."""

    AUTO = "auto"
    PERF = "perf"
    PAPI = "papi"
    VALGRIND = "valgrind"


_ORDER = (Backend.PERF, Backend.PAPI, Backend.VALGRIND)


def _to_backend(value: Backend | str) -> Backend:
    try:
        return Backend(value)
    except ValueError:
        names = ", ".join(b.value for b in Backend)
        raise UsageError(f"unknown measurement backend {value!r}; choose one of {names}") from None


def backend_status() -> dict[Backend, str | None]:
    """Whether each backend can run here.

    Returns:
        For perf, papi and valgrind: ``None`` if available, else why not.
    """
    return {
        Backend.PERF: _perf.unavailable_reason(),
        Backend.PAPI: _papi.unavailable_reason(),
        Backend.VALGRIND: _valgrind.unavailable_reason(),
    }


def select_backend(requested: Backend | str = Backend.AUTO) -> tuple[Backend, dict[Backend, str]]:
    """Choose the backend to use.

    Args:
        requested: a backend, or ``auto`` for the first available of perf, papi, valgrind.

    Returns:
        ``(backend, reasons)``: the backend chosen and, for each backend that is unavailable,
        why.

    Raises:
        UsageError: for an unknown backend name.
        BackendUnavailableError: if the requested backend (or, for auto, every backend) is
            unavailable; the message gives the reasons.
    """
    want = _to_backend(requested)
    status = backend_status()
    reasons = {b: r for b, r in status.items() if r is not None}
    if want is not Backend.AUTO:
        if want in reasons:
            raise BackendUnavailableError(f"backend {want.value} is unavailable: {reasons[want]}")
        return want, reasons
    for b in _ORDER:
        if b not in reasons:
            return b, reasons
    lines = "; ".join(f"{b.value}: {r}" for b, r in reasons.items())
    raise BackendUnavailableError(f"no measurement backend is available ({lines})")


def _auto_note(backend: Backend, reasons: Mapping[Backend, str]) -> str:
    others = "; ".join(f"{b.value} unavailable: {r}" for b, r in reasons.items())
    return f"backend {backend.value}" + (f" ({others})" if others else "")


def _with_note(m: Measurement, note: str) -> Measurement:
    return Measurement(
        m.backend,
        m.flops,
        m.flops_by_precision,
        m.segments,
        m.by_instruction,
        m.region_seconds,
        m.wall_seconds,
        (note, *m.notes),
    )


def measure(
    fn: Callable[..., object],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: Backend | str = Backend.AUTO,
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
        backend: ``auto``, ``perf``, ``papi`` or ``valgrind``.
        module: a model whose top-level children split the valgrind result per module.
        valgrind: options of the valgrind backend.
        progress: called with a message at each stage (valgrind runs take minutes).

    Returns:
        The measurement; its first note names the backend and why others were not used.

    Raises:
        UsageError: for an unknown backend.
        BackendUnavailableError: if the backend cannot run here.
        MeasureError: if the measurement fails.
    """
    kw = dict(kwargs or {})
    chosen, reasons = select_backend(backend)
    note = _auto_note(chosen, reasons)
    if chosen is Backend.VALGRIND:
        with tempfile.TemporaryDirectory(prefix="flopscope-workload-") as tmp:
            path = Path(tmp) / "workload.pkl"
            write_pickled(path, fn, args, kw, module)
            m = _valgrind.measure_valgrind(WorkloadSpec(pickle_path=str(path)), valgrind, progress)
        return _with_note(m, note)

    def region() -> object:
        return fn(*args, **kw)

    m = _perf.measure_perf(region) if chosen is Backend.PERF else _papi.measure_papi(region)
    return _with_note(m, note)


def measure_model(
    model: Any,
    *inputs: Any,
    backend: Backend | str = Backend.AUTO,
    valgrind: ValgrindOptions | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Measure one forward pass ``model(*inputs)`` under ``torch.no_grad()``.

    Args:
        model: an ``nn.Module`` (picklable, for the valgrind backend).
        *inputs: its positional inputs.
        backend: ``auto``, ``perf``, ``papi`` or ``valgrind``.
        valgrind: options of the valgrind backend.
        progress: stage messages.

    Returns:
        The measurement, per top-level module with the valgrind backend.

    Raises:
        UsageError: for an unknown backend.
        BackendUnavailableError: if the backend cannot run here.
        MeasureError: if the measurement fails.
    """
    import torch

    chosen, _ = select_backend(backend)
    if chosen is Backend.VALGRIND:
        return measure(
            torch.nn.Module.__call__,
            (model, *inputs),
            backend=backend,
            module=model,
            valgrind=valgrind,
            progress=progress,
        )
    workload = build_model_workload(model, tuple(inputs))
    return measure(workload.run, backend=backend, progress=progress)


def measure_source(
    source: str,
    *,
    dtype: str = "float32",
    input_size: int = 224,
    batch_size: int = 1,
    backend: Backend | str = Backend.AUTO,
    valgrind: ValgrindOptions | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Measure one forward pass of a model given by name (``torchvision:resnet18``).

    The model is built with random weights (seed 0) by :func:`resolve_source`; with the valgrind
    backend it is built inside the child process, so large models need not be pickled.

    Args:
        source: model source name.
        dtype: ``float64``, ``float32``, ...
        input_size: image height and width.
        batch_size: batch size.
        backend: ``auto``, ``perf``, ``papi`` or ``valgrind``.
        valgrind: options of the valgrind backend.
        progress: stage messages.

    Returns:
        The measurement.

    Raises:
        UsageError: for an unknown backend.
        BackendUnavailableError: if the backend cannot run here.
        MeasureError: if the model cannot be built or the measurement fails.
    """
    chosen, reasons = select_backend(backend)
    build = {"source": source, "dtype": dtype, "input_size": input_size, "batch_size": batch_size}
    if chosen is Backend.VALGRIND:
        spec = WorkloadSpec(
            factory="flopscope.measure.workload:source_workload", factory_kwargs=build
        )
        m = _valgrind.measure_valgrind(spec, valgrind, progress)
        return _with_note(m, _auto_note(chosen, reasons))
    model, inputs = resolve_source(
        source, dtype=dtype, input_size=input_size, batch_size=batch_size
    )
    return measure_model(model, *inputs, backend=chosen, progress=progress)
