"""Roles at a third FSDP2 degree from two others (flopscope.plan.degrees): the same report,
peak memory (to the byte, with where it is reached) and time as today's path (the role put
together from three small layer counts simulated at its own degree) and as simulating every
layer; refused where FSDP2 pads a parameter."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
from tests.plan.same_role import assert_same_role

import flopscope
from flopscope.estimate import PROFILES
from flopscope.plan import degrees as degrees_module
from flopscope.plan import planner
from flopscope.plan.build import build_model
from flopscope.plan.degrees import pads
from flopscope.plan.roles import RoleKey, RoleRun, Roles, clear_cache

# 13 layers (more than the small runs' 3 + 4 + 5), hidden 64 (4 heads of 16, 2 KV heads), MLP
# 128, a vocabulary of 1,024, 96 tokens. Under TP 2 x FSDP2 W the sharded dimensions 0 are
# 1,024 (embedding, head: FSDP2 only), 64, 32 and 128 (q/k/v, gate/up: TP Shard(0) too, so
# split over 2 W ranks) and 64 (o/down projections, norms): no padding at W = 2, 4, 8; at W = 3
# every one is padded (64 is no multiple of 3)
CONFIG: dict[str, Any] = dict(vocab_size=1024, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=13, num_attention_heads=4, num_key_value_heads=2)
SEQ = 96
MIXED = ("bfloat16", "float32")


def _roles(**options: Any) -> Roles:
    return Roles(build_model("hf:llama", SEQ, "float32", CONFIG), PROFILES["h100-sxm"],
                 ("test_degrees", tuple(options.items())), **options)


def _key(dp: int, *, checkpoint: bool = False, micro_batch: int = 1, pp: int = 1,
         stage: int = 0) -> RoleKey:
    return RoleKey(tp=2, pp=pp, stage=stage, dp=dp, micro_batch=micro_batch,
                   microbatches=pp, checkpoint=checkpoint, mixed_precision=MIXED,
                   sequence_parallel=pp == 1)


@dataclasses.dataclass(frozen=True)
class ThirdDegree:
    """A role at FSDP 2, 4, then 8 (derived from the first two) and the roles' counters
    (from_small, from_degrees, degrees_refused) after 4 and after 8."""

    two: RoleRun
    derived: RoleRun
    at_four: tuple[int, int, int]
    at_eight: tuple[int, int, int]


@pytest.fixture(scope="module")
def third_degree() -> Callable[[dict[str, Any]], ThirdDegree]:
    """Each role's FSDP 2, 4 and 8 runs made once in the module: the role without
    checkpointing is compared with the role simulated at 8 and with every layer simulated (two
    tests; its 7 small runs were made twice, about 5 s of CPU)."""
    made: dict[tuple[Any, ...], ThirdDegree] = {}

    def get(options: dict[str, Any]) -> ThirdDegree:
        at = tuple(sorted(options.items()))
        if at not in made:
            clear_cache()
            fast = _roles()

            def counters() -> tuple[int, int, int]:
                return fast.from_small, fast.from_degrees, fast.degrees_refused

            two = fast.get(_key(2, **options))
            fast.get(_key(4, **options))
            at_four = counters()
            derived = fast.get(_key(8, **options))
            made[at] = ThirdDegree(two, derived, at_four, counters())
            clear_cache()
        return made[at]

    return get


@pytest.mark.parametrize("options", [
    dict(checkpoint=False),
    # about 11 s: the slow tier's (checkpointing and micro-batches are derived per degree alike)
    pytest.param(dict(checkpoint=True, micro_batch=2), marks=pytest.mark.slow),
])
def test_a_role_at_a_third_degree_equals_the_role_simulated_at_it(
        options: Any, third_degree: Callable[[dict[str, Any]], ThirdDegree]) -> None:
    clear_cache()
    third, slow = third_degree(options), _roles(repeat_degrees=False)
    assert third.at_four[:2] == (2, 0)
    # the third degree: its 3-layer run simulated (the check), its 4- and 5-layer runs derived
    assert third.at_eight == (3, 1, 0)
    assert_same_role(third.derived, slow.get(_key(8, **options)))
    # FSDP2's figures did change with the degree: the rank's parameter shards are a quarter of
    # those at degree 2 (no padding: every sharded dimension 0 divides by 8 x its TP split)
    assert third.derived.parameter_bytes * 4 == third.two.parameter_bytes
    clear_cache()


def test_a_role_from_other_degrees_equals_simulating_every_layer(
        third_degree: Callable[[dict[str, Any]], ThirdDegree]) -> None:
    clear_cache()
    third, whole = third_degree(dict(checkpoint=False)), _roles(repeat_layers=False)
    derived = third.derived
    assert third.at_eight[1] == 1  # from FSDP 2 and 4
    assert_same_role(derived, whole.get(_key(8)))
    assert (derived.memory.peak_module, derived.memory.peak_phase) == ("lm_head", "backward")
    clear_cache()


def test_a_degree_with_padding_is_simulated_and_equal() -> None:
    clear_cache()
    fast, slow = _roles(), _roles(repeat_degrees=False)
    for dp in (2, 4):
        fast.get(_key(dp))
    padded = fast.get(_key(3))
    # W = 3 pads (see CONFIG): the small runs simulated, the refusal counted
    assert (fast.from_degrees, fast.degrees_refused) == (0, 1)
    assert_same_role(padded, slow.get(_key(3)))
    clear_cache()


@pytest.mark.slow  # about 30 s of CPU: six small pipelines of 3 to 5 layers per stage, three whole
def test_a_pipeline_stage_at_a_third_degree() -> None:
    # 26 layers in 2 stages of 13, 2 microbatches in flight: FSDP2 does not reshard between
    # them and reduces the gradients after the last, at the stage's root
    config = dict(CONFIG, num_hidden_layers=26)
    clear_cache()
    fast = Roles(build_model("hf:llama", SEQ, "float32", config), PROFILES["h100-sxm"],
                 "test_degrees_pp")
    slow = Roles(build_model("hf:llama", SEQ, "float32", config), PROFILES["h100-sxm"],
                 "test_degrees_pp_slow", repeat_degrees=False)
    for dp in (2, 4):
        fast.get(_key(dp, pp=2, stage=1))
    derived = fast.get(_key(8, pp=2, stage=1))
    assert fast.from_degrees == 1
    assert_same_role(derived, slow.get(_key(8, pp=2, stage=1)))
    clear_cache()


@pytest.mark.parametrize(("dims", "degree", "padded"), [
    (((1024, 1), (64, 2)), 8, False),   # 1,024 / 8 and 64 / (8 x 2)
    (((1024, 1), (64, 2)), 64, True),   # 64 / (64 x 2) is no whole number
    (((1000, 1),), 16, True),           # 1,000 = 16 x 62.5
    (None, 2, True),                    # unknown: taken as padded
])
def test_padding_follows_fsdp2s_dim0_rule(dims: Any, degree: int, padded: bool) -> None:
    assert pads(dims, degree) is padded


def test_a_stage_from_small_pipelines_at_a_third_degree() -> None:
    # 20 layers in 20 stages, 20 microbatches: the second stage put together from pipelines of
    # 5, 6 and 7 stages (flopscope.plan.layers); at FSDP 8 those small pipelines but the first
    # come from FSDP 2 and 4 (sharded dims 0: 1,000, 64, 32, 128, no padding at 2, 4 or 8)
    config = dict(CONFIG, vocab_size=1000, num_hidden_layers=20)
    clear_cache()
    fast, slow = (Roles(build_model("hf:llama", 32, "float32", config), PROFILES["h100-sxm"],
                        ("test_degrees_deep", degrees), repeat_degrees=degrees)
                  for degrees in (True, False))

    def key(dp: int) -> RoleKey:
        return RoleKey(tp=1, pp=20, stage=1, dp=dp, micro_batch=1, microbatches=20,
                       checkpoint=False)

    for dp in (2, 4):
        fast.get(key(dp))
    derived = fast.get(key(8))
    assert (fast.from_microbatches, fast.from_degrees) == (3, 1)
    assert_same_role(derived, slow.get(key(8)))
    clear_cache()


def test_a_sweep_of_device_counts_plans_the_same_with_degrees_shared(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # pure FSDP2 on 2, 4 and 8 GPUs, one sequence per GPU: one layout per plan, its role
    # (13 layers: from small layer counts) at FSDP 2, 4, then 8, derived from the first two
    def sweep() -> list[tuple[Any, ...]]:
        out = []
        for gpus in (2, 4, 8):
            p = flopscope.plan("hf:llama", gpus=gpus, hardware="h100-sxm", config=CONFIG,
                               seq_len=SEQ, global_batch=gpus, dtype="float32", tp=1, pp=1,
                               checkpointing=("none",))
            out += [(c.choice, c.memory_bytes, c.at_peak, c.peak_where, c.fits,
                     c.time.to_dict()) for c in (*p.ranked, *p.dropped)]
        return out

    made: list[Roles] = []

    def roles(*args: Any, **kwargs: Any) -> Roles:
        made.append(Roles(*args, **kwargs))
        return made[-1]

    clear_cache()
    monkeypatch.setattr(planner, "Roles", roles)
    slow = sweep()  # one plan keeps no small runs for the next: nothing is derived
    assert [r.from_degrees for r in made] == [0, 0, 0]
    assert not degrees_module.sharing_degrees()
    made.clear()
    clear_cache()
    with degrees_module.shared_degrees():  # as flopscope.plan.sweep plans its device counts
        fast = sweep()
    assert [r.from_degrees for r in made] == [0, 0, 1]
    clear_cache()
    assert len(fast) == 3
    for a, b in zip(fast, slow, strict=True):
        assert a[:5] == b[:5]
        for part, seconds in b[5].items():
            assert math.isclose(a[5][part], seconds, rel_tol=1e-12, abs_tol=1e-18)


def test_a_sequential_sweep_shares_small_runs_and_one_plan_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from flopscope.errors import UsageError
    from flopscope.plan import sweeps

    seen: list[bool] = []

    def plan(*_: Any, **__: Any) -> Any:
        seen.append(degrees_module.sharing_degrees())
        raise UsageError("stop here")

    monkeypatch.setattr(sweeps, "plan", plan)
    rows = list(sweeps.sweep(["hf:llama"], gpus=[2, 4], hardware="h100-sxm"))
    assert [r.error for r in rows] == ["stop here", "stop here"]
    assert seen == [True, True]  # every plan of the sweep shares
    assert not degrees_module.sharing_degrees()  # and nothing after it
