"""A plan's step after its backwards: AdamW's update of the rank's shards and the gradients'
accumulation, counted on fake tensors (flopscope.plan.update)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan.timing import PART_NAMES, describe
from flopscope.plan.update import accumulation_estimate, foreach, update_estimate

CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def test_adamw_update_is_counted_from_torchs_step() -> None:
    # torch's for-loop AdamW step per float32 element (bytes read + written): the decay mul_
    # 4 + 4, lerp_ of the first moment 8 + 4, mul_ of the second 4 + 4, addcmul_ 12 + 4, sqrt
    # 4 + 4, div 4 + 4, add_ of eps 4 + 4, addcdiv_ into the parameter 12 + 4 = 84 bytes, in 8
    # calls; and per parameter its step counter (a float32 scalar): add_ 4 + 4, .item() 4 = 12
    # bytes in 2 calls. A CPU (a measured profile) runs the for-loop: each of 3 shards its own
    hw = PROFILES["h100-sxm"]
    cpu = dataclasses.replace(hw, measured=True)
    assert foreach(hw) and not foreach(cpu)
    row = update_estimate(1000, torch.float32, cpu).by_phase["optimizer"]
    assert (row.bytes, row.calls) == (84 * 1000 + 12, 10)
    three = update_estimate(3000, torch.float32, cpu, tensors=3).by_phase["optimizer"]
    assert (three.bytes, three.calls) == (84 * 3000 + 3 * 12, 3 * 10)
    # at the bound, every call memory-bound on the datasheet's bandwidth
    assert row.time_s == pytest.approx(row.bytes / hw.memory_bandwidth, rel=1e-9)
    # in bfloat16, half the bytes per element; the same calls
    half = update_estimate(1000, torch.bfloat16, cpu).by_phase["optimizer"]
    assert (half.bytes, half.calls) == (42 * 1000 + 12, 10)
    # foreach (a GPU's default): the same 84 bytes per element in one call per operator over
    # the list (_foreach_mul_ twice, lerp_, addcmul_, sqrt, div_ by the bias corrections, add_
    # of eps, addcdiv_: 8; the step counters' _foreach_add_ of a tensor 1.0 (made by
    # lift_fresh, no bytes) 4 + 4 read and 4 written, the two .item() of the bias corrections
    # 4 each: 20 bytes in 4 calls), whatever the number of shards
    for tensors in (1, 3):
        row = update_estimate(3000, torch.float32, hw, tensors=tensors).by_phase["optimizer"]
        assert (row.bytes, row.calls) == (84 * 3000 + 20, 12), tensors
    # one microbatch's gradients added into the accumulated ones: read 2 x 4, write 4, one
    # add_ per gradient shard
    add = accumulation_estimate(1000, torch.float32, hw).total
    assert (add.bytes, add.calls) == (12 * 1000, 1)
    add = accumulation_estimate(1000, torch.float32, hw, tensors=4).total
    assert (add.bytes, add.calls) == (12 * 1000, 4)


def test_the_update_on_dtensors_takes_the_point_wise_dispatch_figure() -> None:
    from flopscope.estimate.calibration import Calibration, Point

    points = (Point("elementwise", "fp32", "add", 100_000, 1_000_000, 1e-6 + 1e-3),)
    cal = Calibration("2026-11-29T00:00:00+00:00", "cpu (test)", 1, {}, {"elementwise": 1e-6},
                      points, dtensor_call_s=1e-4, dtensor_pointwise_s=2e-5)
    hw = dataclasses.replace(PROFILES["h100-sxm"], name="cpu-dtensor-test", calibration=cal)
    plain, sharded = (update_estimate(3000, torch.float32, hw, tensors=3, dtensor=d)
                      .by_phase["optimizer"] for d in (False, True))
    # the for-loop's 8 element-wise operators of each of 3 shards pass DTensor's dispatch (the
    # step counters are plain tensors): 24 calls of no work, each the point-wise 2e-5 s
    assert (sharded.calls - plain.calls, sharded.bytes) == (24, plain.bytes)
    assert sharded.predicted_s - plain.predicted_s == pytest.approx(24 * 2e-5, rel=1e-9)


@pytest.fixture(scope="module")
def plan() -> Any:
    return flopscope.plan("hf:llama", gpus=2, hardware="h100", config=CONFIG, seq_len=256,
                          global_batch=4)


def test_a_plans_step_has_the_update_and_the_accumulation(plan: Any) -> None:
    by = {c.choice.label: c for c in (*plan.ranked, *plan.dropped)}
    for c in by.values():
        t = c.time
        assert t.optimizer > 0 and t.total == pytest.approx(sum(t.parts().values()))
        assert PART_NAMES["optimizer"] in [p for p, _, _ in describe(t)]
    # without stages at 2 microbatches of 1 sequence: one accumulation of the rank's gradient
    # shards (FSDP2 over 2 ranks: half the parameters), at one microbatch none; a pipeline
    # stage's accumulation is in its backward (its simulated microbatches)
    fsdp2, fsdp1 = by["TP1 PP1 DP2 mb1x2"], by["TP1 PP1 DP2 mb2x1"]
    assert fsdp1.time.accumulation == 0 and fsdp2.time.accumulation > 0
    assert all(c.time.accumulation == 0 for c in by.values() if c.choice.pp > 1)
    # the same rank's update at either micro-batch: the same shards
    assert fsdp2.time.optimizer == fsdp1.time.optimizer


def test_accumulation_passes_dtensors_dispatch_only_without_fsdp2() -> None:
    from flopscope.estimate import get_hardware
    from flopscope.plan.roles import clear_cache

    clear_cache()
    shipped = get_hardware("h100-sxm")  # its reference calibration, DTensor's figures set to 0
    assert shipped.calibration is not None  # (a point-wise figure of 0 takes the call's)
    base, framed = (dataclasses.replace(shipped, name=f"h100-pointwise-test-{s}",
                                        calibration=dataclasses.replace(
                                            shipped.calibration, dtensor_call_s=0.0,
                                            dtensor_pointwise_s=s))
                    for s in (0.0, 1e-3))
    args: dict[str, Any] = dict(gpus=2, config=CONFIG, seq_len=64, global_batch=4,
                                checkpointing=("none",))
    plain, priced = ({c.choice.label: c for c in flopscope.plan("hf:llama", hardware=hw,
                                                                 **args).ranked}
                     for hw in (base, framed))
    # TP 2 alone (bfloat16, no mixed precision: no FSDP2): the 2nd microbatch's gradients are
    # added into the first's by autograd on the DTensor parameters, 4 x 9 + 3 = 39 of them, one
    # point-wise add each through DTensor's dispatch at 1e-3 s
    tp = "TP2 PP1 DP1 mb2x2"
    assert priced[tp].time.accumulation - plain[tp].time.accumulation == pytest.approx(
        39 * 1e-3, rel=1e-9)
    # FSDP 2 adds the reduced shards' local tensors: no DTensor dispatch, the same time
    fsdp = "TP1 PP1 DP2 mb1x2"
    assert priced[fsdp].time.accumulation == plain[fsdp].time.accumulation > 0


def test_a_role_holds_its_parameter_shards_count_and_kind() -> None:
    """The update's calls per parameter need how many shards a rank holds and whether they are
    DTensors: carried from the simulation, and through the put-together of small runs."""
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles, clear_cache

    clear_cache()
    # 13 layers: a stage of more than sum(SMALL) layers is put together from small runs
    config = {**CONFIG, "num_hidden_layers": 13}
    roles = Roles(build_model("hf:llama", 64, "float32", config), PROFILES["h100-sxm"],
                  ("test_update_shards",))
    # a Llama layer holds 9 parameters (q, k, v, o, gate, up, down, two norms); outside the
    # layers the embedding, the final norm and the head: 13 x 9 + 3 = 120
    fsdp = roles.get(RoleKey(1, 1, 0, 2, 1, 1, "none"))
    assert (fsdp.parameter_tensors, fsdp.parameters_dtensor) == (120, True)
    # two stages without data parallelism: plain tensors; split_layers gives the first stage
    # 7 layers and the embedding (64), the second 6 and the norm and head (56)
    first, last = (roles.get(RoleKey(1, 2, s, 1, 1, 2, "none")) for s in (0, 1))
    assert (first.parameter_tensors, first.parameters_dtensor) == (7 * 9 + 1, False)
    assert (last.parameter_tensors, last.parameters_dtensor) == (6 * 9 + 2, False)
    clear_cache()
