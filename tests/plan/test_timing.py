"""plan.timing.step_time: compute from the calibrated prediction where the profile has a
calibration block, the bound otherwise; communication through estimate.comm_time (issue 29)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import flopscope
from flopscope.estimate import PROFILES
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
    return dataclasses.replace(PROFILES["h100-sxm"], name="h100-calibrated", calibration=cal)


def test_step_time_takes_the_prediction_when_calibrated() -> None:
    clear_cache()
    args: dict[str, Any] = dict(gpus=2, config=CONFIG, seq_len=64, global_batch=2,
                                dtype="float32", checkpointing=("none",))
    bound = flopscope.plan("hf:llama", hardware=PROFILES["h100-sxm"], **args)
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
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles

    fsdp = p["TP1 PP1 DP2 mb1x1"]
    roles = Roles(build_model("hf:llama", 64, "float32", CONFIG), hw,
                  ("hf:llama", 64, "float32", tuple(sorted(CONFIG.items()))))
    run = roles.get(RoleKey(1, 1, 0, 2, 1, 1, False, loss="cross_entropy"))  # the plan's role
    assert run.estimate.calibrated
    assert fsdp.time.forward == pytest.approx(run.estimate.by_phase["forward"].predicted_s)
    # and its FSDP2 communication is comm_time's overlap rule on the same records (nothing
    # blocking, no wait for the host: the first all-gather + what the rest need beyond busy)
    links = Links.of(hw, 8)
    comm = comm_time(run.report.communication, links, tp=1, dp=2, gpus=2)
    busy = fsdp.time.forward + fsdp.time.backward
    assert fsdp.time.fsdp_comm == pytest.approx(comm.exposure(busy).fsdp)
    assert fsdp.time.fsdp_hidden == pytest.approx(comm.overlapped_first + comm.overlapped_rest
                                                  - fsdp.time.fsdp_comm)


def test_fsdp2_hooks_and_dtensor_dispatch_take_their_measured_host_time() -> None:
    from flopscope.estimate.calibration import DTENSOR_DISPATCH, DTENSOR_POINTWISE
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles
    from flopscope.plan.timing import describe

    clear_cache()
    base = _calibrated()
    assert base.calibration is not None
    hw = dataclasses.replace(base, name="h100-framework", calibration=dataclasses.replace(
        base.calibration, fsdp_collective_s=1e-3, dtensor_call_s=1e-4, dtensor_pointwise_s=2e-5))
    args: dict[str, Any] = dict(gpus=2, config=CONFIG, seq_len=64, global_batch=2,
                                dtype="float32", checkpointing=("none",))
    plain = {c.choice.label: c for c in flopscope.plan("hf:llama", hardware=base, **args).ranked}
    framed = {c.choice.label: c for c in flopscope.plan("hf:llama", hardware=hw, **args).ranked}
    roles = Roles(build_model("hf:llama", 64, "float32", CONFIG), hw,
                  ("hf:llama", 64, "float32", tuple(sorted(CONFIG.items()))))
    # FSDP 2: the root's and both layers' all-gathers in the forward, the root's and the last
    # layer's again in the backward, three reduce-scatters: 8 collectives at 1 ms
    run = roles.get(RoleKey(1, 1, 0, 2, 1, 1, False, loss="cross_entropy"))
    gathers = [c.calls for c in run.report.communication
               if c.kind in ("all_gather", "reduce_scatter")]
    assert sum(gathers) == 8
    fsdp = framed["TP1 PP1 DP2 mb1x1"]
    assert fsdp.time.fsdp_hooks == pytest.approx(8e-3, rel=1e-12)
    assert plain["TP1 PP1 DP2 mb1x1"].time.fsdp_hooks == 0.0  # not measured: not charged
    assert ("FSDP2 hooks (host)", pytest.approx(8e-3), pytest.approx(8e-3 / fsdp.time.total)) in \
        describe(fsdp.time)
    # TP 2: every outermost operator on DTensors is a call of no work whose prediction is the
    # measured 1e-4 s of host time; the forward and backward grow by exactly that. None is
    # point-wise (the 2e-5 s figure): the layout hands the sharded layers' outputs on as local
    # tensors (tests/plan/test_update.py has the update's point-wise calls on DTensors)
    tp = roles.get(RoleKey(2, 1, 0, 1, 2, 1, False, loss_parallel=True, loss="cross_entropy"))
    dispatch = tp.estimate.by_op[DTENSOR_DISPATCH]
    assert DTENSOR_POINTWISE not in tp.estimate.by_op
    assert dispatch.calls > 0 and dispatch.time_s == 0.0  # no work: no bound
    assert dispatch.predicted_s == pytest.approx(dispatch.calls * 1e-4, rel=1e-9)
    a, b = plain["TP2 PP1 DP1 mb2x1"].time, framed["TP2 PP1 DP1 mb2x1"].time
    assert (b.forward + b.backward) - (a.forward + a.backward) == pytest.approx(
        dispatch.calls * 1e-4, rel=1e-9)
    assert b.fsdp_hooks == 0.0  # no FSDP2 in a TP 2 x DP 1 layout


def test_a_shipped_gpu_plans_with_its_reference_prediction_and_the_bound_beside() -> None:
    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model
    from flopscope.plan.display import plan_text
    from flopscope.plan.roles import RoleKey, Roles

    clear_cache()
    args: dict[str, Any] = dict(gpus=2, config=CONFIG, seq_len=64, global_batch=2,
                                checkpointing=("none",))
    hw = get_hardware("h100-sxm")
    cal = hw.calibration
    assert cal is not None and cal.reference and cal.device.startswith("cuda")
    predicted = flopscope.plan("hf:llama", hardware="h100-sxm", **args)
    bound = flopscope.plan("hf:llama", hardware=PROFILES["h100-sxm"], **args)
    p = {c.choice.label: c for c in (*predicted.ranked, *predicted.dropped)}
    b = {c.choice.label: c for c in (*bound.ranked, *bound.dropped)}
    assert set(p) == set(b)
    for label, c in p.items():
        assert c.time.compute == "prediction" and c.bound_time is not None
        # the bound beside is the datasheet profile's plan, to the bit (the same counts, the
        # same roofline; the role cache keeps the two apart by calibration)
        assert c.bound_time == b[label].time and b[label].bound_time is None
        assert c.mfu_bound == pytest.approx(b[label].mfu, rel=1e-12)
        assert c.mfu < c.mfu_bound  # the prediction is slower than the bound
    # a GPU's phase: the longer of its calls' host and device times (the host issues ahead)
    fsdp = p["TP1 PP1 DP2 mb1x1"]
    roles = Roles(build_model("hf:llama", 64, "bfloat16", CONFIG), hw,
                  ("hf:llama", 64, "bfloat16", tuple(sorted(CONFIG.items()))))
    row = roles.get(RoleKey(1, 1, 0, 2, 1, 1, False, loss="cross_entropy")).estimate.by_phase[
        "forward"]
    assert roles.simulations == 0  # the plan's role, cached under the calibrated profile
    assert fsdp.time.forward == max(row.host_s, row.predicted_s - row.host_s)
    # labelled: the note, the JSON, the table
    assert "compute from predictions from a reference calibration (" + cal.source() in \
        predicted.notes[0]
    assert "+-68%" in predicted.notes[0] and "MFU (bound)" in predicted.notes[0]
    data = predicted.to_dict()
    assert data["time_model"] == "prediction" and bound.to_dict()["time_model"] == \
        "roofline lower bound"
    assert data["prediction"]["source"] == cal.source() and data["prediction"]["reference"]
    assert data["prediction"]["error_bars"]["total"] == cal.error_bars["total"]
    assert bound.to_dict()["prediction"] is None
    row0 = data["ranked"][0]
    assert row0["time_kind"] == "prediction" and row0["mfu"] == predicted.ranked[0].mfu
    assert row0["bound_time_s"] == predicted.ranked[0].bound_step.to_dict()
    text = plan_text(predicted)
    assert "MFU (bound)" in text and "step (bound)" in text
    assert "step, MFU: predicted from a reference calibration (" + cal.source() in text
    assert "MFU (bound)" not in plan_text(bound)


def test_a_sweep_table_says_what_its_times_are() -> None:
    """A sweep's table (several plans streamed) names its times in its first line, as one
    plan's table does under it: a shipped GPU's step is a prediction from its reference with
    its error bar, the datasheet profile's the bound; a serving sweep's likewise."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.display import sweep_header
    from flopscope.plan.time_words import validated_on

    hw = get_hardware("h100-sxm")
    cal = hw.calibration
    assert cal is not None and cal.reference
    first, header, rule = sweep_header("train", hw)
    assert first.startswith("step, MFU: predictions from a reference calibration ("
                            + cal.source())
    assert "error bar +-68%" in first and "MFU (bound)" in header
    assert sweep_header("train", PROFILES["h100-sxm"])[0] == \
        "step, MFU: roofline lower bounds (every call at peak rate or bandwidth)"
    # a serving sweep's: the prediction too, and what its error bar was measured on
    serve = sweep_header("serve", hw)[0]
    assert serve.startswith("tok/s/GPU, per token: predictions from a reference calibration ("
                            + cal.source())
    assert "error bar +-68%" in serve and validated_on(cal) in serve
    assert sweep_header("serve", PROFILES["h100-sxm"])[0] == \
        "tok/s/GPU, per token: roofline lower bounds (every call at peak rate or bandwidth)"
    assert sweep_header("train") == [header, rule]  # without a profile: the columns alone
