"""A screened plan's reference pipelines above micro-batch 4 carried from those at 2 and 4
(flopscope.plan.micro_batch): the same as simulating them, to the byte (issue 31)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flopscope.distributed.repeat import NotRepeating
from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model, model_identity
from flopscope.plan.layers import Small
from flopscope.plan.micro_batch import at_micro_batch
from flopscope.plan.roles import RoleKey, Roles, clear_cache
from flopscope.plan.screen import CARRY_FROM, Screen

# the test model of tests/plan/test_screen.py: 8 layers, hidden 256, 8 heads, 4 KV heads
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)
GPUS = 4


@pytest.fixture(scope="module")
def screens() -> tuple[Screen, Screen]:
    clear_cache()
    build = build_model("hf:llama", 256, "bfloat16", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], model_identity("hf:llama", 256, "bfloat16",
                                                             CONFIG))
    carried, simulated = Screen(roles, build, GPUS), Screen(roles, build, GPUS)
    simulated.carry_micro_batch = False
    return carried, simulated


def _same(a: Small, b: Small) -> None:
    assert a.points == b.points  # every call point: module, phase, operator, live bytes
    assert (a.memory.peak_bytes, a.memory.peak_module, a.memory.peak_phase,
            a.memory.peak_op) == (b.memory.peak_bytes, b.memory.peak_module,
                                  b.memory.peak_phase, b.memory.peak_op)
    assert a.memory.at_peak == {c: v for c, v in b.memory.at_peak.items() if v}
    assert a.memory.end_bytes == b.memory.end_bytes
    assert a.report.communication == b.report.communication


def _same_estimate(a: Small, b: Small) -> None:
    """The roofline estimate: every phase's integer figures exactly, its seconds to 1e-9."""
    assert b.estimate.by_phase  # a run's estimate, not an empty one
    for phase, row in b.estimate.by_phase.items():
        mine = a.estimate.by_phase[phase]
        for f in dataclasses.fields(row):
            x, y = getattr(mine, f.name), getattr(row, f.name)
            if isinstance(y, int):
                assert x == y, (phase, f.name)
            else:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-15), (phase, f.name)
    assert a.estimate.by_phase_op.keys() == b.estimate.by_phase_op.keys()
    for phase, ops in b.estimate.by_phase_op.items():  # what the screen's rows read
        for op, row in ops.items():
            mine = a.estimate.by_phase_op[phase][op]
            assert mine.flops == row.flops
            assert mine.time_s == pytest.approx(row.time_s, rel=1e-9)
    assert a.estimate.total.time_s == pytest.approx(b.estimate.total.time_s, rel=1e-9)


# (tp, FSDP2 degree of the pipeline, checkpointing, mixed precision)
CASES = [(1, 2, "none", None), (2, 1, "block", None), (1, 1, "selective", None),
         (2, 1, "none", ("bfloat16", "float32"))]


@pytest.mark.parametrize(("tp", "dp", "checkpoint", "mixed"), CASES)
def test_a_pipeline_at_micro_batch_8_carried_equals_its_simulation(
        screens: tuple[Screen, Screen], tp: int, dp: int, checkpoint: str,
        mixed: tuple[str, str] | None) -> None:
    carried, simulated = screens
    rk = RoleKey(tp, 1, 0, GPUS // tp, 8, 1, checkpoint, mixed_precision=mixed,
                 loss="cross_entropy")
    before = len(carried.carried)
    got = carried.pipeline(rk, dp)
    assert len(carried.carried) == before + 1  # carried from micro-batch 2 and 4, not simulated
    want = simulated.pipeline(rk, dp)
    for a, b in zip(got, want, strict=True):  # the screen reads a stage's time from them too
        _same(a, b)
        _same_estimate(a, b)
    # one sequence's hidden states sent: 256 tokens x 256 hidden x 2 bytes = 131,072 bytes;
    # 8 sequences per microbatch: 1,048,576 per send
    sends = [r for r in got[0].report.communication if r.kind == "send"]
    assert sum(r.payload_bytes for r in sends) // sum(r.calls for r in sends) == 8 * 131_072


