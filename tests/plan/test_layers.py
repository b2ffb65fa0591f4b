"""Roles put together from three small layer counts (flopscope.plan.layers): the same report,
peak memory (to the byte, with where it is reached) and time as simulating every layer."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from tests.plan.same_role import assert_same_role

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan import planner
from flopscope.plan.build import build_model
from flopscope.plan.roles import RoleKey, Roles, clear_cache

# 24 layers, hidden 64 (4 heads of 16, 2 KV heads), MLP 128, a vocabulary of 16,384 and 96
# tokens: FSDP2's gathered embedding and head (2 x 16,384 x 64 parameters) outweigh the
# activations of a few layers, so with 3, 4 and 5 layers (the small runs) a TP2 x FSDP2 rank
# peaks at the root's all-gather in forward (36,098,760, 36,247,240 and 36,395,720 bytes), and
# with all 24 at lm_head's backward: a line through the small peaks would be wrong
MOVING: dict[str, Any] = dict(vocab_size=16384, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=24, num_attention_heads=4,
                              num_key_value_heads=2)
SEQ = 96


def _roles(repeat: bool, config: dict[str, Any] = MOVING) -> Roles:
    return Roles(build_model("hf:llama", SEQ, "float32", config), PROFILES["h100-sxm"],
                 ("test_layers", repeat), repeat_layers=repeat)


@pytest.mark.parametrize("key", [
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1, checkpoint=False),
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1, checkpoint=True),
    RoleKey(tp=1, pp=1, stage=0, dp=4, micro_batch=2, microbatches=1, checkpoint=False),
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1, checkpoint="selective"),
])
def test_a_role_from_small_layer_counts_equals_the_whole_simulation(key: RoleKey) -> None:
    clear_cache()
    fast_roles, slow_roles = _roles(True), _roles(False)
    fast, slow = fast_roles.get(key), slow_roles.get(key)
    assert (fast_roles.from_small, slow_roles.from_small) == (1, 0)
    assert_same_role(fast, slow)
    if key == RoleKey(2, 1, 0, 2, 1, 1, False):
        # the peak moved out of the root's gather (see MOVING): the layers' activations and the
        # logits' gradient at the head's backward
        assert (fast.memory.peak_module, fast.memory.peak_phase) == ("lm_head", "backward")
        # 39,923,784 before the memory tracker followed FSDP2's storage resizes, less the 24
        # layers' gathered parameters it freed after their forward: per layer and TP2 rank
        # (q 64x64 + k, v 32x64 + o 64x64 + gate, up, down 64x128) / 2 + two norms of 64 =
        # 18,560 fp32 parameters = 74,240 bytes; x 24 = 1,781,760; less the logits, released
        # once the loss is computed, as trainers do (1 x 96 tokens x 16,384 x 4 bytes =
        # 6,291,456: autograd keeps the log-softmax, not the logits)
        assert fast.memory.peak_bytes == 39_923_784 - 1_781_760 - 6_291_456


# 30 layers: two stages of 15, each with 2 microbatches in flight; FSDP2 under torch's pipeline
# schedule reduces every layer's gradients at the stage's root after the last microbatch (calls
# outside the layers that repeat per layer)
PIPELINE: dict[str, Any] = dict(MOVING, vocab_size=1000, num_hidden_layers=30)


@pytest.mark.parametrize("key", [
    RoleKey(tp=1, pp=2, stage=0, dp=2, micro_batch=1, microbatches=2, checkpoint=False),
    RoleKey(tp=2, pp=2, stage=1, dp=1, micro_batch=2, microbatches=2, checkpoint=True),
])
def test_a_pipeline_stage_from_small_layer_counts_equals_the_whole_simulation(
        key: RoleKey) -> None:
    clear_cache()
    fast_roles, slow_roles = _roles(True, PIPELINE), _roles(False, PIPELINE)
    fast, slow = fast_roles.get(key), slow_roles.get(key)
    assert (fast_roles.from_small, slow_roles.from_small) == (1, 0)
    assert_same_role(fast, slow)


def test_a_stage_of_few_layers_is_simulated_whole() -> None:
    # 24 layers in 2 stages: 12 per stage, no more than the small runs' 3 + 4 + 5
    clear_cache()
    roles = _roles(True)
    roles.get(RoleKey(tp=1, pp=2, stage=0, dp=2, micro_batch=1, microbatches=2,
                      checkpoint=False))
    assert (roles.simulations, roles.from_small) == (1, 0)


@pytest.mark.slow  # about 25 s: a whole plan twice; the roles' equality is the default tier's
def test_a_plan_is_the_same_with_roles_from_small_layer_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    args: dict[str, Any] = dict(gpus=2, hardware="h100-sxm", config=MOVING, seq_len=SEQ,
                                global_batch=2, dtype="float32", checkpointing=("none",),
                                memory_budget=40_000_000)
    clear_cache()
    fast = flopscope.plan("hf:llama", **args)
    clear_cache()
    monkeypatch.setattr(planner, "Roles", functools.partial(Roles, repeat_layers=False))
    slow = flopscope.plan("hf:llama", **args)
    clear_cache()

    def figures(p: planner.Plan) -> list[tuple[Any, ...]]:
        return [(c.choice, c.memory_bytes, c.at_peak, c.peak_where, c.fits, c.reason)
                for c in (*p.ranked, *p.dropped)]

    assert figures(fast) == figures(slow)
    # MFU's numerator, also from small layer counts: the whole model's forward + backward FLOPs
    # for one sequence, counted every layer, times the global batch of 2
    model, args, kwargs = build_model("hf:llama", SEQ, "float32", MOVING)(1, "none")
    whole = flopscope.count(model, flopscope.Inputs(*args, **kwargs), backward=True,
                            shape_only=True, warn=False)
    assert fast.model_flops == slow.model_flops == whole.flops * 2
    assert [c.choice for c in fast.pareto] == [c.choice for c in slow.pareto]
    for a, b in zip((*fast.ranked, *fast.dropped), (*slow.ranked, *slow.dropped), strict=True):
        for part, seconds in b.time.to_dict().items():
            assert math.isclose(a.time.to_dict()[part], seconds, rel_tol=1e-12, abs_tol=1e-18)
