"""A plan's step after its backwards: AdamW's update of the rank's shards and the gradients'
accumulation, counted on fake tensors (flopscope.plan.update)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan.timing import PART_NAMES, describe
from flopscope.plan.update import accumulation_estimate, update_estimate

CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def test_adamw_update_is_counted_from_torchs_step() -> None:
    # torch's AdamW step per float32 element (bytes read + written): the decay mul_ 4 + 4,
    # lerp_ of the first moment 8 + 4, mul_ of the second 4 + 4, addcmul_ 12 + 4, sqrt 4 + 4,
    # div 4 + 4, add_ of eps 4 + 4, addcdiv_ into the parameter 12 + 4 = 84 bytes, in 8 calls;
    # and the step counter (a float32 scalar): its add_ 4 + 4 and .item() 4 = 12 bytes
    hw = PROFILES["h100-sxm"]
    est = update_estimate(1000, torch.float32, hw)
    row = est.by_phase["optimizer"]
    assert (row.bytes, row.calls) == (84 * 1000 + 12, 10)
    # at the bound, every call memory-bound on the datasheet's bandwidth
    assert row.time_s == pytest.approx(row.bytes / hw.memory_bandwidth, rel=1e-9)
    # in bfloat16, half the bytes per element; the same calls
    half = update_estimate(1000, torch.bfloat16, hw).by_phase["optimizer"]
    assert (half.bytes, half.calls) == (42 * 1000 + 12, 10)
    # one microbatch's gradients added into the accumulated ones: read 2 x 4, write 4
    add = accumulation_estimate(1000, torch.float32, hw).total
    assert (add.bytes, add.calls) == (12 * 1000, 1)


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
