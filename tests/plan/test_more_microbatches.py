"""A pipeline stage whose step has more microbatches than stages (flopscope.plan.microbatches):
at the step's count its peak memory (to the byte, with where it is reached), report and estimate
equal simulating every microbatch of the step, though the stage is simulated over at most
``pp + 2``."""

from __future__ import annotations

from typing import Any

import pytest
from tests.plan.same_role import assert_same_role

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.roles import RoleKey, Roles, clear_cache
from flopscope.plan.space import Choice

# 4 layers of hidden 256 (4 heads, 2 KV heads, MLP 512), a vocabulary of 4,096, 256 tokens
# per microbatch, bfloat16
SMALL: dict[str, Any] = dict(vocab_size=4096, hidden_size=256, intermediate_size=512,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def _roles(config: dict[str, Any] = SMALL) -> Roles:
    return Roles(build_model("hf:llama", 256, "bfloat16", config), PROFILES["h100-sxm"],
                 ("test_more_microbatches",))


@pytest.mark.parametrize("key", [
    # the first stage: from pp + 1 on, forwards run while all the gradients exist
    RoleKey(tp=1, pp=2, stage=0, dp=2, micro_batch=1, microbatches=4, checkpoint="none",
            peak_microbatches=7),
    # the last, checkpointed: at 7 microbatches the peak moves from lm_head's backward to the
    # step's end, where torch's schedule merges the 7 kept outputs (one more copy of them all)
    RoleKey(tp=1, pp=2, stage=1, dp=2, micro_batch=1, microbatches=4, checkpoint="block",
            peak_microbatches=7),
    # a middle stage of four, and tensor parallelism
    RoleKey(tp=1, pp=4, stage=1, dp=1, micro_batch=1, microbatches=6, checkpoint="none",
            peak_microbatches=9),
    RoleKey(tp=2, pp=2, stage=0, dp=1, micro_batch=1, microbatches=4, checkpoint="none",
            peak_microbatches=7),
])
def test_the_peak_at_the_steps_microbatches_equals_simulating_them(key: RoleKey) -> None:
    clear_cache()
    roles = _roles()
    run = roles.get(key)
    assert roles.simulations == 2  # at pp + 1 and pp + 2 (lined up, not simulated at the step's)
    whole = roles.get(RoleKey(key.tp, key.pp, key.stage, key.dp, key.micro_batch,
                              key.peak_microbatches, key.checkpoint))
    # the peak, the report record for record (work per microbatch and once per step alike),
    # the estimate and the parameter shards at the step's count
    assert_same_role(run, whole)
    assert not run.understated and run.microbatches == key.peak_microbatches
    if key.stage == 1 and key.pp == 2:
        assert (run.memory.peak_module, run.memory.peak_phase, run.memory.peak_op) == (
            "", "forward", "aten.cat.default")


def test_each_microbatch_beyond_adds_the_last_stages_kept_output() -> None:
    clear_cache()
    roles = _roles()

    def peak(m: int) -> int:
        return roles.get(RoleKey(tp=1, pp=2, stage=1, dp=2, micro_batch=1, microbatches=4,
                                 checkpoint="none", peak_microbatches=m)).memory.peak_bytes

    # at lm_head's backward, each microbatch more keeps its logits (256 x 4,096 bfloat16:
    # 2,097,152 bytes), its token ids (256 x 8: 2,048), its loss (one bfloat16: 2) and a
    # 256 x 256 bfloat16 hidden state (131,072): 2,230,274 bytes
    assert peak(6) - peak(5) == 2_230_274 == 256 * 4096 * 2 + 256 * 8 + 2 + 256 * 256 * 2


def test_roles_of_simulates_up_to_two_microbatches_beyond_the_stages() -> None:
    def simulated(pp: int, m: int) -> tuple[int, int]:
        (key, *_) = roles_of(Choice(1, pp, 1, 1, m, "none"), 4)
        return key.microbatches, key.peak_microbatches

    # up to pp + 2 simulated as they are; beyond, at pp + 2 with the peak taken at the step's
    assert [simulated(2, m) for m in (2, 3, 4, 5, 8)] == [(2, 0), (3, 0), (4, 0), (4, 5), (4, 8)]
    assert simulated(1, 8) == (1, 0)  # no stages: accumulated microbatches, one simulated


# about 20 s a stage: the first stage in the slow tier (the last stage has the loss, the
# embedding's gradient comes with the first: each its own case of the peak)
@pytest.mark.parametrize("stage", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_a_stage_from_small_layer_counts_at_the_steps_microbatches(stage: int) -> None:
    # 30 layers: two stages of 15, each put together from 3, 4 and 5 layers, each of those at
    # 3 and 4 microbatches moved to 7 (checked at 5 layers): the same peak as simulating every
    # layer and microbatch
    deep = dict(SMALL, num_hidden_layers=30, vocab_size=1000, hidden_size=64,
                intermediate_size=128)
    clear_cache()
    fast = _roles(deep)
    slow = Roles(build_model("hf:llama", 256, "bfloat16", deep), PROFILES["h100-sxm"],
                 ("test_more_microbatches", "slow"), repeat_layers=False)
    key = RoleKey(tp=1, pp=2, stage=stage, dp=2, micro_batch=1, microbatches=4,
                  checkpoint="block", peak_microbatches=7)
    run = fast.get(key)
    assert fast.simulations == 6  # 3, 4 and 5 layers, each at 3 and 4 microbatches
    whole = slow.get(RoleKey(1, 2, stage, 2, 1, 7, "block"))
    assert_same_role(run, whole)
    assert not run.understated
    clear_cache()


def test_a_deep_pipelines_stage_keeps_the_simulated_peak_and_the_plan_says_so() -> None:
    # 20 stages of one layer: the stages put together from small pipelines of as many
    # microbatches as stages; with 40 microbatches their peak is the 20's, and the note says so
    from tests.plan.test_microbatches import DEEP, SEQ

    clear_cache()
    roles = Roles(build_model("hf:llama", SEQ, "float32", DEEP), PROFILES["h100-sxm"],
                  ("test_more_microbatches", "deep"))
    run = roles.get(RoleKey(tp=1, pp=20, stage=0, dp=1, micro_batch=1, microbatches=20,
                            checkpoint="none", peak_microbatches=40))
    assert run.understated and roles.from_microbatches == 1
    plan = flopscope.plan("hf:llama", gpus=20, hardware="h100-sxm", config=DEEP, seq_len=SEQ,
                          global_batch=40, pp=20, tp=1, dtype="float32",
                          checkpointing=("none",))
    # micro-batches 1 (40 microbatches: below the step's) and 2 (20: the step's)
    assert any("below the step's" in n and "(1 here:" in n for n in plan.notes)
    assert not any("below the step's" in n for n in flopscope.plan(
        "hf:llama", gpus=20, hardware="h100-sxm", config=DEEP, seq_len=SEQ, global_batch=20,
        pp=20, tp=1, dtype="float32", checkpointing=("none",)).notes)
    clear_cache()
