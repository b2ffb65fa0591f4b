"""``flopscope count --world-size N --hardware H``: a simulated rank's predicted step time,
compute plus the communication it exposes (issue 29), labelled a bound or a prediction with its
measured error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.distributed.test_cli import LLAMA

from flopscope.cli import main
from flopscope.estimate import PROFILES, get_hardware
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.link_calibration import LinkCalibration, LinkPoint
from flopscope.estimate.profile import Hardware

# links: latency 0, 1 GB/s: each collective's time is its bus bytes / 1e9 exactly
LINK = dict(intra_node_bandwidth=1e9, intra_node_latency=0.0, inter_node_bandwidth=1e8,
            inter_node_latency=0.0)


def _profile(tmp_path: Path, hw: Hardware, name: str = "p.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(hw.to_dict()))
    return str(path)


def _count(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["count", *LLAMA, "--shape-only", "--backward", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = _count(capsys, *argv, "--format", "json")
    assert code == 0, err
    return dict(json.loads(out))


def test_fsdp_rank_step_is_compute_plus_exposed_communication(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = dataclasses.replace(PROFILES["h100-sxm"], name="h100-links", **LINK)
    data = _json(capsys, "--world-size", "2", "--fsdp", "2", "--hardware", _profile(tmp_path, hw))
    step = data["step_time"]
    assert step["kind"] == "bound" and step["compute"] == "bound"
    assert step["compute_s"] == pytest.approx(data["estimate"]["total"]["time_s"])
    kinds = data["communication"]["kinds"]
    # every collective at 1 GB/s, no latency: seconds = bus bytes / 1e9
    assert step["by_kind_s"] == pytest.approx({k: v["bus_bytes"] / 1e9 for k, v in kinds.items()})
    assert set(step["by_kind_s"]) == {"all_gather", "reduce_scatter"}
    assert step["communication_s"] == pytest.approx(sum(step["by_kind_s"].values()))
    # FSDP2 only: exposed = the first all-gather + what the rest need beyond the compute
    records = [r for r in data["communication"]["records"] if r["kind"] == "all_gather"
               and r["phase"] == "forward"]
    first = records[0]["bus_bytes"] / records[0]["calls"] / 1e9
    rest = step["communication_s"] - first
    assert step["exposed_s"] == pytest.approx(first + max(0.0, rest - step["compute_s"]))
    assert step["step_s"] == pytest.approx(step["compute_s"] + step["exposed_s"])
    assert step["error"] is None and step["links"] == "the profile's link fields"


def test_tp_all_reduces_are_exposed(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    hw = dataclasses.replace(PROFILES["h100-sxm"], name="h100-links", **LINK)
    data = _json(capsys, "--world-size", "2", "--tp", "2", "--hardware", _profile(tmp_path, hw))
    step = data["step_time"]
    reduce = data["communication"]["kinds"]["all_reduce"]["bus_bytes"] / 1e9
    assert step["blocking_s"] == pytest.approx(reduce)
    assert step["exposed_s"] == pytest.approx(reduce)  # nothing else to hide
    assert step["hidden_s"] == pytest.approx(0)


def test_a_gpu_rank_s_collectives_run_in_its_wait_for_the_host(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the tiny Llama on the H100's reference calibration is host-bound in every phase (its
    # calls' host time above their device time); links at 1 GB/s: each all-reduce's time is its
    # bus bytes / 1e9. The rank's step takes the planner's rule (estimate.overlap.host_overlap
    # through CommTime.exposure): each phase is max(host, device), and a phase's all-reduces
    # are exposed only beyond the device's wait for the host in it
    hw = dataclasses.replace(get_hardware("h100-sxm"), name="h100-links", **LINK)
    data = _json(capsys, "--world-size", "2", "--tp", "2", "--hardware", _profile(tmp_path, hw))
    step, phases = data["step_time"], data["estimate"]["by_phase"]
    assert step["kind"] == "prediction" and set(phases) == {"forward", "backward"}
    compute, exposed = 0.0, 0.0
    for name, row in phases.items():
        host, device = row["host_s"], row["predicted_s"] - row["host_s"]
        assert host > device  # host-bound: the device waits host - device
        compute += max(host, device)
        reduces = sum(r["bus_bytes"] / 1e9 for r in data["communication"]["records"]
                      if r["kind"] == "all_reduce" and r["phase"] == name)
        exposed += max(0.0, reduces - (host - device))
    assert step["compute_s"] == pytest.approx(compute, rel=1e-12)
    assert step["exposed_s"] == pytest.approx(exposed, rel=1e-12)
    assert step["step_s"] == pytest.approx(compute + exposed, rel=1e-12)
    # before round 13 the step summed host and device and exposed every all-reduce: longer
    summed = sum(row["predicted_s"] for row in phases.values())
    assert step["step_s"] < summed + step["blocking_s"]


def test_calibrated_profile_gives_a_prediction_with_its_error_bar(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = Calibration("2026-11-27T00:00:00+00:00", "cpu (test)", 1, {}, {"matmul": 1e-6},
                      (Point("matmul", "fp32", "mm", 2_000_000, 10_000, 1e-6 + 2e-3),
                       Point("elementwise", "fp32", "add", 1, 1_000_000, 1e-6 + 1e-3)))
    points = [LinkPoint("all_gather", 2, s, s // 2, 1e-4 + s / 2 / 1e9) for s in (1024, 1 << 20)]
    links = LinkCalibration.of_points(points, date="2026-11-27T01:00:00+00:00", backend="gloo",
                                      ranks=2, link="intra", host="cpu", threads=1, versions={})
    links = dataclasses.replace(links, error_bars={"step": 0.25})
    hw = dataclasses.replace(get_hardware("epyc-9654"), calibration=cal, link_calibration=links,
                             intra_node_bandwidth=links.fit.bandwidth,
                             intra_node_latency=links.fit.latency)
    path = _profile(tmp_path, hw)
    data = _json(capsys, "--world-size", "2", "--fsdp", "2", "--hardware", path)
    step = data["step_time"]
    assert step["kind"] == "prediction"
    assert step["compute_s"] == pytest.approx(data["estimate"]["total"]["predicted_s"])
    assert step["error"] == 0.25
    assert step["links"] == "calibrated 2026-11-27 (gloo, 2 ranks, intra-node)"
    # the all-gathers at their own fit (2 ranks): 100 us per call + bus / 1 GB/s
    gathers = data["communication"]["kinds"]["all_gather"]
    assert step["by_kind_s"]["all_gather"] == pytest.approx(
        gathers["calls"] * 1e-4 + gathers["bus_bytes"] / 1e9)
    code, out, _ = _count(capsys, "--world-size", "2", "--fsdp", "2", "--hardware", path)
    assert code == 0
    assert "step time of rank 0 (prediction):" in out
    assert "compute predicted from the profile's calibration" in out
    assert "measured error +-25% on real jobs" in out


def test_pipeline_stage_step_is_over_its_busy_fraction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = dataclasses.replace(PROFILES["h100-sxm"], name="h100-links", **LINK)
    data = _json(capsys, "--batch", "2", "--world-size", "2", "--pp", "2", "--rank", "1",
                 "--hardware", _profile(tmp_path, hw))
    step = data["step_time"]
    # the stage's idle fraction of the schedule (counted FLOPs at one rate)
    assert step["bubble"] == pytest.approx(data["pipeline"]["stages"][1]["bubble"])
    assert 0 < step["bubble"] < 1
    assert set(step["by_kind_s"]) <= {"send", "recv"} and step["p2p_s"] > 0
    assert step["step_s"] == pytest.approx((step["compute_s"] + step["exposed_s"])
                                           / (1 - step["bubble"]))
    # the estimate is the rank's stage alone: the table's FLOPs are stage 1's
    assert data["estimate"]["total"]["flops"] == data["pipeline"]["stages"][1]["flops"]


def test_profile_without_links_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _count(capsys, "--world-size", "2", "--fsdp", "2", "--hardware", "epyc-9654")
    assert code == 0
    assert "step time: not predicted: hardware 'epyc-9654' has no link bandwidths" in out
    assert "flopscope calibrate --comm --ranks N" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus-per-node", "4", "--hardware", "h100"], "--gpus-per-node places"),
    (["--world-size", "2", "--gpus-per-node", "4"], "it needs --world-size and --hardware"),
    (["--world-size", "2", "--memory"], "--world-size does not combine with --memory yet"),
])
def test_usage_errors(argv: list[str], message: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _count(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
