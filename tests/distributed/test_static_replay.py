"""A shape-only simulated rank answers repeated operator calls from memory
(:func:`flopscope.core.memo.static_replay`, entered by every simulated rank through
:func:`flopscope.distributed.shape_only.shape_only_rank`): the same report, memory profile, call
points and roofline estimate as when every call runs in the fake tensor mode (the path it
replaces), for a training role, a serving role (prefill and decode) and a rank that a sharding
function builds (:mod:`flopscope.plan.sharded`)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.plan.same_role import assert_same_role

from flopscope.core.memo import static_replay
from flopscope.distributed import Layout, simulate
from flopscope.estimate import PROFILES, CallLog, MemoryTracker
from flopscope.execution.meta import ShapeOnlyFakeMode
from flopscope.plan.build import build_model
from flopscope.plan.experts import ExpertRoles
from flopscope.plan.roles import RoleKey, Roles, clear_cache, local_tensor
from flopscope.plan.serving import simulate_serving
from flopscope.plan.space import Choice

# 4 layers, hidden 64 (4 heads of 16, 2 KV heads), MLP 128, vocabulary 1,000, 96 tokens
CONFIG: dict[str, Any] = dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
SEQ = 96
# the module every simulated rank enters its fake mode through
shape_only_module = importlib.import_module("flopscope.distributed.shape_only")


@contextlib.contextmanager
def _nothing(mode: Any) -> Iterator[None]:
    yield


@contextlib.contextmanager
def _every_call_in_fake_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The path static_replay replaces: every call runs in the fake tensor mode."""
    with monkeypatch.context() as m:
        m.setattr(shape_only_module, "static_replay", _nothing)
        yield


@contextlib.contextmanager
def _fake_mode_calls() -> Iterator[collections.Counter[str]]:
    """Count the operator calls that reach the shape-only fake mode."""
    seen: collections.Counter[str] = collections.Counter()
    original = ShapeOnlyFakeMode.dispatch

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        seen[str(func)] += 1
        return original(self, func, types, args, kwargs)

    ShapeOnlyFakeMode.dispatch = dispatch  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        ShapeOnlyFakeMode.dispatch = original  # type: ignore[method-assign]


def _role(key: RoleKey) -> Any:
    clear_cache()
    roles = Roles(build_model("hf:llama", SEQ, "bfloat16", CONFIG), PROFILES["h100-sxm"],
                  ("test_static_replay", key), repeat_layers=False, repeat_microbatches=False)
    return roles.get(key)


@pytest.mark.parametrize("key", [
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1, checkpoint=False,
            loss="cross_entropy"),
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=2, microbatches=1, checkpoint=True,
            loss="cross_entropy"),
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1, checkpoint=False,
            mixed_precision=("bfloat16", "float32"), sequence_parallel=True,
            loss_parallel=True, loss="cross_entropy"),
    RoleKey(tp=1, pp=2, stage=0, dp=2, micro_batch=1, microbatches=2, checkpoint=False,
            loss="cross_entropy"),
    RoleKey(tp=2, pp=2, stage=1, dp=2, micro_batch=1, microbatches=2, checkpoint=True,
            loss="cross_entropy"),
    # selective checkpointing: its own dispatch mode keeps some outputs for the recomputation
    RoleKey(tp=2, pp=1, stage=0, dp=2, micro_batch=1, microbatches=1,
            checkpoint="selective-half", sequence_parallel=True, loss_parallel=True,
            loss="cross_entropy"),
])
def test_a_role_is_the_same_with_calls_answered_from_memory(
        key: RoleKey, monkeypatch: pytest.MonkeyPatch) -> None:
    with _fake_mode_calls() as fast_calls:
        fast = _role(key)
    with _every_call_in_fake_mode(monkeypatch), _fake_mode_calls() as slow_calls:
        slow = _role(key)
    assert_same_role(fast, slow)
    # and the whole memory profile: the peak of every module and the timeline too
    assert fast.memory == slow.memory
    # not vacuous: the layers' repeated products and views were answered from memory
    assert fast_calls["aten.mm.default"] < slow_calls["aten.mm.default"]
    assert fast_calls["aten.view.default"] < slow_calls["aten.view.default"]


