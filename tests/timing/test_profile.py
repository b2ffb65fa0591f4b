"""Measured time beside every count, on this machine's CPU: the rows add up to the run's wall
time, profiling changes no count, the model is left as it was, and the trace holds every call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import flopscope
from flopscope.cli import main
from flopscope.timing.display import by_module, by_op
from flopscope.timing.trace import estimated_trace, measured_trace


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def test_calls_and_the_rest_add_up_to_the_wall_time() -> None:
    model, x = _model(), torch.randn(32, 64)
    report, timing = flopscope.profile(model, x, warmup=1, repeat=3)
    assert len(timing.walls) == 3
    assert timing.unmatched == 0
    # the median run: its calls' times plus the time outside them are its wall time
    inside = sum(c.seconds for c in timing.calls)
    assert inside + timing.outside_s == pytest.approx(timing.wall_s, rel=1e-9)
    assert 0 < inside <= timing.wall_s
    # per operator and per module (inclusive) add up to the same calls
    assert sum(t.seconds for t in by_op(timing).values()) == pytest.approx(inside)
    assert by_module(timing, list(report.modules))[""].seconds == pytest.approx(inside)
    # Linear(64, 128) on 32 rows: the mode sees t and addmm; 32 * 64 * 128 = 262,144 MACs
    ops = [(c.module, c.op) for c in timing.calls]
    assert ops == [("0", "aten.t.default"), ("0", "aten.addmm.default"),
                   ("1", "aten.relu.default"), ("2", "aten.t.default"),
                   ("2", "aten.addmm.default")]
    assert timing.calls[1].cost.macs == 262_144


def test_profiling_changes_no_count_and_leaves_the_model() -> None:
    model, x = _model(), torch.randn(8, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain = flopscope.count(model, x)
    report, _ = flopscope.profile(model, x, warmup=0, repeat=1)
    assert report == plain  # records, modules, parameters: the counted work is the same
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training  # a freshly built module trains; profiling leaves that as it was


def test_backward_calls_are_measured_too() -> None:
    model, x = _model(), torch.randn(8, 64)
    report, timing = flopscope.profile(model, x, backward=True, warmup=1, repeat=2)
    phases = {c.phase.value for c in timing.calls}
    assert phases == {"forward", "backward"}
    assert timing.unmatched == 0
    # the only calls the profiler does not record: autograd detaching the tensors it saves
    assert {c.op for c in timing.calls if not c.matched} <= {"aten.detach.default"}
    assert report.total("backward").macs == sum(
        c.cost.macs for c in timing.calls if c.phase.value == "backward")
    assert all(p.grad is None for p in model.parameters())


def test_bounds_efficiency_and_sections() -> None:
    model, x = _model(), torch.randn(32, 64)
    report, timing = flopscope.profile(model, x, warmup=1, repeat=2, hardware="xeon-8480")
    assert all(c.bound is not None for c in timing.calls)
    section = report.section("measured")
    assert section is not None
    data = section.to_dict()
    assert data["repeat"] == 2 and data["hardware"] == "xeon-8480"
    assert data["wall_s"] == timing.wall_s
    top = data["ranked"][0]
    assert top["above_roof_s"] == pytest.approx(top["seconds"] - top["bound_s"])
    text = str(report)
    assert "measured" in text and "efficiency" in text and "where to look first" in text
    assert json.loads(report.to_json())["measured"]["unmatched_calls"] == 0


def test_a_meta_model_is_refused() -> None:
    with torch.device("meta"):
        model = _model()
    with pytest.raises(flopscope.UsageError, match="real run"):
        flopscope.profile(model, torch.randn(2, 64))


def test_traces(tmp_path: Path) -> None:
    model, x = _model(), torch.randn(32, 64)
    _, timing = flopscope.profile(model, x, warmup=1, repeat=2, hardware="xeon-8480")
    trace = measured_trace(timing)
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1]
    modules = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == 2]
    assert len(ops) == len(timing.calls) == 5
    assert {e["name"] for e in modules} == {"(root)", "0", "1", "2"}
    root = next(e for e in modules if e["name"] == "(root)")
    for e in ops:  # every call inside the root module's span, with its counts as args
        assert root["ts"] <= e["ts"] and e["ts"] + e["dur"] <= root["ts"] + root["dur"] + 1e-3
        assert {"module", "flops", "bytes", "bound_us", "efficiency"} <= set(e["args"])
    est = estimated_trace(timing)
    laid = [e for e in est["traceEvents"] if e.get("ph") == "X"]
    assert laid[0]["ts"] == 0 and laid[1]["ts"] == pytest.approx(laid[0]["dur"])
    assert est["distributedInfo"]["rank"] == 0


def test_cli_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "run.json"
    assert main(["profile", "torchvision:resnet18", "--input", "1x3x32x32", "--warmup", "1",
                 "--repeat", "2", "--hardware", "none", "--format", "json",
                 "--trace", str(trace)]) == 0
    data = json.loads(capsys.readouterr().out)
    measured = data["measured"]
    inside = sum(v["seconds"] for v in measured["by_op"].values())
    assert inside + measured["outside_s"] == pytest.approx(measured["wall_s"], rel=1e-9)
    assert data["meta"]["source"] == "torchvision:resnet18"
    # resnet18 at 32x32: 37,148,672 MACs per image (its 1,814,073,344 at 224x224 scale by
    # the spatial size up to the global pooling), counted as count() counts them
    assert data["totals"]["macs"] == flopscope.count(
        __import__("torchvision").models.resnet18().eval(), torch.randn(1, 3, 32, 32)).macs
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e["tid"] == 1) == sum(
        v["calls"] for v in measured["by_op"].values())
    assert main(["profile", "torchvision:resnet18", "--hardware", "none",
                 "--estimated-trace", str(trace)]) == 2


def test_diff_of_profiled_reports_shows_measured_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before and after: the counts are compared as always, the measured time shown beside them
    (read back from the JSON's "measured" section)."""
    paths = []
    for batch, name in ((8, "a.json"), (16, "b.json")):
        report, _ = flopscope.profile(_model(), torch.randn(batch, 64), warmup=1, repeat=2)
        path = tmp_path / name
        path.write_text(report.to_json())
        paths.append(str(path))
    from flopscope.report import Report
    from flopscope.report.diff import measured_times

    back = Report.from_json(Path(paths[0]).read_text())
    times = measured_times(back)
    assert times is not None and set(times) == {"", "0", "1", "2"} and times[""] > 0
    assert main(["diff", *paths, "--tolerance", "200%"]) == 0  # twice the batch: +100%
    out = capsys.readouterr().out
    assert "measured time" in out and "time A" in out and "(root)" in out


def test_a_training_step_with_its_optimizer_is_measured() -> None:
    """train=True: forward, backward and AdamW's step, every phase's calls measured; the model's
    values and mode are put back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(),
                          nn.Linear(128, 10)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report, timing = flopscope.profile(model, torch.randn(16, 64), train=True, warmup=1,
                                       repeat=2)
    phases = {c.phase.value for c in timing.calls}
    assert phases == {"forward", "backward", "optimizer"}
    assert timing.unmatched == 0
    inside = sum(c.seconds for c in timing.calls)
    assert inside + timing.outside_s == pytest.approx(timing.wall_s, rel=1e-9)
    assert report.total("optimizer").flops > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
