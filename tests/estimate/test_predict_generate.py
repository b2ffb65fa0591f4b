"""``flopscope generate --hardware FILE`` with a calibrated profile and measured times prints
the MFU to expect beside the measured one, as ``count --step-time`` does (issue 29): the same
model FLOPs and peak over the predicted prefill and decode step times."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cli.conftest import Result
from tests.estimate.synthetic import FAST

from flopscope.estimate import Calibration
from flopscope.estimate.calibration import Point

Cli = Callable[..., Result]

CALIBRATED = dataclasses.replace(FAST, calibration=Calibration(
    "2026-11-27T00:00:00+00:00", "cpu (test)", 1, {"torch": "x"},
    {"elementwise": 1e-6, "matmul": 2e-6, "view": 5e-7},
    (Point("elementwise", "fp32", "add", 1_000, 10_000, 2e-6),
     Point("matmul", "fp32", "mm", 2_000_000, 10_000, 2e-6 + 1e-3))))
CONFIG = [f"--config={k}={v}" for k, v in {
    "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}.items()]


def test_generate_prints_the_mfu_to_expect_beside_the_measured(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(CALIBRATED.to_dict()))
    argv = ["generate", "hf:llama", "--prompt-len", "8", "--new-tokens", "3", "--hardware",
            str(path), "--step-time", "0.01", "--prefill-time", "0.02", "--peak-tflops", "1",
            *CONFIG]
    r = cli(*argv, "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    measured, expected = data["utilization"], data["expected_utilization"]
    steps = [s["estimate"]["predicted_s"] for s in data["steps"]]  # a CPU: the calls' sum
    assert [u["from"] for u in expected] == ["the calibrated prediction"] * 2
    # the prefill: its predicted time; the decode: 2 steps at their mean predicted time
    assert expected[0]["seconds"] == pytest.approx(steps[0], rel=1e-12)
    assert expected[1]["seconds"] == pytest.approx(steps[1] + steps[2], rel=1e-12)
    for m, e in zip(measured, expected, strict=True):  # the same FLOPs and peak
        assert (e["model_flops"], e["peak_flops"]) == (m["model_flops"], 1e12)
        assert e["mfu"] == pytest.approx(m["mfu"] * m["seconds"] / e["seconds"], rel=1e-12)
    r = cli(*argv)
    assert r.code == 0, r.err
    lines = [x for x in r.out.splitlines() if x.startswith("expected from the prediction (")]
    assert len(lines) == 2 and "not measured): prefill" in lines[0] and "MFU" in lines[1]


def test_generate_without_measured_times_or_calibration_prints_no_expected_mfu(
        cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(CALIBRATED.to_dict()))
    base = ["generate", "hf:llama", "--prompt-len", "8", "--new-tokens", "3", *CONFIG]
    r = cli(*base, "--hardware", str(path), "--format", "json")  # no time measured
    assert r.code == 0, r.err
    assert "expected_utilization" not in json.loads(r.out)
    r = cli(*base, "--hardware", "xeon-8480", "--step-time", "0.01", "--format", "json")
    assert r.code == 0, r.err  # uncalibrated (a shipped CPU): the measured MFU only
    data = json.loads(r.out)
    assert data["utilization"] and "expected_utilization" not in data
