"""Backend selection, the valgrind client-request stub outside valgrind, comparisons."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

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


def test_segment_modules_nest_down_to_depth() -> None:
    from flopscope.measure.workload import segment_modules

    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), nn.Sequential(nn.Linear(2, 2))), nn.ReLU()
    )
    assert [p for p, _ in segment_modules(model, 1)] == ["0", "1", "2"]
    assert [p for p, _ in segment_modules(model, 2)] == ["0", "1", "1.0", "1.1", "2"]
    assert [p for p, _ in segment_modules(model, 3)] == ["0", "1", "1.0", "1.1", "1.1.0", "2"]


def test_segment_of_is_the_nearest_segment_ancestor() -> None:
    from flopscope.measure.workload import segment_of

    segments = {"blocks", "blocks.1", "head"}
    assert segment_of("blocks.0.layers.2", segments) == "blocks"
    assert segment_of("blocks.1.attn", segments) == "blocks.1"
    assert segment_of("blocks", segments) == "blocks"
    assert segment_of("headx.0", segments) == ""  # a path prefix is not an ancestor
    assert segment_of("", segments) == ""


class _Leaf(nn.Module):
    """Records its name in ``ran`` when it runs (stands for the code a backend would count)."""

    def __init__(self, name: str, ran: list[str]) -> None:
        super().__init__()
        self.name, self.ran = name, ran

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ran.append(self.name)
        return x


class _Head(nn.Module):
    def __init__(self, ran: list[str], shared: nn.Module) -> None:
        super().__init__()
        self.norm, self.shared, self.ran = _Leaf("head.norm", ran), shared, ran

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(self.norm(x))  # a module registered first elsewhere (path "stem")
        self.ran.append("head, after the shared module")
        return x


class _Net(nn.Module):
    """maxvit's layout: ``blocks`` is a ModuleList the root iterates, so it is never called."""

    def __init__(self, ran: list[str]) -> None:
        super().__init__()
        self.ran = ran
        self.stem = _Leaf("stem", ran)
        self.blocks = nn.ModuleList(
            [nn.Sequential(_Leaf("blocks.0", ran)), nn.Sequential(_Leaf("blocks.1", ran))]
        )
        self.head = _Head(ran, self.stem)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        self.ran.append("root")
        return self.head(x)


def _attribute(depth: int) -> dict[str, list[str]]:
    """Run ``_Net`` under SegmentMarks: which code ran in which segment, as the valgrind child
    dumps it (each mark closes the code run since the previous one)."""
    from flopscope.measure.workload import SegmentMarks

    ran: list[str] = []
    net = _Net(ran)
    got: dict[str, list[str]] = {}

    def mark(segment: str) -> None:
        got.setdefault(segment, []).extend(ran)
        ran.clear()

    marks = SegmentMarks(net, depth, mark)
    marks.install()
    net(torch.ones(1))
    marks.finish()
    marks.remove()
    net(torch.ones(1))  # hooks removed: no more marks
    return {k: v for k, v in got.items() if v}


def test_segment_marks_follow_uncalled_containers_and_shared_modules() -> None:
    # Before SegmentMarks only the segment modules were hooked and leaving one went back to "":
    # the ModuleList "blocks" never runs its hooks (its items are called by the root), so its
    # code fell to "" (maxvit_t: "blocks" measured 0 of 10.3 GFLOPs counted, "(outside)" 12.9 of
    # 13.9 GFLOPs measured), and the
    # head's code after its call into "stem" fell to "" too.
    assert _attribute(1) == {
        "stem": ["stem", "stem"],
        "blocks": ["blocks.0", "blocks.1"],
        "": ["root"],
        "head": ["head.norm", "head, after the shared module"],
    }
    # Nested segments: "head" keeps only its own code, "head.norm" its own.
    assert _attribute(2) == {
        "stem": ["stem", "stem"],
        "blocks.0": ["blocks.0"],
        "blocks.1": ["blocks.1"],
        "": ["root"],
        "head.norm": ["head.norm"],
        "head": ["head, after the shared module"],
    }


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
