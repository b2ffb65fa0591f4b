"""The ``perf`` backend: hardware floating-point events through Linux ``perf_event_open``.

Events (raw ``config`` = event select | unit mask << 8):

* Intel (Broadwell and later), ``FP_ARITH_INST_RETIRED`` (event 0xC7), one unit mask per
  precision and width; each count is an *instruction* and is weighted here by its lanes
  (scalar 1; 128-bit: 2 double / 4 single; 256-bit: 4 / 8; 512-bit: 8 / 16).  The hardware
  already counts FMA instructions twice, so FMA = 2 FLOPs per lane comes out of the weighting.
  Source: Intel 64 and IA-32 Architectures Software Developer's Manual vol. 3B, performance
  monitoring events, and the Intel Optimization Reference Manual, "Floating-point arithmetic".
* AMD Zen (family 17h and later), ``RETIRED_SSE_AVX_FLOPS`` / ``FpRetSseAvxOps`` (PMCx003): the
  counter already counts FLOPs (lanes included, multiply-add = 2).  On family 17h the unit mask
  separates single (bits 0-3) and double precision (bits 4-7); from family 19h the bits are
  add/sub, multiply, divide/sqrt and multiply-add without precision, reported as ``"any"``.
  Source: AMD Processor Programming Reference for families 17h and 19h, PMCx003.

Counting is per thread: one counter per existing thread of the process (``/proc/self/task``),
each with ``inherit`` set so threads they create later are counted too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flopscope.errors import BackendUnavailableError, MeasureError
from flopscope.measure.backend import InProcessBackend
from flopscope.measure.result import Measurement

__all__ = [
    "AMD_FAMILY_17H_EVENTS",
    "AMD_FAMILY_19H_EVENTS",
    "INTEL_FP_ARITH_EVENTS",
    "PERF_COUNT_SW_TASK_CLOCK",
    "PERF_TYPE_RAW",
    "PERF_TYPE_SOFTWARE",
    "FpEvent",
    "PerfBackend",
    "PerfCounter",
    "events_for_cpu",
    "measure_perf",
    "unavailable_reason",
    "weight_counts",
]

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_RAW = 4
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_TASK_CLOCK = 1

_PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
_PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
# ioctl numbers: _IO('$', 0), _IO('$', 1), _IO('$', 3)
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_DISABLE = 0x2401
_PERF_EVENT_IOC_RESET = 0x2403
_SYS_PERF_EVENT_OPEN_X86_64 = 298
_PERF_FLAG_FD_CLOEXEC = 1 << 3

# attr.flags bit positions (include/uapi/linux/perf_event.h)
_FLAG_DISABLED = 1 << 0
_FLAG_INHERIT = 1 << 1
_FLAG_EXCLUDE_KERNEL = 1 << 5
_FLAG_EXCLUDE_HV = 1 << 6


class _PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to ``config3`` (PERF_ATTR_SIZE_VER8, 136 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
        ("config3", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _perf_event_open(attr: _PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    fd = int(
        _libc.syscall(
            ctypes.c_long(_SYS_PERF_EVENT_OPEN_X86_64),
            ctypes.byref(attr),
            ctypes.c_int(pid),
            ctypes.c_int(cpu),
            ctypes.c_int(group_fd),
            ctypes.c_ulong(flags),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


@dataclass(frozen=True)
class PerfReading:
    """A counter value with its multiplexing times.

    Attributes:
        value: raw count.
        time_enabled_ns: time the event was enabled.
        time_running_ns: time it was actually on a hardware counter.
    """

    value: int
    time_enabled_ns: int
    time_running_ns: int

    @property
    def scaled(self) -> int:
        """The count extrapolated to the enabled time (equal to ``value`` if never multiplexed)."""
        if self.time_running_ns == 0:
            return 0
        if self.time_running_ns >= self.time_enabled_ns:
            return self.value
        return round(self.value * self.time_enabled_ns / self.time_running_ns)


class PerfCounter:
    """One ``perf_event_open`` counter per thread of this process, summed.

    Args:
        type_: ``PERF_TYPE_*``.
        config: event config (raw event code for ``PERF_TYPE_RAW``).
        tids: thread ids to count (default: every thread of this process).
        exclude_kernel: count user space only (needs ``perf_event_paranoid`` <= 2).

    Raises:
        OSError: if the kernel refuses the event (errno says why).
    """

    def __init__(
        self,
        type_: int,
        config: int,
        tids: Iterable[int] | None = None,
        exclude_kernel: bool = True,
    ) -> None:
        if os.uname().machine != "x86_64":
            raise OSError(errno.ENOSYS, "perf_event_open plumbing is implemented for x86-64 only")
        attr = _PerfEventAttr()
        attr.type = type_
        attr.size = ctypes.sizeof(_PerfEventAttr)
        attr.config = config
        attr.read_format = _PERF_FORMAT_TOTAL_TIME_ENABLED | _PERF_FORMAT_TOTAL_TIME_RUNNING
        attr.flags = _FLAG_DISABLED | _FLAG_INHERIT | _FLAG_EXCLUDE_HV
        if exclude_kernel:
            attr.flags |= _FLAG_EXCLUDE_KERNEL
        self._fds: list[int] = []
        threads = list(tids) if tids is not None else _threads()
        try:
            for tid in threads:
                try:
                    self._fds.append(_perf_event_open(attr, tid, -1, -1, _PERF_FLAG_FD_CLOEXEC))
                except OSError as exc:
                    if exc.errno == errno.ESRCH:  # the thread ended meanwhile
                        continue
                    raise
        except BaseException:
            self.close()
            raise

    def _ioctl(self, request: int) -> None:
        for fd in self._fds:
            fcntl.ioctl(fd, request, 0)

    def reset(self) -> None:
        """Zero the counts."""
        self._ioctl(_PERF_EVENT_IOC_RESET)

    def enable(self) -> None:
        """Start counting."""
        self._ioctl(_PERF_EVENT_IOC_ENABLE)

    def disable(self) -> None:
        """Stop counting."""
        self._ioctl(_PERF_EVENT_IOC_DISABLE)

    def read(self) -> PerfReading:
        """Returns: the count summed over threads, with enabled/running times (maximum)."""
        value = enabled = running = 0
        for fd in self._fds:
            v, e, r = struct.unpack("<QQQ", os.read(fd, 24))
            value += v
            enabled = max(enabled, e)
            running = max(running, r)
        return PerfReading(value, enabled, running)

    def close(self) -> None:
        """Close the file descriptors."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> PerfCounter:  # noqa: PYI034 - final class in practice
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _threads() -> list[int]:
    return sorted(int(t) for t in os.listdir("/proc/self/task"))


