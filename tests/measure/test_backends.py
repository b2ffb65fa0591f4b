"""Backend selection, the valgrind client-request stub outside valgrind, comparisons."""

from __future__ import annotations

import pytest

from flopscope.errors import UsageError
from flopscope.measure import (
    BackendName,
    BackendUnavailableError,
    Measurement,
    backend_status,
    select_backend,
)
from flopscope.measure.valgrind._client import ClientRequests


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown measurement backend 'gpu'"):
        select_backend("gpu")


def test_auto_explains_unavailable_backends() -> None:
    status = backend_status()
    available = [b for b, r in status.items() if r is None]
    if not available:
        with pytest.raises(BackendUnavailableError, match="no measurement backend"):
            select_backend("auto")
        return
    chosen, reasons = select_backend("auto")
    assert chosen is available[0]
    assert set(reasons) == {b for b, r in status.items() if r is not None}
    assert all(reasons.values())


def test_explicit_unavailable_backend_raises() -> None:
    status = backend_status()
    missing = [b for b, r in status.items() if r is not None]
    if not missing:
        pytest.skip("every backend is available here")
    with pytest.raises(BackendUnavailableError, match=f"backend {missing[0].value} is unavailable"):
        select_backend(missing[0])


def test_this_vm_picks_valgrind() -> None:
    status = backend_status()
    if status[BackendName.PERF] is None or status[BackendName.VALGRIND] is not None:
        pytest.skip("not a machine without hardware counters but with valgrind")
    chosen, reasons = select_backend("auto")
    assert chosen is BackendName.VALGRIND
    assert "no hardware performance counters" in reasons[BackendName.PERF]


def test_client_requests_are_no_ops_natively() -> None:
    client = ClientRequests()
    assert client.running_on_valgrind() == 0
    assert client.request(0x43540000, default=7) == 7
    client.dump_stats_at("label")  # must not crash outside valgrind
    client.start_instrumentation()
    client.stop_instrumentation()


def test_compare_per_segment() -> None:
    m = Measurement("valgrind", 1029, {"double": 1029}, segments={"": 29, "fc": 1000})
    c = m.compare(1000, {"": 0, "fc": 1000, "conv": 0})
    assert c.ratio == pytest.approx(1.029)
    assert c.within(0.03) and not c.within(0.02)
    assert [s.path for s in c.segments] == ["", "conv", "fc"]
    assert c.largest_gaps(1)[0].path == ""
    assert c.largest_gaps(1)[0].ratio == float("inf")


def test_segment_modules_do_not_nest() -> None:
    import torch.nn as nn

    from flopscope.measure.workload import segment_modules

    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), nn.Sequential(nn.Linear(2, 2))), nn.ReLU()
    )
    assert [p for p, _ in segment_modules(model, 1)] == ["0", "1", "2"]
    assert [p for p, _ in segment_modules(model, 2)] == ["0", "1.0", "1.1", "2"]
    assert [p for p, _ in segment_modules(model, 3)] == ["0", "1.0", "1.1.0", "2"]


def test_registry_backend_as_object_keeps_the_full_note() -> None:
    from flopscope.measure import backend_named, resolve_backend

    status = backend_status()
    available = [b for b, r in status.items() if r is None]
    if not available or len(available) == len(status):
        pytest.skip("needs one available and one unavailable backend")
    by_name, note = resolve_backend(available[0].value)
    assert by_name is backend_named(available[0]) is backend_named(available[0].value)
    assert resolve_backend(by_name) == (by_name, note)
    assert "unavailable:" in note
