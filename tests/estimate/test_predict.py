"""The calibrated prediction beside the bound (issue 29): the calibration block of a profile, the
model's arithmetic on known points, host-bound detection, uncalibrated profiles, and
``flopscope calibrate`` writing a file that ``count --hardware FILE`` predicts with."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.cli.conftest import Result
from tests.estimate.synthetic import FAST
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import Calibration, Hardware, calibrate, get_hardware, load_hardware
from flopscope.estimate.calibration import FAMILIES, Point
from flopscope.estimate.display import human_seconds

Cli = Callable[..., Result]
# the module (the package's ``calibrate`` attribute is the function of that name)
calibrate_module = importlib.import_module("flopscope.estimate.calibrate")


HOST = {"elementwise": 1e-6, "matmul": 2e-6, "view": 5e-7}
POINTS = (
    # element-wise: device 1e-6 s for 1e3 B (1e9 B/s), 1e-5 s for 1e5 B (1e10 B/s)
    Point("elementwise", "fp32", "add small", 100, 1000, 2e-6),
    Point("elementwise", "fp32", "add large", 10_000, 100_000, 1.1e-5),
    # matrix products: one point, 2e6 FLOPs in 1e-3 s of device time: 2e9 FLOP/s
    Point("matmul", "fp32", "mm", 2_000_000, 10_000, 2e-6 + 1e-3),
    # a host-dominated point of a family timed in a loop (device time under half the
    # measured): not a rate (a rotated family's small points are: test_predict_ops.py)
    Point("elementwise", "fp32", "add tiny", 2, 12, 1.9e-6),
    # in place (no new output storage): 1e5 B in 1e-6 s of device time, 1e11 B/s
    Point("elementwise", "fp32", "add_", 10_000, 100_000, 2e-6, inplace=True),
)


def synthetic(hw: Hardware = FAST) -> Hardware:
    cal = Calibration("2026-11-26T00:00:00+00:00", "cpu (test)", 1, {"torch": "x"}, HOST, POINTS)
    return dataclasses.replace(hw, calibration=cal)


class Add(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


def test_elementwise_prediction_is_host_plus_interpolated_rate() -> None:
    hw = synthetic()
    x = torch.randn(1024)  # x + x: reads 2 x 4096 B, writes 4096 B = 12288 B
    _, est = flopscope.estimate.roofline(Add(), x, hardware=hw)
    # log10 rate between (3, 9) and (5, 10): 9 + (log10(12288) - 3) / 2
    rate = 10 ** (9 + (math.log10(12288) - 3) / 2)
    assert est.total.predicted_s == pytest.approx(1e-6 + 12288 / rate, rel=1e-12)
    assert est.total.host_s == pytest.approx(1e-6)
    assert est.by_family["elementwise"].calls == 1


def test_beyond_the_points_the_nearest_rate_holds() -> None:
    hw = synthetic()
    x = torch.randn(1 << 20)  # 12 MiB moved, beyond the largest point: 1e10 B/s
    _, est = flopscope.estimate.roofline(Add(), x, hardware=hw)
    assert est.total.predicted_s == pytest.approx(1e-6 + 3 * 4 * 2**20 / 1e10, rel=1e-12)


def test_matmul_prediction_uses_the_matmul_rate_and_host() -> None:
    hw = synthetic()
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    class Mm(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a @ b

    _, est = flopscope.estimate.roofline(Mm(), a, b, hardware=hw)
    # 2 x 64^3 FLOPs at 2e9 FLOP/s (the one usable point), plus the matmul host time
    assert est.by_family["matmul"].predicted_s == pytest.approx(2e-6 + 2 * 64**3 / 2e9,
                                                                rel=1e-12)


def test_in_place_calls_take_the_in_place_points() -> None:
    class AddInPlace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.add_(x)

    _, est = flopscope.estimate.roofline(AddInPlace(), torch.randn(1024), hardware=synthetic())
    # 12288 B at the one in-place point's 1e11 B/s (not the fresh-output points' rates)
    assert est.total.predicted_s == pytest.approx(1e-6 + 12288 / 1e11, rel=1e-12)


def test_view_is_host_time_only() -> None:
    class View(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(-1)

    _, est = flopscope.estimate.roofline(View(), torch.randn(4, 4), hardware=synthetic())
    assert est.total.predicted_s == pytest.approx(5e-7)
    assert est.by_family["view"].calls == 1


def test_prediction_is_never_below_the_bound() -> None:
    slow = Hardware("slow", memory_bandwidth=1e6, vector={"fp32": 1e9})
    _, est = flopscope.estimate.roofline(Add(), torch.randn(1024), hardware=synthetic(slow))
    # bound 12288 B / 1e6 B/s = 12.288 ms, far above the calibrated device time
    assert est.total.time_s == pytest.approx(12288 / 1e6)
    assert est.total.predicted_s == pytest.approx(1e-6 + 12288 / 1e6)


def test_family_without_points_is_at_its_bound_and_said_so() -> None:
    hw = synthetic(Hardware("slowish", memory_bandwidth=1e12, vector={"fp32": 1e9}))
    report, est = flopscope.estimate.roofline(nn.ReLU(), torch.randn(256, 256), hardware=hw)
    assert est.by_family == {"elementwise": est.by_family["elementwise"]}  # relu: points exist
    report, est = flopscope.estimate.roofline(nn.Softmax(-1), torch.randn(64, 64), hardware=hw)
    # softmax is a special function: no special points, so its bound plus the elementwise host
    sm = est.by_family["special"]
    assert sm.uncalibrated_s == pytest.approx(sm.predicted_s)
    assert sm.predicted_s == pytest.approx(1e-6 + sm.time_s)
    assert "at the bound: families without calibration points" in str(report)


def test_host_bound_is_detected_and_suggests_graphs() -> None:
    hw = synthetic()
    mlp = nn.Sequential(*[m for _ in range(50) for m in (nn.Linear(16, 16), nn.ReLU())])
    report, est = flopscope.estimate.roofline(mlp, torch.randn(1, 16), hardware=hw)
    summary = est.to_dict()["prediction"]
    assert summary["host_bound"] is True and summary["host_over_device"] > 1
    assert "CUDA graphs" in summary["suggestion"]
    assert "host-bound: host" in str(report) and "CUDA graphs" in str(report)
    big = nn.Linear(512, 512, bias=False)
    _, est = flopscope.estimate.roofline(big, torch.randn(512, 512), hardware=hw)
    assert est.to_dict()["prediction"]["host_bound"] is False


def test_uncalibrated_profile_says_so_and_shows_the_bound_only() -> None:
    # a shipped CPU: no reference calibration (a GPU has one: test_reference.py)
    report, est = flopscope.estimate.roofline(Add(), torch.randn(8), hardware="xeon-8480")
    data = est.to_dict()
    assert data["prediction"]["status"] == "uncalibrated"
    assert "predicted_s" not in data["total"]
    assert "prediction: uncalibrated" in str(report)
    assert "predicted" not in [c.header for c in report.sections[-1].columns()]


def test_calibrated_json_and_table_have_predicted() -> None:
    report, est = flopscope.estimate.roofline(Add(), torch.randn(8), hardware=synthetic())
    data = est.to_dict()
    assert data["prediction"]["status"] == "calibrated"
    assert data["prediction"]["calibrated"] == "2026-11-26T00:00:00+00:00"
    assert data["total"]["predicted_s"] == est.total.predicted_s
    assert data["by_op"]["aten.add.Tensor"]["predicted_s"] == est.total.predicted_s
    assert "prediction (calibrated 2026-11-26" in str(report)
    assert "error bars: none in the profile (not validated)" in str(report)


def test_error_bars_are_printed() -> None:
    hw = synthetic()
    assert hw.calibration is not None
    hw = dataclasses.replace(hw, calibration=dataclasses.replace(
        hw.calibration, error_bars={"elementwise": 0.25, "matmul": 0.1, "total": 0.15}))
    report, _ = flopscope.estimate.roofline(Add(), torch.randn(8), hardware=hw)
    # only the families of this run, and the whole-model bar
    assert "elementwise +-25%, total +-15%" in str(report)


def test_profile_file_round_trips(tmp_path: Path) -> None:
    hw = synthetic()
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(hw.to_dict()))
    (loaded,) = load_hardware(path)
    assert loaded == hw
    assert loaded.calibration is not None and loaded.calibration.points == POINTS
    # a profile without the block is still read (the format is backward compatible)
    del hw.to_dict()["calibration"]
    assert Hardware.from_dict(FAST.to_dict()).calibration is None


def test_bad_calibration_block_is_a_clear_error() -> None:
    data = synthetic().to_dict()
    data["calibration"]["points"][0]["family"] = "matrix"
    with pytest.raises(UsageError, match="point 0: unknown family 'matrix'"):
        Hardware.from_dict(data, where="cal.json")
    data = synthetic().to_dict()
    del data["calibration"]["points"][1]["seconds"]
    with pytest.raises(UsageError, match="cal.json: calibration: point 1 is malformed"):
        Hardware.from_dict(data, where="cal.json")


def test_calibrate_runs_every_family_on_the_cpu() -> None:
    hw = calibrate(get_hardware("epyc-9654"), device="cpu", threads=1, budget_s=0.0005)
    cal = hw.calibration
    assert cal is not None and cal.threads == 1 and cal.device.startswith("cpu")
    assert cal.versions["torch"] == torch.__version__
    assert {p.family for p in cal.points} == set(FAMILIES) - {"view"}
    assert set(cal.host_s) == set(FAMILIES)
    assert all(p.seconds > 0 and (p.flops or p.bytes) for p in cal.points)
    # the same FLOPs flopscope counts: mm 16x16x16 is 2 x 16^3
    assert next(p for p in cal.points if p.what == "mm 16x16x16").flops == 2 * 16**3
    assert hw.matrix == get_hardware("epyc-9654").matrix  # the peaks stay the bound's


def test_cli_calibrate_writes_a_file_count_predicts_with(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the microbenchmarks replaced by the known points (the real ones: the test above)
    def points(device: str, *, budget_s: float, passes: int, progress: object,
               before_pass: Callable[[int], None]) -> list[Point]:
        before_pass(0)  # the host probes' run before the (one) pass
        return list(POINTS)

    monkeypatch.setattr(calibrate_module, "calibration_points", points)
    monkeypatch.setattr(calibrate_module, "op_host_times", lambda device, calls: {})
    monkeypatch.setattr(calibrate_module, "host_times", lambda device, calls: dict(HOST))
    base = tmp_path / "fast.json"
    base.write_text(json.dumps(FAST.to_dict()))
    out = tmp_path / "cal.json"
    r = cli("calibrate", "--hardware", str(base), "--threads", "1", "--output", str(out))
    assert r.code == 0, r.err
    (hw,) = load_hardware(out)
    assert hw.calibration is not None and hw.calibration.points == POINTS
    assert hw.calibration.threads == 1
    r = cli("count", "tiny_models:tiny", "--hardware", str(out), "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)["estimate"]
    assert data["prediction"]["status"] == "calibrated"
    assert data["total"]["predicted_s"] > 0
    r = cli("count", "tiny_models:tiny", "--hardware", str(out))
    assert "predicted" in r.out and "prediction (calibrated" in r.out


@pytest.mark.parametrize(("argv", "message"), [
    (["calibrate"], "--output"),
    (["calibrate", "--output", "-"], "needs a file name"),
    (["calibrate", "--threads", "0", "--output", "x.json"], "--threads"),
    (["calibrate", "--output", "/no/such/dir/x.json"], "no/such/dir"),
])
def test_cli_calibrate_usage_errors(cli: Cli, argv: list[str], message: str) -> None:
    r = cli(*argv)
    assert r.code == 2
    assert message in r.err and "Traceback" not in r.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_cli_calibrate_cuda_without_a_device(cli: Cli, tmp_path: Path) -> None:
    r = cli("calibrate", "--device", "cuda", "--output", str(tmp_path / "x.json"))
    assert r.code == 2 and "torch sees no CUDA device" in r.err


def test_profile_shows_predicted_beside_measured() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    report, timing = flopscope.profile(model, torch.randn(4, 16), hardware=synthetic(),
                                       warmup=1, repeat=2)
    predicted = sum(c.bound.predicted_s for c in timing.calls if c.bound is not None)
    assert predicted > 0
    data = report.to_dict()["measured"]
    # per operator, the calls' predictions summed; over the operators, the run's
    assert sum(v["predicted_s"] or 0.0 for v in data["by_op"].values()) == pytest.approx(predicted)
    assert "predicted (calibrated 2026-11-26, cpu (test), 1 thread)" in str(report)


def test_phases_show_their_prediction() -> None:
    model = nn.Linear(16, 16)
    report, est = flopscope.estimate.roofline(model, torch.randn(4, 16), hardware=synthetic(),
                                              backward=True)
    fwd, bwd = est.by_phase["forward"], est.by_phase["backward"]
    assert fwd.predicted_s + bwd.predicted_s == pytest.approx(est.total.predicted_s)
    assert f"forward: {human_seconds(fwd.time_s)} (predicted {human_seconds(fwd.predicted_s)})" \
        in str(report)
    assert est.to_dict()["by_phase"]["backward"]["predicted_s"] == bwd.predicted_s


def test_cli_generate_predicts_prefill_and_decode(
        cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(synthetic().to_dict()))
    config = [f"--config={k}={v}" for k, v in {
        "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}.items()]
    argv = ["generate", "hf:llama", "--prompt-len", "8", "--new-tokens", "3", "--hardware",
            str(path), *config]
    r = cli(*argv, "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    steps = [s["estimate"]["predicted_s"] for s in data["steps"]]
    guess = data["estimate"]["prediction"]
    assert guess["prefill_s"] == steps[0] > 0
    assert guess["decode_step_s"] == pytest.approx((steps[1] + steps[2]) / 2)
    r = cli(*argv)
    assert r.code == 0, r.err
    assert "prediction (calibrated 2026-11-26, cpu (test), 1 thread): prefill" in r.out
    assert "predicted" in r.out


def test_a_gpu_calibration_overlaps_host_and_device() -> None:
    hw = synthetic()
    assert hw.calibration is not None
    hw = dataclasses.replace(hw, calibration=dataclasses.replace(hw.calibration,
                                                                 device="cuda (test)"))

    class ThreeAdds(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + x + x + x

    report, est = flopscope.estimate.roofline(ThreeAdds(), torch.randn(8), hardware=hw)
    # three adds, each 1 us of host time and d of device time (d << 1 us on this machine):
    # the device runs each once launched, so the step is the host's 3 us plus the last kernel,
    # and the device idles 1 us before the first and 1 us - d before each other
    row = est.by_op["aten.add.Tensor"]
    d = (row.predicted_s - row.host_s) / 3
    assert est.overlapped == pytest.approx((3e-6 + d, 3e-6 - 2 * d), rel=1e-9)
    summary = est.to_dict()["prediction"]
    assert summary["step_s"] == pytest.approx(3e-6 + d, rel=1e-9)
    assert "host and device overlapping" in summary["model"]
    assert "step with host and device overlapping" in str(report)
    _, cpu = flopscope.estimate.roofline(ThreeAdds(), torch.randn(8), hardware=synthetic())
    assert cpu.overlapped is None and "step_s" not in cpu.to_dict()["prediction"]


def test_overlap_of_a_device_bound_stream() -> None:
    from flopscope.estimate.predict import overlapped

    # host 1 s per call, device 3 s: the device is busy from the first launch on
    assert overlapped([(1.0, 3.0)] * 3) == (1.0 + 9.0, 1.0)
    # host 2, device 1: the device waits for each launch (idle 2 + 1 + 1)
    assert overlapped([(2.0, 1.0)] * 3) == (7.0, 4.0)


def test_a_prediction_is_memoised_per_distinct_call_and_equals_a_fresh_one() -> None:
    """Predictor.call keeps one prediction per distinct record (a plan's roles repeat each call
    per layer, microbatch and rank): a memoised answer equals a fresh predictor's, and a record
    that differs in any field the prediction reads is predicted apart."""
    from flopscope.estimate import CallLog
    from flopscope.estimate.predict import Predictor

    cal = get_hardware("h100-sxm").calibration
    assert cal is not None
    # every call after a product takes 1 us more host time (the field main's round 9 added)
    cal = dataclasses.replace(cal, host_after_s={"matmul": 1e-6})
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
    log = CallLog()
    flopscope.count(model, torch.randn(8, 64), observers=[log])
    shared = Predictor(cal)
    for rec in log.records * 2:  # the second pass answered from the memo
        assert shared.call(rec, 1e-6) == Predictor(cal).call(rec, 1e-6)
    gelu = next(r for r in log.records if "gelu" in r.op)
    assert gelu.after == "matmul"
    moved = copy_record(gelu)
    moved.after, moved.modules = "", gelu.modules + 1  # two fields a prediction reads
    a, b = shared.call(gelu, 1e-6), shared.call(moved, 1e-6)
    assert b == Predictor(cal).call(moved, 1e-6)
    # 1 us less after no product, one module call's Python time more, both times the chains'
    # factor for the family at its size (a GPU's host time is scaled by it)
    from flopscope.estimate.families import family

    k = cal.chain_factor(family(gelu), gelu.bytes_written)
    assert b.host_s - a.host_s == pytest.approx(k * (cal.module_call_s - 1e-6), rel=1e-9)
    alone = copy_record(gelu)
    alone.after = ""  # the one field apart: not the memo's answer for gelu
    assert a.host_s - shared.call(alone, 1e-6).host_s == pytest.approx(k * 1e-6, rel=1e-9)


def copy_record(rec: object) -> object:
    """A copy of a call record (its slots)."""
    from flopscope.estimate.call_record import CallRecord

    assert isinstance(rec, CallRecord)
    out = CallRecord(rec.path, rec.phase, rec.op, 0, 0, 0, rec.dtype)
    for name in CallRecord.__slots__:
        setattr(out, name, getattr(rec, name))
    return out