@dataclass(frozen=True)
class FpEvent:
    """A hardware floating-point event and how to turn its count into FLOPs.

    Attributes:
        name: the event's name in vendor documentation.
        config: raw ``perf_event_attr.config``.
        precision: ``"double"``, ``"single"`` or ``"any"``.
        weight: FLOPs per count (lanes for Intel's instruction counts, 1 for AMD's FLOP counts).
    """

    name: str
    config: int
    precision: str
    weight: int


def _intel(umask: int, name: str, precision: str, weight: int) -> FpEvent:
    return FpEvent(f"FP_ARITH_INST_RETIRED.{name}", 0xC7 | (umask << 8), precision, weight)


INTEL_FP_ARITH_EVENTS: tuple[FpEvent, ...] = (
    _intel(0x01, "SCALAR_DOUBLE", "double", 1),
    _intel(0x02, "SCALAR_SINGLE", "single", 1),
    _intel(0x04, "128B_PACKED_DOUBLE", "double", 2),
    _intel(0x08, "128B_PACKED_SINGLE", "single", 4),
    _intel(0x10, "256B_PACKED_DOUBLE", "double", 4),
    _intel(0x20, "256B_PACKED_SINGLE", "single", 8),
    _intel(0x40, "512B_PACKED_DOUBLE", "double", 8),
    _intel(0x80, "512B_PACKED_SINGLE", "single", 16),
)

AMD_FAMILY_17H_EVENTS: tuple[FpEvent, ...] = (
    FpEvent("RETIRED_SSE_AVX_FLOPS:SP (umask 0x0f)", 0x03 | (0x0F << 8), "single", 1),
    FpEvent("RETIRED_SSE_AVX_FLOPS:DP (umask 0xf0)", 0x03 | (0xF0 << 8), "double", 1),
)

AMD_FAMILY_19H_EVENTS: tuple[FpEvent, ...] = (
    FpEvent("RETIRED_SSE_AVX_FLOPS:ALL (umask 0x0f)", 0x03 | (0x0F << 8), "any", 1),
)


def weight_counts(events: Sequence[FpEvent], counts: Mapping[str, int]) -> dict[str, int]:
    """Turn raw event counts into FLOPs per precision.

    Args:
        events: the events that were counted.
        counts: count per event name.

    Returns:
        FLOPs per precision (only precisions with events present).
    """
    out: dict[str, int] = {}
    for ev in events:
        if ev.name in counts:
            out[ev.precision] = out.get(ev.precision, 0) + counts[ev.name] * ev.weight
    return out


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def looks_like_vm() -> bool:
    """Returns: whether the CPU reports the ``hypervisor`` flag (we run in a virtual machine)."""
    return "hypervisor" in _cpuinfo().get("flags", "").split()


