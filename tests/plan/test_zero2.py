"""FSDP2 keeping each layer's gathered parameters from its forward to its backward
(``reshard_after_forward=False``; ``data_parallel="zero2"``, ``DP4 Z2`` in a label): the
all-gathers of backward gone, the gathered layers held from forward to backward."""

from __future__ import annotations

import dataclasses

import pytest

import flopscope
from flopscope.cost import Phase
from flopscope.distributed import Layout
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan.planner import Plan, build_model
from flopscope.plan.roles import RoleKey, clear_cache
from flopscope.plan.space import Choice
from flopscope.plan.vision import VisionRoles

from .test_ddp import _comm, _roles
from .test_plan import CONFIG, PARAMS

# the test model in bfloat16: 2,623,744 parameters = 5,247,488 bytes; a decoder layer 590,336
# parameters = 1,180,672 bytes; the root (embedding, final norm, head: 2 x 512 x 256 + 256)
# 262,400 = 524,800 bytes
LAYER_BYTES, ROOT_BYTES = 1_180_672, 524_800


def _gathers(run: object) -> list[tuple[str, int, int]]:
    records = run.report.communication  # type: ignore[attr-defined]
    return sorted((c.phase.value, c.calls, c.bus_bytes) for c in records if c.kind == "all_gather")


def test_a_kept_rank_gathers_each_layer_once_and_holds_it_to_backward() -> None:
    clear_cache()
    roles = _roles()
    key = RoleKey(1, 1, 0, 4, 1, 1, "none", loss="cross_entropy")
    fsdp, kept = roles.get(key), roles.get(dataclasses.replace(key, keep_gathered=True))
    # the same shards: a quarter of the parameters
    assert kept.parameter_bytes == fsdp.parameter_bytes == 2 * PARAMS // 4
    # FSDP2's default: 5 gathers in forward (4 layers and the root) and the 4 layers again in
    # backward (the root is not resharded after forward); a ring all-gather moves (n - 1) / n of
    # the gathered bytes: 3/4 x 5,247,488 = 3,935,616 in forward, 3/4 x 4 x 1,180,672 =
    # 3,542,016 more in backward
    assert 4 * LAYER_BYTES + ROOT_BYTES == 2 * PARAMS
    assert _comm(fsdp)[("all_gather", "dp", 4)] == (9, 3_935_616 + 3 * LAYER_BYTES)
    # kept: forward only, every byte once
    assert _comm(kept)[("all_gather", "dp", 4)] == (5, 3_935_616)
    assert {p for p, _, _ in _gathers(kept)} == {Phase.FORWARD.value}
    # the gradients' reduce-scatters are the same: 5 calls of 3/4 of every byte
    assert _comm(kept)[("reduce_scatter", "dp", 4)] == _comm(fsdp)[("reduce_scatter", "dp", 4)] \
        == (5, 3_935_616)
    # the four layers' gathered parameters live from their forward to their backward: the peak
    # moves to the end of forward and rises
    assert kept.memory.peak_phase == "forward"
    assert kept.memory.peak_bytes > fsdp.memory.peak_bytes
    # the same arithmetic
    assert kept.report.total().flops == fsdp.report.total().flops


def test_a_kept_pipeline_stage_gathers_once_a_step() -> None:
    roles = _roles()
    # stage 0 of 2 over 2 microbatches (1F1B: F0 F1 B0 B1), the embedding and 2 layers, FSDP2
    # over 2: by default each microbatch's forward gathers the 2 layers again and the first
    # backward once more (torch's schedule keeps them between backwards); kept, the first
    # forward's gathers serve the whole step: 1/2 x 1,180,672 = 590,336 bus bytes per layer
    key = RoleKey(1, 2, 0, 2, 1, 2, "none", loss="cross_entropy")
    fsdp, kept = roles.get(key), roles.get(dataclasses.replace(key, keep_gathered=True))
    assert sum(calls for _, calls, _ in _gathers(fsdp)) == 1 + 2 * 2 + 2
    assert _gathers(kept) == [("forward", 1, 131_072), ("forward", 1, LAYER_BYTES // 2),
                              ("forward", 1, LAYER_BYTES // 2)]


def test_the_layout_refuses_keep_with_replicas_and_experts() -> None:
    with pytest.raises(UsageError, match="DDP's parameters are whole already"):
        Layout(4, replicate=True, keep_gathered=True)
    with pytest.raises(UsageError, match="not built with expert"):
        Layout(4, ep=4, keep_gathered=True)


@pytest.fixture(scope="module")
def kept_plan() -> Plan:
    clear_cache()
    plan = flopscope.plan("hf:llama", gpus=2, hardware="h100", config=CONFIG, seq_len=256,
                          global_batch=2, tp=1, pp=1, data_parallel="search")
    assert isinstance(plan, Plan)
    return plan


def test_a_searched_plan_ranks_the_kept_layout_beside_fsdp(kept_plan: Plan) -> None:
    rows = {c.choice.label: c for c in (*kept_plan.ranked, *kept_plan.dropped)}
    fsdp, kept = rows["TP1 PP1 DP2 mb1x1"], rows["TP1 PP1 DP2 Z2 mb1x1"]
    assert kept.choice.keeps_gathered and not fsdp.choice.keeps_gathered
    assert kept.to_dict()["data_parallel"] == "zero2"
    # less data-parallel traffic (no gathers in backward), more memory, the same compute and
    # AdamW's state (FSDP2's shards either way)
    assert kept.bound_step.forward == pytest.approx(fsdp.bound_step.forward)
    assert kept.at_peak["optimizer_state"] == fsdp.at_peak["optimizer_state"]
    assert kept.memory_bytes > fsdp.memory_bytes
    assert "keeping gathered parameters" in kept_plan.notes[1]
    # the page names the data-parallel part once for FSDP2 both ways
    assert kept_plan.page_data()["explain"]["part_names"]["fsdp_comm"] == (
        "FSDP gathers/reduce-scatters or DDP all-reduces or ZeRO-1 reduce-scatters/gathers "
        "(exposed)")


def test_a_kept_vision_rank_gathers_in_forward_only() -> None:
    roles = VisionRoles(build_model("torchvision:resnet18", None, "bfloat16", None),
                        PROFILES["h100-sxm"], "test_zero2")
    (fsdp,) = roles.runs(Choice(1, 1, 4, 2, 1, "none", "fsdp"))
    (kept,) = roles.runs(Choice(1, 1, 4, 2, 1, "none", "zero2"))
    forward = [g for g in _gathers(fsdp) if g[0] == "forward"]
    assert _gathers(kept) == forward  # the backward's gathers gone, the forward's the same
    assert len(_gathers(fsdp)) > len(forward)
    assert kept.memory.peak_bytes > fsdp.memory.peak_bytes
