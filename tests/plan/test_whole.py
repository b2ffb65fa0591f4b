"""A screened plan's reference pipeline at FSDP2 degree 1 derived from the one at the plan's
sharded degree plus a base pair's difference (flopscope.plan.whole): the same as simulating
it, to the byte (issue 31)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model, model_identity
from flopscope.plan.layers import Small
from flopscope.plan.roles import RoleKey, Roles, clear_cache
from flopscope.plan.screen import Screen

# the test model of tests/plan/test_screen.py: 8 layers, hidden 256, 8 heads, 4 KV heads
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)
GPUS = 8
MIXED = ("bfloat16", "float32")  # a plan's mixed precision: float32 parameters


@pytest.fixture(scope="module")
def screens() -> tuple[Screen, Screen]:
    clear_cache()
    build = build_model("hf:llama", 256, "float32", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], model_identity("hf:llama", 256, "float32",
                                                             CONFIG))
    derived, simulated = Screen(roles, build, GPUS), Screen(roles, build, GPUS)
    simulated.derive_whole = False
    return derived, simulated


def _same(a: Small, b: Small) -> None:
    """Every call point (module, phase, operator, live bytes by category), the peak, the
    collectives, the parameters; the estimate's integer figures per phase and operator exactly,
    its seconds to 1e-9."""
    assert a.points == b.points
    assert a.memory.peak_bytes == b.memory.peak_bytes
    assert (a.memory.peak_module, a.memory.peak_phase, a.memory.peak_op) == (
        b.memory.peak_module, b.memory.peak_phase, b.memory.peak_op)
    assert a.memory.at_peak == {c: v for c, v in b.memory.at_peak.items() if v}
    assert a.memory.end_bytes == b.memory.end_bytes
    assert a.report.communication == b.report.communication
    assert a.parameter_bytes == b.parameter_bytes
    assert b.estimate.by_phase and a.estimate.by_phase.keys() == b.estimate.by_phase.keys()
    for phase, row in b.estimate.by_phase.items():
        for f in dataclasses.fields(row):
            x, y = getattr(a.estimate.by_phase[phase], f.name), getattr(row, f.name)
            if isinstance(y, int):
                assert x == y, (phase, f.name)
            else:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-15), (phase, f.name)
    for phase, ops in b.estimate.by_phase_op.items():  # what the screen's rows read
        for op, row in ops.items():
            mine = a.estimate.by_phase_op[phase][op]
            assert mine.flops == row.flops
            assert mine.time_s == pytest.approx(row.time_s, rel=1e-9, abs=1e-15)


# (tp, checkpointing, the base micro-batch, the micro-batches derived from it)
CASES = [(1, "none", 1, (2, 4, 8)),
         # about 18 s: the slow tier's (tensor parallel and checkpointing stay in the last case)
         pytest.param(2, "block", 1, (2, 8), marks=pytest.mark.slow),
         (2, "selective", 2, (4,))]


@pytest.mark.parametrize(("tp", "checkpoint", "base", "derived_at"), CASES)
def test_a_pipeline_at_degree_1_derived_equals_its_simulation(
        screens: tuple[Screen, Screen], tp: int, checkpoint: str, base: int,
        derived_at: tuple[int, ...]) -> None:
    derived, simulated = screens
    rk = RoleKey(tp, 1, 0, GPUS // tp, base, 1, checkpoint, mixed_precision=MIXED,
                 loss="cross_entropy")
    before = len(derived.derived)
    derived.pipeline(rk, 1)  # the base: simulated, with the sharded pipeline
    assert len(derived.derived) == before
    for mb in derived_at:
        at = dataclasses.replace(rk, micro_batch=mb)
        got, want = derived.pipeline(at, 1), simulated.pipeline(at, 1)
        assert derived.derived[-1] == at  # derived, not simulated
        for a, b in zip(got, want, strict=True):
            _same(a, b)


def test_whole_parameters_and_a_derived_stage() -> None:
    """The derived pipeline's parameters are whole: the first stage of two layers less that of
    one is a decoder layer at tensor parallel 1: q and o 256 x 256, k and v 128 x 256 (4 KV
    heads of 32), gate and up 512 x 256, down 256 x 512, two norms of 256 = 2 x 65,536 + 2 x
    32,768 + 3 x 131,072 + 512 = 590,336 float32 parameters, 2,361,344 bytes."""
    clear_cache()
    build = build_model("hf:llama", 256, "float32", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], model_identity("hf:llama", 256, "float32",
                                                             CONFIG))
    screen = Screen(roles, build, GPUS)
    rk = RoleKey(1, 1, 0, GPUS, 1, 1, "none", mixed_precision=MIXED, loss="cross_entropy")
    screen.pipeline(rk, 1)
    first, _, _, first_two, _ = screen.pipeline(dataclasses.replace(rk, micro_batch=2), 1)
    assert screen.derived == [dataclasses.replace(rk, micro_batch=2)]
    assert first_two.parameter_bytes - first.parameter_bytes == 2_361_344
    # the sharded pipeline's (degree 8 / 2 = 4): a quarter
    sharded = screen.pipeline(dataclasses.replace(rk, micro_batch=2), GPUS // 2)
    assert sharded[3].parameter_bytes - sharded[0].parameter_bytes == 2_361_344 // 4
    # a stage of the layout TP 1 x PP 8 (no data parallelism) is screened from it
    stage = screen.run(RoleKey(1, 8, 3, 1, 2, 8, "none", mixed_precision=MIXED,
                               loss="cross_entropy"))
    assert stage.parameter_bytes == 2_361_344  # its one layer, whole


def test_not_without_mixed_precision() -> None:
    """Without mixed precision a pipeline at degree 1 has no FSDP2 at all: simulated."""
    clear_cache()
    build = build_model("hf:llama", 256, "bfloat16", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], model_identity("hf:llama", 256, "bfloat16",
                                                             CONFIG))
    screen = Screen(roles, build, GPUS)
    rk = RoleKey(2, 1, 0, GPUS // 2, 1, 1, "none", loss="cross_entropy")
    for mb in (1, 2):
        screen.pipeline(dataclasses.replace(rk, micro_batch=mb), 1)
    assert screen.derived == []
    assert screen.references == 2
