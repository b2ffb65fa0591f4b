"""The ``papi`` backend: PAPI presets ``PAPI_DP_OPS`` and ``PAPI_SP_OPS``.

Needs the ``python-papi`` binding (``import pypapi``) and a PAPI library whose component for the
CPU is active.  PAPI's presets are already weighted by vector width (they are defined on top of
the same ``FP_ARITH_INST_RETIRED.*`` / ``RETIRED_SSE_AVX_FLOPS`` events as the ``perf`` backend),
so their counts are FLOPs.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Mapping
from typing import Any

from flopscope.errors import BackendUnavailableError, MeasureError
from flopscope.measure.backend import InProcessBackend
from flopscope.measure.result import Measurement

__all__ = ["PAPI_EVENTS", "PapiBackend", "measure_papi", "papi_flops", "unavailable_reason"]

PAPI_EVENTS = {"PAPI_DP_OPS": "double", "PAPI_SP_OPS": "single"}


def papi_flops(counts: Mapping[str, int]) -> dict[str, int]:
    """FLOPs per precision from PAPI preset counts.

    Args:
        counts: values per preset name (``PAPI_DP_OPS``, ``PAPI_SP_OPS``); absent presets are
            skipped.

    Returns:
        FLOPs per precision.
    """
    return {PAPI_EVENTS[name]: int(v) for name, v in counts.items() if name in PAPI_EVENTS}


def _binding() -> Any:
    from pypapi import events, papi_low  # type: ignore[import-not-found]

    return papi_low, events


def unavailable_reason() -> str | None:
    """Why the papi backend cannot run here.

    Returns:
        ``None`` if PAPI_DP_OPS can be added to an event set, else why not.
    """
    if importlib.util.find_spec("pypapi") is None:
        return "the PAPI Python binding is not installed (pip install python-papi)"
    try:
        papi, events = _binding()
        papi.library_init()
        evs = papi.create_eventset()
        try:
            papi.add_event(evs, events.PAPI_DP_OPS)
        finally:
            papi.cleanup_eventset(evs)
            papi.destroy_eventset(evs)
    except Exception as exc:  # noqa: BLE001 - the binding raises its own PapiError classes
        return f"PAPI cannot count PAPI_DP_OPS here: {exc}"
    return None


def measure_papi(fn: Callable[[], object]) -> Measurement:
    """Count PAPI_DP_OPS and PAPI_SP_OPS while ``fn()`` runs in this process.

    Args:
        fn: the region to measure.

    Returns:
        The measurement.

    Raises:
        BackendUnavailableError: if PAPI cannot count here.
        MeasureError: if counting fails.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    return _count_presets(fn)


def _count_presets(fn: Callable[[], object]) -> Measurement:
    papi, events = _binding()
    t0 = time.perf_counter()
    evs = papi.create_eventset()
    names: list[str] = []
    skipped: list[str] = []
    try:
        for name in PAPI_EVENTS:
            try:
                papi.add_event(evs, getattr(events, name))
            except Exception:  # noqa: BLE001 - an unsupported preset is skipped
                skipped.append(name)
            else:
                names.append(name)
        papi.start(evs)
        r0 = time.perf_counter()
        fn()
        region = time.perf_counter() - r0
        values = papi.stop(evs)
    except Exception as exc:  # noqa: BLE001 - PapiError and friends, re-raised with context
        raise MeasureError(f"PAPI counting failed: {exc}") from None
    finally:
        papi.cleanup_eventset(evs)
        papi.destroy_eventset(evs)
    by_precision = papi_flops(dict(zip(names, values, strict=True)))
    return Measurement(
        backend="papi",
        flops=sum(by_precision.values()),
        flops_by_precision=by_precision,
        region_seconds=region,
        wall_seconds=time.perf_counter() - t0,
        notes=(
            f"PAPI presets: {', '.join(names)}"
            + (f" ({', '.join(skipped)} not supported here)" if skipped else ""),
        ),
    )




class PapiBackend(InProcessBackend):
    """PAPI presets ``PAPI_DP_OPS`` / ``PAPI_SP_OPS``, in this process."""

    def __init__(self) -> None:
        super().__init__("papi", unavailable_reason, _count_presets)
