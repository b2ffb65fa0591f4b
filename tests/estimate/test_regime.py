"""The machine's regime at calibration and now (issue 29, round 11): the probe, the check, the
calibration's record of it (old profiles without it still load), and the prediction's words."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from tests.estimate import synthetic
from tests.estimate.synthetic import FAST, Fn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import regime
from flopscope.estimate.bound import prediction_summary
from flopscope.estimate.calibration import Point
from flopscope.estimate.display import prediction_lines

POINTS = (Point("elementwise", "fp32", "mul", 100, 1_000, 2e-6, op="mul"),
          Point("elementwise", "fp32", "mul", 10**7, 10**8, 1e-2, op="mul"))


def test_the_probe_times_one_add() -> None:
    # one add of 2^16 floats (768 KiB moved) takes microseconds at one thread, never a
    # millisecond (at two, a thread that another process's core holds stalls every join)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert 0 < regime.parallel_add_s(batches=3, calls=20) < 1e-3
    finally:
        torch.set_num_threads(before)


def test_two_probes_apart_by_more_than_the_tolerance_are_two_regimes() -> None:
    # round 10's regimes at 2 threads: 6 us calibrated, 8 us now: 8 / 6 = 1.333 > 1 + 0.15
    out = regime.check(6e-6, 8e-6, {"as calibrated": 0.18, "differs": 0.37})
    assert out["ratio"] == pytest.approx(8 / 6, rel=1e-12) and out["differs"]
    assert "8.0 us here against 6.0 us when calibrated (1.33x, slower)" in out["warning"]
    assert "error bar with the regime differing: +-37%" in out["warning"]
    # 6.5 / 6 = 1.083: within 15%, one regime, no warning
    same = regime.check(6e-6, 6.5e-6)
    assert not same["differs"] and "warning" not in same
    # faster by 1 - 4.5 / 6 = 25%: another regime too
    assert "(0.75x, faster)" in regime.check(6e-6, 4.5e-6)["warning"]


def _calibrated(**extra: object) -> flopscope.estimate.Hardware:
    hw = synthetic.calibrated(POINTS, {"elementwise": 1e-6}, FAST, **extra)
    assert hw.calibration is not None
    return dataclasses.replace(hw, calibration=dataclasses.replace(
        hw.calibration, threads=torch.get_num_threads()))


def test_an_old_profile_without_the_regime_loads_and_predicts_without_a_check() -> None:
    old = _calibrated().to_dict()
    assert "parallel_add_s" not in old["calibration"] and "validation" not in old["calibration"]
    hw = type(_calibrated()).from_dict(json.loads(json.dumps(old)))
    assert hw.calibration is not None and hw.calibration.parallel_add_s == 0.0
    assert hw.calibration.validation == {}
    assert regime.of_calibration(hw.calibration) is None  # nothing to compare with
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(Fn(lambda x: x * 2.0), torch.randn(64), hardware=hw)
    assert "regime" not in prediction_summary(est)
    assert not any("regime" in line for line in prediction_lines(est))


def test_the_regime_and_the_validation_round_trip_through_the_profile_file() -> None:
    validation = {"date": "2026-11-28T18:30:00Z", "threads": 2, "load": [1.5, 3.0],
                  "models": 33, "p90_by_regime": {"as calibrated": 0.2, "differs": 0.4}}
    hw = _calibrated(parallel_add_s=6e-6, validation=validation)
    again = type(hw).from_dict(json.loads(json.dumps(hw.to_dict())))
    assert again.calibration == hw.calibration
    bad = hw.to_dict()
    bad["calibration"]["parallel_add_s"] = "fast"
    with pytest.raises(UsageError, match="parallel_add_s must be a number of seconds"):
        type(hw).from_dict(bad)


def test_the_prediction_warns_when_this_process_runs_in_another_regime(
        monkeypatch: pytest.MonkeyPatch) -> None:
    validation = {"date": "2026-11-28T18:30:00Z", "threads": 2, "load": [1.5, 3.0],
                  "models": 33, "p90_by_regime": {"as calibrated": 0.2, "differs": 0.4}}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a regime is a parallel region's: checked at 2 threads or more
    try:
        _warns_at_two_threads(monkeypatch, validation)
        # at 1 thread the probe is a serial add: no check, whatever it measures
        torch.set_num_threads(1)
        one = _calibrated(parallel_add_s=6e-6).calibration
        assert one is not None and one.threads == 1
        assert regime.of_calibration(one) is None
    finally:
        torch.set_num_threads(threads)


def _warns_at_two_threads(monkeypatch: pytest.MonkeyPatch, validation: dict[str, object]) -> None:
    hw = _calibrated(parallel_add_s=6e-6, validation=validation, error_bars={"total": 0.3})
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(Fn(lambda x: x * 2.0), torch.randn(64), hardware=hw)
    monkeypatch.setattr(regime, "now", lambda: 8e-6)
    summary = prediction_summary(est)
    assert summary["regime"]["differs"] and summary["validation"] == validation
    lines = prediction_lines(est)
    assert any(line.startswith("  warning: this process runs in another regime") and
               "+-40%" in line for line in lines)
    assert any("validated 2026-11-28T18:30 at 2 thread(s), load 1.5-3.0, 33 models" in line
               for line in lines)
    monkeypatch.setattr(regime, "now", lambda: 6.3e-6)  # 1.05x: the same regime
    assert not prediction_summary(est)["regime"]["differs"]
    assert not any("warning" in line for line in prediction_lines(est))
