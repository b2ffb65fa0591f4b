"""plan.timing.step_time: compute from the calibrated prediction where the profile has a
calibration block, the bound otherwise; communication through estimate.comm_time (issue 29)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import flopscope
from flopscope.estimate import get_hardware
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.comm_time import Links, comm_time
from flopscope.plan.roles import clear_cache

CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=128, intermediate_size=256,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _calibrated() -> Any:
    # every matrix product at 1e9 FLOP/s of device time, element-wise at 1e9 B/s; 1 us host
    points = (Point("matmul", "fp32", "mm", 2_000_000, 10_000, 1e-6 + 2e-3),
              Point("elementwise", "fp32", "add", 100_000, 1_000_000, 1e-6 + 1e-3))
    cal = Calibration("2026-11-27T00:00:00+00:00", "cpu (test)", 1, {}, {"matmul": 1e-6,
                      "elementwise": 1e-6}, points)
    return dataclasses.replace(get_hardware("h100"), name="h100-calibrated", calibration=cal)


def test_step_time_takes_the_prediction_when_calibrated() -> None:
    clear_cache()
    args: dict[str, Any] = dict(gpus=2, config=CONFIG, seq_len=64, global_batch=2,
                                dtype="float32", checkpointing=("none",))
    bound = flopscope.plan("hf:llama", hardware="h100", **args)
    hw = _calibrated()
    predicted = flopscope.plan("hf:llama", hardware=hw, **args)
    b = {c.choice.label: c for c in bound.ranked}
    p = {c.choice.label: c for c in predicted.ranked}
    assert set(b) == set(p)
    for label, c in p.items():
        assert c.time.compute == "prediction" and b[label].time.compute == "bound"
        # the calibrated rates (1 GFLOP/s, 1 GB/s) are far below the H100's peaks
        assert c.time.forward > 100 * b[label].time.forward
    assert "compute from calibrated predictions" in predicted.notes[0]
    assert "compute from roofline lower bounds" in bound.notes[0]
    # the planner's forward is the role's predicted forward (one rank, one microbatch: no
    # scaling): the same number the rank's estimate gives
    from flopscope.plan.planner import build_model
    from flopscope.plan.roles import RoleKey, Roles

    fsdp = p["TP1 PP1 DP2 mb1x1"]
    roles = Roles(build_model("hf:llama", 64, "float32", CONFIG), hw,
                  ("hf:llama", 64, "float32", tuple(sorted(CONFIG.items()))))
    run = roles.get(RoleKey(1, 1, 0, 2, 1, 1, False, loss="cross_entropy"))  # the plan's role
    assert run.estimate.calibrated
    assert fsdp.time.forward == pytest.approx(run.estimate.by_phase["forward"].predicted_s)
    # and its FSDP2 communication is comm_time's overlap rule on the same records
    links = Links.of(hw, 8)
    comm = comm_time(run.report.communication, links, tp=1, dp=2, gpus=2)
    busy = fsdp.time.forward + fsdp.time.backward
    assert fsdp.time.fsdp_comm == pytest.approx(comm.overlapped_exposed(busy))
    assert fsdp.time.fsdp_hidden == pytest.approx(comm.overlapped_first + comm.overlapped_rest
                                                  - fsdp.time.fsdp_comm)