def test_micro_batch_6_too(screens: tuple[Screen, Screen]) -> None:
    carried, simulated = screens
    rk = RoleKey(1, 1, 0, GPUS, 6, 1, "none", loss="cross_entropy")
    before = len(carried.carried)
    for a, b in zip(carried.pipeline(rk, 2), simulated.pipeline(rk, 2), strict=True):
        _same(a, b)
    assert len(carried.carried) == before + 1


def test_micro_batch_1_is_off_the_line(screens: tuple[Screen, Screen]) -> None:
    # at micro-batch 1 the loss's shifted labels are contiguous (no copy: one call fewer on
    # the last stage), so the line starts at 2: carrying from 1 and 2 is refused
    carried, _ = screens
    assert CARRY_FROM == (2, 4)
    rk = RoleKey(1, 1, 0, GPUS, 1, 1, "none", loss="cross_entropy")
    one = carried.pipeline(rk, 2)
    two = carried.pipeline(dataclasses.replace(rk, micro_batch=2), 2)
    at_micro_batch(one[0], two[0], (1, 2), 4)  # the first stage (no loss) is on it
    with pytest.raises(NotRepeating):
        at_micro_batch(one[1], two[1], (1, 2), 4)


def test_runs_that_make_different_calls_are_refused(screens: tuple[Screen, Screen]) -> None:
    carried, _ = screens
    rk = RoleKey(1, 1, 0, GPUS, 2, 1, "none", loss="cross_entropy")
    one = carried.pipeline(rk, 2)[0]
    two = carried.pipeline(dataclasses.replace(rk, micro_batch=4), 2)[0]
    with pytest.raises(NotRepeating):  # a call missing
        at_micro_batch(dataclasses.replace(one, points=one.points[1:]), two, (2, 4), 8)
    shifted = [(m, ph, op + "x" if i == 5 else op, live)
               for i, (m, ph, op, live) in enumerate(two.points)]
    with pytest.raises(NotRepeating):  # a call's operator differs
        at_micro_batch(one, dataclasses.replace(two, points=shifted), (2, 4), 8)
    with pytest.raises(NotRepeating):  # a peak not at the largest call point
        at_micro_batch(dataclasses.replace(one, memory=dataclasses.replace(
            one.memory, peak_bytes=one.memory.peak_bytes + 1)), two, (2, 4), 8)
    with pytest.raises(NotRepeating):  # off the line: an odd step from 2 and 4 to 5
        at_micro_batch(one, dataclasses.replace(two, points=[
            (m, ph, op, {**live, "activations": live.get("activations", 0) + 1})
            for m, ph, op, live in two.points]), (2, 4), 5)


# (tp, checkpointing, mixed precision, sequence parallelism, loss parallelism)
REFS = [(1, "none", None, False, False), (2, "block", None, True, True),
        (2, "selective", ("bfloat16", "float32"), False, False)]


@pytest.mark.parametrize(("tp", "checkpoint", "mixed", "sp", "lp"), REFS)
def test_a_reference_without_stages_at_micro_batch_8_carried_equals_its_simulation(
        screens: tuple[Screen, Screen], tp: int, checkpoint: str,
        mixed: tuple[str, str] | None, sp: bool, lp: bool) -> None:
    # the runs of 3 and 4 layers: their call points, peak, collectives, parameters, and the
    # roofline estimate summed from every call's record carried from micro-batch 2 and 4
    carried, simulated = screens
    rk = RoleKey(tp, 1, 0, GPUS // tp, 8, 1, checkpoint, mixed_precision=mixed,
                 sequence_parallel=sp, loss_parallel=lp, loss="cross_entropy")
    before = len(carried.carried)
    got, want = carried.reference(rk), simulated.reference(rk)
    assert len(carried.carried) == before + 1
    for a, b in zip(got, want, strict=True):
        _same(a, b)
        assert a.parameter_bytes == b.parameter_bytes
        _same_estimate(a, b)