def test_every_call_point_is_the_same_with_calls_answered_from_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory tracker's live bytes at every operator call (what a role from small runs
    is put together from), with checkpointing (recomputation reruns the forward)."""
    build = functools.partial(build_model("hf:llama", SEQ, "bfloat16", CONFIG), 2, "block")

    def points() -> tuple[list[Any], Any]:
        tracker, log = MemoryTracker(), CallLog()

        def prepare(model: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
            tracker.register((local_tensor(p) for p in model.parameters()), "parameters")
            tracker.register([t for t in kwargs.values() if isinstance(t, torch.Tensor)],
                             "inputs")

        report = simulate(build, Layout(4, tp=2, fsdp=2), backward=True, logical=False,
                          loss="cross_entropy", prepare=prepare, observers=[tracker, log],
                          warn=False)
        out = [dataclasses.astuple(p) for p in tracker.call_points()]
        tracker.close()  # (stops following storage resizes: torch's resize_ put back)
        return out, (report, log.estimate(PROFILES["h100-sxm"]).by_phase)

    fast = points()
    with _every_call_in_fake_mode(monkeypatch):
        slow = points()
    assert len(fast[0]) == len(slow[0]) > 1000
    assert fast[0] == slow[0]
    assert fast[1][0] == slow[1][0]


def test_a_serving_role_is_the_same_with_calls_answered_from_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A TP 2 serving rank (3 sequences, a prompt of 16, 6 new tokens): its prefill, first and
    last decode steps (estimate, collectives, memory profile, KV cache, a layer's output), its
    weights, the same with the replay and without."""
    build = build_model("hf:llama", 16, "bfloat16", CONFIG)

    def serve() -> Any:
        run = simulate_serving(lambda: build(1, "none")[0].eval(), 2, 3, 16, 6,
                               PROFILES["h100-sxm"])
        return dataclasses.replace(run, seconds=0.0)

    with _fake_mode_calls() as fast_calls:
        fast = serve()
    with _every_call_in_fake_mode(monkeypatch), _fake_mode_calls() as slow_calls:
        slow = serve()
    assert fast == slow
    for step in (fast.prefill, fast.first, fast.last):
        assert step.memory is not None and step.memory.peak_bytes > 0
        assert step.kv_bytes > 0 and step.communication
    assert fast.prefill.kind == "prefill" and fast.last.kind == "decode"
    assert fast.last.context == 16 + 6 - 1
    # not vacuous: the layers' repeated products and views were answered from memory
    assert fast_calls["aten.mm.default"] < slow_calls["aten.mm.default"]
    assert fast_calls["aten.view.default"] < slow_calls["aten.view.default"]


@pytest.mark.parametrize("choice", [
    Choice(1, 1, 4, 1, 1, "none", "fsdp", 4),  # EP 4 x FSDP2 4
    Choice(2, 1, 2, 2, 1, "block", "fsdp", 4),  # TP 2 x FSDP2 2, EP 4, checkpointing
])
def test_a_sharded_role_is_the_same_with_calls_answered_from_memory(
        choice: Choice, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that a sharding function builds (:func:`flopscope.plan.sharded.simulate_sharded`):
    an expert-parallel rank of a tiny Mixtral (2 layers, 4 experts, top 2)."""
    mixtral: dict[str, Any] = dict(CONFIG, num_local_experts=4, num_experts_per_tok=2)

    def run() -> Any:
        ExpertRoles.cache.clear()
        roles = ExpertRoles(build_model("hf:mixtral", 32, "bfloat16", mixtral),
                            PROFILES["h100-sxm"], "test_static_replay")
        (got,) = roles.runs(choice)
        return got

    with _fake_mode_calls() as fast_calls:
        fast = run()
    with _every_call_in_fake_mode(monkeypatch), _fake_mode_calls() as slow_calls:
        slow = run()
    ExpertRoles.cache.clear()
    assert_same_role(fast, slow)
    assert fast.memory == slow.memory
    assert any(c.kind == "all_to_all" for c in fast.report.communication)
    assert fast_calls["aten.mm.default"] < slow_calls["aten.mm.default"]
    assert fast_calls["aten.view.default"] < slow_calls["aten.view.default"]


def test_static_replay_takes_a_mode_without_a_shape_environment() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with pytest.raises(ValueError, match="without a shape environment"), \
            static_replay(FakeTensorMode(shape_env=ShapeEnv())):
        pass
