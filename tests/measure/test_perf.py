"""perf_event_open plumbing (with a software event) and the hardware event weighting."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from flopscope.measure import perf
from flopscope.measure.perf import (
    AMD_FAMILY_17H_EVENTS,
    AMD_FAMILY_19H_EVENTS,
    INTEL_FP_ARITH_EVENTS,
    PerfCounter,
    PerfReading,
    events_for_cpu,
    weight_counts,
)

pytestmark = pytest.mark.skipif(
    os.uname().machine != "x86_64" or os.uname().sysname != "Linux",
    reason="perf_event_open plumbing is x86-64 Linux only",
)


def _busy(n: int = 300_000) -> int:
    return sum(i * i for i in range(n))


def _open_task_clock(**kw: object) -> PerfCounter:
    try:
        return PerfCounter(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK, **kw)  # type: ignore[arg-type]
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOSYS):
            pytest.skip(f"perf_event_open not permitted here: {exc}")
        raise


def test_software_event_counts_only_while_enabled() -> None:
    with _open_task_clock() as counter:
        counter.reset()
        _busy()
        assert counter.read().value == 0  # disabled at open: nothing counted yet
        counter.enable()
        _busy()
        counter.disable()
        first = counter.read()
        _busy()
        assert counter.read().value == first.value  # disabled again
        assert first.value > 1_000_000  # task clock in ns: the busy loop takes > 1 ms
        assert first.scaled == first.value  # a software event is never multiplexed
        counter.reset()
        assert counter.read().value == 0


def test_software_event_counts_other_threads() -> None:
    """Counters are opened per existing thread: work on another thread is counted."""
    started = threading.Event()
    go = threading.Event()

    def worker() -> None:
        started.set()
        go.wait()
        _busy(1_000_000)

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    with _open_task_clock() as counter:
        counter.enable()
        go.set()
        t.join()
        counter.disable()
        total = counter.read().value
    with _open_task_clock(tids=[os.getpid()]) as main_only:
        main_only.enable()
        main_only.disable()
        assert main_only.read().value < total
    assert total > 5_000_000


def test_multiplexed_reading_is_scaled() -> None:
    assert PerfReading(100, 2000, 1000).scaled == 200
    assert PerfReading(100, 1000, 1000).scaled == 100
    assert PerfReading(100, 1000, 0).scaled == 0


def test_intel_weighting_on_recorded_counts() -> None:
    # Recorded shape of a float64 256x256x256 GEMM with AVX2 FMA (vfmadd231pd ymm) plus some
    # scalar cleanup: the counter counts each FMA instruction twice, 256-bit double = 4 lanes.
    counts = {
        "FP_ARITH_INST_RETIRED.256B_PACKED_DOUBLE": 2 * 256**3 // 4,
        "FP_ARITH_INST_RETIRED.SCALAR_DOUBLE": 1000,
        "FP_ARITH_INST_RETIRED.128B_PACKED_SINGLE": 10,
        "FP_ARITH_INST_RETIRED.512B_PACKED_SINGLE": 3,
    }
    flops = weight_counts(INTEL_FP_ARITH_EVENTS, counts)
    assert flops == {"double": 2 * 256**3 + 1000, "single": 10 * 4 + 3 * 16}


def test_intel_lane_weights() -> None:
    weights = {ev.name.split(".")[1]: ev.weight for ev in INTEL_FP_ARITH_EVENTS}
    assert weights == {
        "SCALAR_DOUBLE": 1,
        "SCALAR_SINGLE": 1,
        "128B_PACKED_DOUBLE": 2,
        "128B_PACKED_SINGLE": 4,
        "256B_PACKED_DOUBLE": 4,
        "256B_PACKED_SINGLE": 8,
        "512B_PACKED_DOUBLE": 8,
        "512B_PACKED_SINGLE": 16,
    }
    assert all(ev.config & 0xFF == 0xC7 for ev in INTEL_FP_ARITH_EVENTS)


def test_amd_weighting_on_recorded_counts() -> None:
    # AMD's counter already counts FLOPs (lanes, FMA = 2); family 17h splits precisions.
    counts17 = {AMD_FAMILY_17H_EVENTS[0].name: 123, AMD_FAMILY_17H_EVENTS[1].name: 33_554_432}
    assert weight_counts(AMD_FAMILY_17H_EVENTS, counts17) == {"single": 123, "double": 33_554_432}
    counts19 = {AMD_FAMILY_19H_EVENTS[0].name: 4_227_075}
    assert weight_counts(AMD_FAMILY_19H_EVENTS, counts19) == {"any": 4_227_075}


def test_events_for_cpu() -> None:
    assert events_for_cpu("GenuineIntel", 6) is INTEL_FP_ARITH_EVENTS
    assert events_for_cpu("AuthenticAMD", 0x17) is AMD_FAMILY_17H_EVENTS
    assert events_for_cpu("AuthenticAMD", 0x19) is AMD_FAMILY_19H_EVENTS
    assert events_for_cpu("AuthenticAMD", 0x15) is None
    assert events_for_cpu("CentaurHauls", 6) is None


@pytest.mark.skipif(
    Path("/sys/bus/event_source/devices/cpu").exists(), reason="this machine has a cpu PMU"
)
def test_reason_without_pmu() -> None:
    reason = perf.unavailable_reason()
    assert reason is not None and reason.startswith("no hardware performance counters")
