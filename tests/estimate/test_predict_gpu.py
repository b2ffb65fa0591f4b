"""The calibrated H200 profile (docs/gpu/h200_calibrated.json, from the GPU check's points) and
the expected MFU beside a measured one (issue 29): both run on the CPU, a profile being data."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cli.conftest import Result

from flopscope.estimate import get_hardware, load_hardware
from flopscope.estimate.calibration import GRAPH_CLOCK
from flopscope.estimate.predict import predictor

Cli = Callable[..., Result]
H200 = Path(__file__).parent.parent.parent / "docs" / "gpu" / "h200_calibrated.json"


def test_the_h200_profile_is_made_from_the_checks_points(tmp_path: Path) -> None:
    from benchmarks.gpu_profile import main

    out = tmp_path / "h200.json"
    assert main([str(H200.parent / "calib.json"), str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(H200.read_text())  # the shipped file as made
    (hw,) = load_hardware(H200)
    cal = hw.calibration
    assert cal is not None and cal.device == "cuda (NVIDIA H200)" and cal.versions["torch"] == (
        "2.11.0+cu130")
    assert {p.family for p in cal.points} == {"matmul", "elementwise", "special", "reduction",
                                              "normalization", "attention", "conv", "pooling"}
    # bf16 4096^3 measured at 789 TFLOP/s (docs/gpu.md, run 13; run 7: 759): the point is the check's time
    best = next(p for p in cal.points if p.what == "mm 4096x4096x4096" and p.dtype == "bf16")
    assert 2 * 4096**3 / best.seconds == pytest.approx(788.5e12, rel=1e-3)
    # timed as CUDA graphs' replays: device time however small (a 1,024-element add, 1.2 us,
    # is kept), and Python's time per nn.Module call measured apart from the operators' host
    assert cal.clock == GRAPH_CLOCK and 1e-6 < cal.module_call_s < 1e-5
    tiny = next(p for p in cal.points if p.what == "add 1024" and p.dtype == "fp32")
    assert tiny.seconds < 2e-6 < cal.host_op_s["add"]
    assert predictor(cal).device_s("elementwise", "fp32", tiny.flops, tiny.bytes, "op:add") == (
        pytest.approx(tiny.seconds, rel=0.05))


def test_the_h200_error_bars_pool_every_run_that_predicted_with_its_calibration() -> None:
    """The shipped H200 profile's ``total`` error bar is the 90th percentile of the whole step's
    |predicted / eager - 1| over the check's own run and the later runs that predicted with the
    shipped profile on other sessions' machines (runs 14 and 15), not the calib's run alone."""
    from benchmarks.errors import quantile

    (hw,) = load_hardware(H200)
    cal = hw.calibration
    assert cal is not None
    files = ["predict.json", "predict_run14_shipped.json", "predict_run15a_shipped.json",
             "predict_run15b_shipped.json"]
    assert dict(cal.validation) == {"runs": 4, "models": 51, "files": files}
    ratios = [abs(r["ratio"] - 1) for f in files
              for r in json.loads((H200.parent / f).read_text())["rows"] if "ratio" in r]
    assert len(ratios) == 4 * 51
    # 0.384 from the calib's own run alone; 0.468 pooled with the other sessions' eager times
    assert cal.error_bars["total"] == round(quantile(ratios, 0.9), 3) == 0.468
    older = json.loads((H200.parent / "predict_run7.json").read_text())
    assert "calibrated" not in older  # run 7's profile, not this one: not pooled


def test_the_h100_profile_is_made_from_its_own_run_on_the_h100s_peaks(tmp_path: Path) -> None:
    from benchmarks.gpu_profile import main

    shipped = H200.parent / "h100-sxm_calibrated.json"
    out = tmp_path / "h100.json"
    assert main([str(H200.parent / "h100" / "calib.json"), str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(shipped.read_text())
    (hw,) = load_hardware(shipped)
    # the base is the device the calib ran on: the h100-sxm profile's peaks, not the H200's
    assert hw.name == "h100-sxm-calibrated" and hw.calibration is not None
    assert hw.calibration.device == "cuda (NVIDIA H100 80GB HBM3)"
    assert hw.matrix == get_hardware("h100-sxm").matrix
    assert hw.memory_bandwidth == get_hardware("h100-sxm").memory_bandwidth != (
        get_hardware("h200").memory_bandwidth)


def test_an_h200_prediction_of_a_shape_only_count_runs_on_the_cpu(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--shape-only", "--hardware", str(H200),
            "--format", "json")
    assert r.code == 0, r.err
    pred = json.loads(r.out)["estimate"]["prediction"]
    assert pred["status"] == "calibrated" and pred["device"] == "cuda (NVIDIA H200)"
    # host and device overlap on a GPU: the step is at least the host's time, at most the sum
    assert pred["host_s"] <= pred["step_s"] <= pred["predicted_s"] + 1e-12
    r = cli("count", "tiny_models:tiny", "--shape-only", "--hardware", str(H200))
    assert "step with host and device overlapping" in r.out
    # the calibration's device is the GPU: no host thread count beside it
    assert "prediction (calibrated 2026-11-30, cuda (NVIDIA H200)): " in r.out
    # the error bars say what validated them: the check's runs, other sessions' among them
    assert ("validated on 51 models and steps in 4 run(s) of the GPU check, other sessions' "
            "machines among them): ") in r.out
    assert pred["validation"]["runs"] == 4


def test_expected_mfu_from_the_prediction_beside_the_measured(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--hardware", str(H200), "--shape-only",
            "--step-time", "0.001", "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    util, pred = data["utilization"], data["estimate"]["prediction"]
    expected = util["expected"]
    assert expected["seconds"] == pytest.approx(pred["step_s"], rel=1e-12)
    # the same model FLOPs over the predicted time instead of the measured 1 ms
    assert expected["mfu"] == pytest.approx(util["mfu"] * 0.001 / pred["step_s"], rel=1e-9)
    r = cli("count", "tiny_models:tiny", "--hardware", str(H200), "--shape-only",
            "--step-time", "0.001")
    assert "expected from the prediction" in r.out and "not measured" in r.out
    # an uncalibrated profile (a shipped CPU; a GPU has a reference): the measured MFU only
    r = cli("count", "tiny_models:tiny", "--hardware", "xeon-8480", "--shape-only",
            "--step-time", "0.001", "--format", "json")
    assert "expected" not in json.loads(r.out)["utilization"]
