"""The request API, the workload specs and the valgrind parent/child contract, with FakeBackend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from flopscope.errors import BackendUnavailableError, SourceError, UsageError
from flopscope.measure import (
    Backend,
    FakeBackend,
    Measurement,
    MeasureRequest,
    Region,
    ValgrindBackend,
    measure,
    measure_model,
    measure_request,
)
from flopscope.measure.request import RESULT_SCHEMA, counted_segments
from flopscope.measure.valgrind.backend import _raise_child_error
from flopscope.measure.valgrind.contract import ChildRequest, ChildResult
from flopscope.measure.workload import WorkloadSpec, segment_paths

MODEL = """\
import torch
import torch.nn as nn


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 2))), torch.randn(3, 4)
"""


@pytest.fixture
def source(tmp_path: Path) -> str:
    (tmp_path / "m.py").write_text(MODEL)
    return f"{tmp_path / 'm.py'}:mlp"


def exact(region: Region) -> Measurement:
    assert region.report is not None
    segs = counted_segments(region.report, region.depth or 0)
    return Measurement("fake", region.report.flops, {"double": region.report.flops}, segments=segs)


def test_fake_backend_is_a_backend() -> None:
    assert isinstance(FakeBackend(exact), Backend)
    assert isinstance(ValgrindBackend(), Backend)


def test_request_builds_counts_and_compares_once(source: str) -> None:
    built: list[Region] = []

    def handler(region: Region) -> Measurement:
        built.append(region)
        assert isinstance(region.module, nn.Sequential)
        assert next(region.module.parameters()).dtype.is_floating_point
        region.run()
        return exact(region)

    result = measure_request(MeasureRequest(source, dtype="float64", depth=2),
                             backend=FakeBackend(handler))
    assert len(built) == 1 and built[0].depth == 2
    assert next(built[0].module.parameters()).dtype.itemsize == 8  # float64
    assert result.report is built[0].report and result.ratio == 1.0
    assert [s.path for s in result.comparison.segments] == ["", "0", "1", "1.0", "1.1"]
    doc = result.to_dict()
    assert doc["schema"] == RESULT_SCHEMA and doc["backend"] == "fake"
    assert doc["counted_flops"] == doc["measured_flops"] == result.report.flops
    assert doc["inputs"] == ["3x4:float64"]
    json.dumps(doc)  # JSON-ready


def test_request_json_round_trip_and_validation() -> None:
    r = MeasureRequest("hf:gpt2", inputs=("1x16:int64",), batch=2, seq_len=16,
                       config={"n_layer": 1}, dtype="double", depth=0)
    assert r.dtype == "float64"
    assert MeasureRequest.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(SourceError, match="did you mean float64"):
        MeasureRequest("x:y", dtype="float65")
    with pytest.raises(UsageError, match="depth must be 0 or more"):
        MeasureRequest("x:y", depth=-1)


def test_unavailable_fake_backend(source: str) -> None:
    with pytest.raises(BackendUnavailableError, match="backend fake is unavailable: no PMU"):
        measure_request(MeasureRequest(source), backend=FakeBackend(exact, unavailable="no PMU"))


def test_measure_callable_and_model_with_a_fake() -> None:
    seen: list[object] = []

    def handler(region: Region) -> Measurement:
        seen.append(region.run())
        return Measurement("fake", 7, {"any": 7})

    m = measure(lambda a, b: a + b, (2, 3), backend=FakeBackend(handler))
    assert seen == [5] and m.flops == 7 and m.notes[0] == "backend fake"
    model = nn.Linear(2, 2)
    m = measure_model(model, __import__("torch").ones(1, 2), backend=FakeBackend(handler))
    assert seen[-1].shape == (1, 2)  # type: ignore[attr-defined]


def test_segment_paths_from_paths_alone() -> None:
    paths = ["", "0", "1", "1.0", "1.1", "1.1.0", "2"]
    assert segment_paths(paths, 1) == ["0", "1", "2"]
    assert segment_paths(paths, 2) == ["0", "1", "1.0", "1.1", "2"]
    assert segment_paths(paths, 3) == ["0", "1", "1.0", "1.1", "1.1.0", "2"]
    assert segment_paths(paths, 0) == []


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 2.0


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 8), _Scaled()])  # never called itself

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x + 1.0


def test_counted_segments_attribute_each_op_to_its_innermost_segment() -> None:
    import flopscope

    model = _Stack().double()
    report = flopscope.count(model, flopscope.Inputs(torch.ones(3, 4, dtype=torch.float64)),
                             warn=False)
    # blocks.0: 2*3*4*8 + 3*8 (bias) = 216; blocks.1.lin: 2*3*8*2 + 3*2 = 102; blocks.1's own
    # "* 2.0": 3*2 = 6; the root's own "+ 1.0": 6.  Total 330.
    assert report.flops == 330
    assert counted_segments(report, 1) == {"blocks": 216 + 102 + 6, "": 6}
    assert counted_segments(report, 2) == {"blocks": 0, "blocks.0": 216, "blocks.1": 108, "": 6}
    assert counted_segments(report, 3) == {
        "blocks": 0, "blocks.0": 216, "blocks.1": 6, "blocks.1.lin": 102, "": 6}


def test_child_contract_round_trips(tmp_path: Path, source: str) -> None:
    req = MeasureRequest(source, dtype="float64")
    from flopscope.measure import SourceWorkload

    spec = SourceWorkload(req).spec(tmp_path)
    ChildRequest(str(tmp_path), spec, threads=1, warmup=0, segment_depth=1).write()
    back = ChildRequest.read(tmp_path / "request.json")
    assert back.workload == spec and WorkloadSpec.from_json(spec.to_json()) == spec
    region = back.workload.build()  # what the child does: the model built from the SOURCE
    assert region.report is not None and region.report.meta.source == source
    ChildResult(pid=1, valgrind_layers=1, report=region.report.to_dict()).write(tmp_path)
    assert ChildResult.read(tmp_path).report == region.report.to_dict()


def test_child_errors_come_back_typed() -> None:
    with pytest.raises(SourceError, match="no factory 'mpl'"):
        _raise_child_error({"type": "SourceError", "message": "'m.py' has no factory 'mpl'",
                            "usage": True})
    from flopscope.errors import MeasureError

    with pytest.raises(MeasureError, match="building the workload .* RuntimeError: boom"):
        _raise_child_error({"type": "RuntimeError", "message": "boom", "usage": False})


def test_in_process_backend_checks_once_and_counts_the_region(source: str) -> None:
    from flopscope.measure import InProcessBackend

    checks: list[int] = []

    def check() -> str | None:
        checks.append(1)
        return None

    def count(fn: object) -> Measurement:
        """Counters that 'read' a recorded value: what perf/PAPI do with real events."""
        assert callable(fn)
        fn()
        return Measurement("recorded", 1234, {"double": 1234})

    backend = InProcessBackend("recorded", check, count)
    a = measure_request(MeasureRequest(source), backend=backend)
    b = measure_request(MeasureRequest(source), backend=backend)
    assert checks == [1]
    assert a.measurement.flops == b.measurement.flops == 1234 and a.report.flops > 0
    assert a.comparison.segments == ()  # counters cannot split per module
