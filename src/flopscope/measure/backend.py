"""The measurement-backend interface and its test double.

A backend does two things: it says whether it can run here (and why not), and it measures a
:class:`~flopscope.measure.workload.Workload`.  The real backends are ``perf`` and ``papi``
(hardware counters, in this process) and ``valgrind`` (instruction counts, in a child process);
:class:`FakeBackend` is a one-function test double for the code above the backends (the request
API, comparisons, JSON output, the command line), in the way httpx's ``MockTransport`` stands in
for a transport.

Choosing a backend by name (``auto``, ``perf``, ...) is :mod:`flopscope.measure.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from flopscope.errors import BackendUnavailableError

if TYPE_CHECKING:
    from flopscope.measure.result import Measurement
    from flopscope.measure.workload import Region, Workload
    from flopscope.report.report import Report

__all__ = [
    "Backend",
    "FakeBackend",
    "InProcessBackend",
    "MeasuredRun",
    "ProgressFn",
]

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class MeasuredRun:
    """What a backend returns for one workload.

    Attributes:
        measurement: the executed floating-point operations of the workload's region.
        report: the flopscope count made when the workload was built (``None`` when the workload
            does not count, e.g. a plain callable).  With the valgrind backend it was made in the
            child process, from the same model that was measured.
    """

    measurement: Measurement
    report: Report | None = None


@runtime_checkable
class Backend(Protocol):
    """A way to measure executed floating-point operations.

    Implementations: :class:`~flopscope.measure.perf.PerfBackend`,
    :class:`~flopscope.measure.papi.PapiBackend`,
    :class:`~flopscope.measure.valgrind.ValgrindBackend` and :class:`FakeBackend`.
    """

    @property
    def name(self) -> str:
        """Short name (``"perf"``, ``"papi"``, ``"valgrind"``, ...)."""
        ...

    def unavailable_reason(self) -> str | None:
        """``None`` if the backend can run here, else a sentence saying what is missing."""
        ...

    def measure(self, workload: Workload, *, progress: ProgressFn | None = None) -> MeasuredRun:
        """Build the workload once, measure its region, return the measurement.

        Raises:
            BackendUnavailableError: the backend cannot run here.
            MeasureError: the measurement failed.
        """
        ...


class FakeBackend:
    """A test double: builds the workload in this process and asks ``handler`` for the result.

    Example::

        fake = FakeBackend(lambda region: Measurement("fake", region.report.flops, {}))
        result = measure_request(MeasureRequest("pkg.models:tiny"), backend=fake)

    Args:
        handler: receives the built :class:`~flopscope.measure.workload.Region` (its ``run``,
            its ``module`` and, for model sources, the counted ``report``) and returns the
            measurement; it may raise :class:`~flopscope.errors.MeasureError` to simulate a
            failure.
        name: the backend name reported.
        unavailable: if given, the backend claims to be unavailable for this reason.
    """

    def __init__(
        self,
        handler: Callable[[Region], Measurement],
        *,
        name: str = "fake",
        unavailable: str | None = None,
    ) -> None:
        self._handler = handler
        self._name = name
        self._unavailable = unavailable

    @property
    def name(self) -> str:
        """The name given at construction (default ``"fake"``)."""
        return self._name

    def unavailable_reason(self) -> str | None:
        """The ``unavailable`` reason given at construction (default ``None``)."""
        return self._unavailable

    def measure(self, workload: Workload, *, progress: ProgressFn | None = None) -> MeasuredRun:
        """Build ``workload`` here and return ``handler(region)``.

        Args:
            workload: the workload.
            progress: called with ``"measuring (fake)"``.

        Returns:
            The handler's measurement and the region's report.

        Raises:
            BackendUnavailableError: if constructed with ``unavailable``.
        """
        if self._unavailable is not None:
            raise BackendUnavailableError(self._unavailable)
        region = workload.build()
        if progress is not None:
            progress(f"measuring ({self._name})")
        return MeasuredRun(self._handler(region), region.report)


class InProcessBackend:
    """A counter backend (perf, PAPI): builds the workload here and counts its region.

    Args:
        name: the backend's name.
        check: says why the counters cannot be used here, or ``None``; asked once.
        count: runs a function once with the counters on and returns the measurement.
    """

    def __init__(
        self,
        name: str,
        check: Callable[[], str | None],
        count: Callable[[Callable[[], object]], Measurement],
    ) -> None:
        self.name = name
        self._check = check
        self._count = count
        self._reason: tuple[str | None] | None = None

    def unavailable_reason(self) -> str | None:
        """Returns: ``None`` if the counters can be used here, else why not (checked once)."""
        if self._reason is None:
            self._reason = (self._check(),)
        return self._reason[0]

    def measure(self, workload: Workload, *, progress: ProgressFn | None = None) -> MeasuredRun:
        """Build ``workload`` in this process and count its region.

        Args:
            workload: the workload.
            progress: called once before the region runs.

        Returns:
            The measurement (no per-module segments) and the workload's count, if any.

        Raises:
            BackendUnavailableError: if the counters cannot be used here.
            MeasureError: if counting fails.
        """
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(reason)
        region = workload.build()
        if progress is not None:
            progress(f"measuring with {self.name}")
        return MeasuredRun(self._count(region.run), region.report)