def events_for_cpu(vendor: str, family: int) -> tuple[FpEvent, ...] | None:
    """The floating-point events for a CPU.

    Args:
        vendor: ``/proc/cpuinfo`` ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``, ...).
        family: CPU family number.

    Returns:
        The events, or ``None`` if the CPU has none we know.
    """
    if vendor == "GenuineIntel":
        return INTEL_FP_ARITH_EVENTS
    if vendor in ("AuthenticAMD", "HygonGenuine"):
        if family == 0x17 or vendor == "HygonGenuine":
            return AMD_FAMILY_17H_EVENTS
        if family >= 0x19:
            return AMD_FAMILY_19H_EVENTS
    return None


_PMU_DIRS = ("cpu", "cpu_core", "cpu_atom")


def unavailable_reason() -> str | None:
    """Why the perf backend cannot run here.

    Returns:
        ``None`` if hardware floating-point events can be opened, else a sentence saying why not.
    """
    if os.uname().sysname != "Linux" or os.uname().machine != "x86_64":
        return "perf backend needs Linux on x86-64"
    devices = Path("/sys/bus/event_source/devices")
    if not any((devices / d).exists() for d in _PMU_DIRS):
        vm = " (this looks like a virtual machine)" if looks_like_vm() else ""
        return f"no hardware performance counters: the kernel has no 'cpu' PMU under {devices}{vm}"
    info = _cpuinfo()
    vendor = info.get("vendor_id", "?")
    family = int(info.get("cpu family", "0") or 0)
    events = events_for_cpu(vendor, family)
    if events is None:
        return f"no known floating-point events for {vendor} family {family:#x}"
    try:
        with PerfCounter(PERF_TYPE_RAW, events[0].config, tids=[0]) as c:
            c.read()
    except OSError as exc:
        hint = ""
        if exc.errno in (errno.EACCES, errno.EPERM):
            hint = " (lower /proc/sys/kernel/perf_event_paranoid or run with CAP_PERFMON)"
        elif exc.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
            hint = " (the PMU does not support it; a virtual machine may hide it)"
        return f"cannot open {events[0].name}: {exc.strerror}{hint}"
    return None


def measure_perf(fn: Callable[[], object]) -> Measurement:
    """Count hardware floating-point events while ``fn()`` runs in this process.

    Args:
        fn: the region to measure.

    Returns:
        The measurement (no per-module segments).

    Raises:
        BackendUnavailableError: if the events cannot be opened here.
        MeasureError: if reading the counters fails.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    return _count_events(fn)


def _count_events(fn: Callable[[], object]) -> Measurement:
    info = _cpuinfo()
    events = events_for_cpu(info.get("vendor_id", ""), int(info.get("cpu family", "0") or 0))
    if events is None:
        raise BackendUnavailableError("no known floating-point events for this CPU")
    t0 = time.perf_counter()
    counters: list[tuple[FpEvent, PerfCounter]] = []
    try:
        for ev in events:
            counters.append((ev, PerfCounter(PERF_TYPE_RAW, ev.config)))
        for _, c in counters:
            c.reset()
        for _, c in counters:
            c.enable()
        r0 = time.perf_counter()
        fn()
        region = time.perf_counter() - r0
        for _, c in counters:
            c.disable()
        readings = {ev.name: c.read() for ev, c in counters}
    except OSError as exc:
        raise MeasureError(f"perf counters failed: {exc}") from None
    finally:
        for _, c in counters:
            c.close()
    notes = [f"perf_event_open: {', '.join(ev.name for ev in events)}"]
    if any(r.time_running_ns < r.time_enabled_ns for r in readings.values()):
        notes.append("counters were multiplexed; counts are scaled to the enabled time")
    by_precision = weight_counts(events, {k: r.scaled for k, r in readings.items()})
    return Measurement(
        backend="perf",
        flops=sum(by_precision.values()),
        flops_by_precision=by_precision,
        region_seconds=region,
        wall_seconds=time.perf_counter() - t0,
        notes=tuple(notes),
    )




class PerfBackend(InProcessBackend):
    """Hardware floating-point events through ``perf_event_open``, in this process."""

    def __init__(self) -> None:
        super().__init__("perf", unavailable_reason, _count_events)
