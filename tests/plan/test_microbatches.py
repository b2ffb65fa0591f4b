"""Pipeline stages put together from three small pipelines (flopscope.plan.layers, microbatches):
the same report, peak memory (to the byte, with where it is reached) and time as simulating every
microbatch of the stage, and the planner's table the same."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from tests.plan.same_role import assert_same_role, memory

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan import layers, planner
from flopscope.plan import roles as roles_module
from flopscope.plan.build import build_model
from flopscope.plan.roles import RoleKey, RoleRun, Roles, clear_cache

# 20 layers of hidden 64 (4 heads of 16, 2 KV heads, MLP 128), a vocabulary of 1,000, 32
# tokens: a pipeline of 20 stages (one layer each) runs 20 microbatches, more than the small
# pipelines' 5 + 6 + 7
DEEP: dict[str, Any] = dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=20, num_attention_heads=4, num_key_value_heads=2)
SEQ = 32


def _roles(fast: bool, config: dict[str, Any] = DEEP) -> Roles:
    return Roles(build_model("hf:llama", SEQ, "float32", config), PROFILES["h100-sxm"],
                 ("test_microbatches", fast), repeat_microbatches=fast)


@pytest.fixture(scope="module")
def whole() -> Callable[[RoleKey], tuple[RoleRun, int]]:
    """A stage simulated with every microbatch (``repeat_microbatches=False``) and that roles'
    ``from_microbatches``, once per stage in the module: the second stage at FSDP 2 is compared
    by two tests (about 4 s of CPU each time)."""
    made: dict[RoleKey, tuple[RoleRun, int]] = {}

    def get(key: RoleKey) -> tuple[RoleRun, int]:
        if key not in made:
            roles = _roles(False)
            made[key] = roles.get(key), roles.from_microbatches
        return made[key]

    return get


@pytest.mark.parametrize("key", [
    # the first stage (the embedding): every forward, then every backward
    RoleKey(tp=1, pp=20, stage=0, dp=2, micro_batch=1, microbatches=20, checkpoint=False),
    # the second: 19 forwards, one backward, one forward, then the rest; FSDP2 gathers the
    # layer again for the backward after that forward (its peak: model.layers.1 at resize_)
    RoleKey(tp=1, pp=20, stage=1, dp=2, micro_batch=1, microbatches=20, checkpoint=False),
    RoleKey(tp=2, pp=20, stage=1, dp=1, micro_batch=2, microbatches=20, checkpoint=True),
    RoleKey(tp=2, pp=20, stage=0, dp=2, micro_batch=1, microbatches=20, checkpoint=True),
    # the last (the head, its layer model.layers.19 where the small pipelines have 4, 5, 6):
    # a forward and a backward in turn, every microbatch's logits kept to the step's end
    RoleKey(tp=2, pp=20, stage=19, dp=2, micro_batch=1, microbatches=20, checkpoint=False),
])
def test_a_stage_from_small_pipelines_equals_the_whole_simulation(
        key: RoleKey, whole: Callable[[RoleKey], tuple[RoleRun, int]]) -> None:
    clear_cache()
    fast_roles = _roles(True)
    fast, (slow, slow_from_microbatches) = fast_roles.get(key), whole(key)
    assert (fast_roles.from_microbatches, slow_from_microbatches) == (1, 0)
    assert_same_role(fast, slow)
    if key.stage == 1 and key.dp == 2:
        assert (fast.memory.peak_module, fast.memory.peak_phase, fast.memory.peak_op) == (
            "model.layers.1", "backward", "resize_")


def test_stages_the_small_pipelines_cannot_stand_for_are_simulated_whole() -> None:
    clear_cache()
    roles = _roles(True)
    # a later middle stage (its forwards after the first backward keep as many in flight as
    # before it, not one more each), and a pipeline of no more stages than 5 + 6 + 7 = 18
    roles.get(RoleKey(tp=1, pp=20, stage=5, dp=1, micro_batch=1, microbatches=20,
                      checkpoint=False))
    roles.get(RoleKey(tp=1, pp=10, stage=1, dp=1, micro_batch=1, microbatches=10,
                      checkpoint=False))
    # 21 layers in 20 stages: the first holds two, so the second's layer is model.layers.2,
    # not where a small pipeline of one layer per stage has it
    uneven = _roles(True, dict(DEEP, num_hidden_layers=21))
    uneven.get(RoleKey(tp=1, pp=20, stage=1, dp=1, micro_batch=1, microbatches=20,
                       checkpoint=False))
    assert (roles.simulations, roles.from_microbatches) == (2, 0)
    assert (uneven.simulations, uneven.from_microbatches) == (1, 0)


def test_small_pipelines_that_do_not_line_up_are_refused(
        monkeypatch: pytest.MonkeyPatch, whole: Callable[[RoleKey], tuple[RoleRun, int]]) -> None:
    # taking only the first and last microbatch as boundaries (pipelines of 3, 4 and 5 stages):
    # the second stage's backward after its one steady forward gathers the layer again (FSDP2),
    # so its calls are not those of the backwards after it; refused, the stage simulated whole
    monkeypatch.setattr(layers, "UNIT_WIDTH", 1)
    monkeypatch.setattr(roles_module, "UNIT_SMALL", (3, 4, 5))
    clear_cache()
    fast_roles = _roles(True)
    key = RoleKey(tp=1, pp=20, stage=1, dp=2, micro_batch=1, microbatches=20, checkpoint=False)
    fast, (slow, _) = fast_roles.get(key), whole(key)  # every microbatch: no small pipeline
    assert (fast_roles.simulations, fast_roles.from_microbatches) == (1, 0)
    assert fast.report == slow.report
    assert memory(fast) == memory(slow)


@pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"),
                    reason="slow tier: FLOPSCOPE_SLOW=1 (two whole 40-GPU plans, minutes)")
def test_a_plan_is_the_same_with_stages_from_small_pipelines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 GPUs as TP 2 x PP 20: every stage a role (first, second, last), the first two from
    # small pipelines; a budget between the stages' peaks, so one layout is dropped
    args: dict[str, Any] = dict(gpus=40, hardware="h100-sxm", config=DEEP, seq_len=SEQ,
                                global_batch=20, dtype="float32", checkpointing=("none", "block"),
                                pp=20, tp=2)
    clear_cache()
    fast = flopscope.plan("hf:llama", **args)
    clear_cache()
    monkeypatch.setattr(planner, "Roles", functools.partial(Roles, repeat_microbatches=False))
    slow = flopscope.plan("hf:llama", **args)
    clear_cache()

    def figures(p: planner.Plan) -> list[tuple[Any, ...]]:
        return [(c.choice, c.memory_bytes, c.at_peak, c.peak_where, c.fits, c.reason)
                for c in (*p.ranked, *p.dropped)]

    assert figures(fast) == figures(slow)
    assert [c.choice for c in fast.pareto] == [c.choice for c in slow.pareto]
    for a, b in zip((*fast.ranked, *fast.dropped), (*slow.ranked, *slow.dropped), strict=True):
        for part, seconds in b.time.to_dict().items():
            assert math.isclose(a.time.to_dict()[part], seconds, rel_tol=1e-12, abs_tol=1e-18)
