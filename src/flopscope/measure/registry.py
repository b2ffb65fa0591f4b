"""Choosing a measurement backend by name: ``auto``, ``perf``, ``papi`` or ``valgrind``.

Availability is checked once per backend and process: each real backend caches its answer, and
:func:`backend_named` hands out one instance per name.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping

from flopscope.errors import BackendUnavailableError, UsageError
from flopscope.measure.backend import Backend
from flopscope.measure.papi import PapiBackend
from flopscope.measure.perf import PerfBackend
from flopscope.measure.valgrind import ValgrindBackend

__all__ = [
    "BackendName",
    "auto_note",
    "backend_named",
    "backend_status",
    "resolve_backend",
    "select_backend",
]


class BackendName(str, enum.Enum):
    """Names of the real backends, and ``auto``."""

    AUTO = "auto"
    PERF = "perf"
    PAPI = "papi"
    VALGRIND = "valgrind"


# The order in which ``auto`` tries them: hardware counters first, valgrind as the fallback.
_ORDER = (BackendName.PERF, BackendName.PAPI, BackendName.VALGRIND)
_NAMES = frozenset(b.value for b in _ORDER)


def _to_name(value: BackendName | str) -> BackendName:
    try:
        return BackendName(value)
    except ValueError:
        names = ", ".join(b.value for b in BackendName)
        raise UsageError(f"unknown measurement backend {value!r}; choose one of {names}") from None


def backend_named(name: BackendName | str) -> Backend:
    """The default instance of a real backend (one per process, so availability is checked once).

    Args:
        name: ``perf``, ``papi`` or ``valgrind``.

    Returns:
        The backend.

    Raises:
        UsageError: for ``auto`` or an unknown name.
    """
    return _instance(_to_name(name))


@functools.cache
def _instance(which: BackendName) -> Backend:
    if which is BackendName.PERF:
        return PerfBackend()
    if which is BackendName.PAPI:
        return PapiBackend()
    if which is BackendName.VALGRIND:
        return ValgrindBackend()
    raise UsageError("'auto' is not a backend; use select_backend('auto')")


def backend_status() -> dict[BackendName, str | None]:
    """Whether each real backend can run here.

    Returns:
        For perf, papi and valgrind: ``None`` if available, else why not.
    """
    return {b: backend_named(b).unavailable_reason() for b in _ORDER}


def select_backend(
    requested: BackendName | str = BackendName.AUTO,
) -> tuple[BackendName, dict[BackendName, str]]:
    """Choose the backend to use.

    Args:
        requested: a backend name, or ``auto`` for the first available of perf, papi, valgrind.

    Returns:
        ``(name, reasons)``: the backend chosen (get it with :func:`backend_named`) and, for each
        backend that is unavailable, why.

    Raises:
        UsageError: for an unknown backend name.
        BackendUnavailableError: if the requested backend (or, for auto, every backend) is
            unavailable; the message gives the reasons.
    """
    want = _to_name(requested)
    reasons = {b: r for b, r in backend_status().items() if r is not None}
    if want is not BackendName.AUTO:
        if want in reasons:
            raise BackendUnavailableError(f"backend {want.value} is unavailable: {reasons[want]}")
        return want, reasons
    for b in _ORDER:
        if b not in reasons:
            return b, reasons
    lines = "; ".join(f"{b.value}: {r}" for b, r in reasons.items())
    raise BackendUnavailableError(f"no measurement backend is available ({lines})")


def resolve_backend(requested: Backend | BackendName | str) -> tuple[Backend, str]:
    """A backend object for a name or an object, and the note that says how it was chosen.

    Args:
        requested: a :class:`Backend` (used as it is), a backend name, or ``auto``.

    Returns:
        ``(backend, note)``; the note reads ``backend valgrind (perf unavailable: ...)``.

    Raises:
        UsageError: for an unknown name.
        BackendUnavailableError: if the backend cannot run here.
    """
    if not isinstance(requested, (str, BackendName)):
        reason = requested.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"backend {requested.name} is unavailable: {reason}")
        if requested.name in _NAMES and backend_named(requested.name) is requested:
            # One of ours, already chosen: the note still says why the others were not.
            reasons = {b: r for b, r in backend_status().items() if r is not None}
            return requested, auto_note(requested.name, reasons)
        return requested, f"backend {requested.name}"
    chosen, reasons = select_backend(requested)
    return backend_named(chosen), auto_note(chosen.value, reasons)


def auto_note(chosen: str, reasons: Mapping[BackendName, str]) -> str:
    """``backend NAME (other unavailable: why; ...)``.

    Args:
        chosen: the backend name.
        reasons: why each other backend is unavailable.

    Returns:
        The note.
    """
    others = "; ".join(f"{b.value} unavailable: {r}" for b, r in reasons.items())
    return f"backend {chosen}" + (f" ({others})" if others else "")
