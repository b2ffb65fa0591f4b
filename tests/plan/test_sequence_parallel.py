"""Sequence parallelism in a training plan (torchtitan's and Megatron-LM's tensor parallelism):
the norms on sequence shards, all-gathers and reduce-scatters over the tensor-parallel group
instead of all-reduces, exposed as the all-reduces were."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model, model_identity
from flopscope.plan.candidate import why_it_wins
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.planner import Plan
from flopscope.plan.roles import RoleKey, Roles
from flopscope.plan.space import Choice

# hidden 256, 8 heads, 4 KV heads, MLP 512, 4 layers, vocab 512 (tests/plan/test_plan.py)
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
ARGS: dict[str, Any] = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=256, global_batch=1,
                            tp=2, checkpointing=("block",))


def _forward_payload(sequence_parallel: bool) -> tuple[set[tuple[str, int]], int]:
    build = build_model("hf:llama", 256, "bfloat16", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], ("sp test", sequence_parallel))
    run = roles.get(RoleKey(2, 1, 0, 1, 1, 1, True, None, sequence_parallel))
    comm = run.report.communication
    layer = sum(c.payload_bytes for c in comm
                if c.module.startswith("model.layers.1.") and c.phase.value == "forward")
    return {(c.kind, c.group_size) for c in comm}, layer


def test_collectives_of_a_sequence_parallel_layer() -> None:
    # a layer's activation: 256 tokens x 256 hidden x 2 bytes = 131,072. Without sequence
    # parallelism two all-reduces of it per layer forward (after attention, after the MLP)
    kinds, layer = _forward_payload(False)
    assert kinds == {("all_reduce", 2)} and layer == 2 * 131_072
    # with it, before attention and the MLP an all-gather of the sequence shards (its payload
    # n x the shard: 2 x 65,536), after each a reduce-scatter of the whole (131,072)
    kinds, layer = _forward_payload(True)
    assert kinds == {("all_gather", 2), ("reduce_scatter", 2)}
    assert layer == 2 * (2 * 65_536) + 2 * 131_072


def test_plan_with_sequence_parallelism() -> None:
    plain, sp = (flopscope.plan("hf:llama", **ARGS, sequence_parallel=s) for s in (False, True))
    assert isinstance(plain, Plan) and isinstance(sp, Plan)
    (a,), (b,) = plain.ranked, sp.ranked  # TP2 PP1 DP1 mb1x1 ckpt
    # the checkpointed layers keep sequence shards: fewer activations at the peak
    assert b.at_peak["activations"] < a.at_peak["activations"]
    assert b.at_peak["parameters"] == a.at_peak["parameters"]
    # its all-gathers and reduce-scatters are exposed tensor-parallel time (they were counted
    # as FSDP2's, hidden, before the step time told them apart); at the bound (no host: the
    # prediction of this tiny model on the H100 is host-bound, and they run in the device's
    # wait for the host there, estimate.overlap.host_overlap)
    assert b.bound_step.tp_comm > 0 and b.time.fsdp_comm == b.time.fsdp_hidden == 0
    assert 0.0 <= b.time.tp_comm <= b.bound_step.tp_comm
    assert sp.sequence_parallel and sp.to_dict()["sequence_parallel"] is True
    assert "sequence parallelism on tensor-parallel layouts" in sp.notes[1]


def test_only_where_it_applies() -> None:
    # tensor parallelism without stages, whatever FSDP2's degree (equal to TP's too: the
    # records name their group); a layout that asks for it elsewhere runs without
    def sp(*layout: Any) -> list[bool]:
        choice = Choice(*layout, "none", sequence_parallel=True)
        return [k.sequence_parallel for k in roles_of(choice, 4)]

    assert sp(2, 1, 4, 1, 1) == [True]
    assert sp(1, 1, 8, 1, 1) == [False]
    assert sp(2, 2, 2, 1, 2) == [False, False]
    assert sp(2, 1, 2, 1, 1) == [True]
    assert roles_of(Choice(2, 1, 4, 1, 1, "none"), 4)[0].sequence_parallel is False


def test_tp_equal_to_fsdp_degree() -> None:
    # TP 2 x FSDP 2 on 4 GPUs (one node of 8: every group on NVLink, the h100 profile's 450 GB/s
    # and 12 us per call): sequence parallelism's all-gathers and reduce-scatters and FSDP2's
    # are all over groups of 2; each record names its group, so the step time charges the
    # tensor-parallel ones exposed (sum of 12 us x calls + bus bytes / 450 GB/s) and FSDP2's
    # as overlapped (the first all-gather exposed, the rest hidden behind compute)
    plan = flopscope.plan("hf:llama", **{**ARGS, "gpus": 4, "global_batch": 2, "pp": 1,
                                         "checkpointing": ("none",)}, sequence_parallel=True)
    assert isinstance(plan, Plan)
    (c,) = plan.ranked
    assert (c.choice.tp, c.choice.dp) == (2, 2) and c.applied == ("sequence", "loss")
    hw = PROFILES["h100-sxm"]
    (key,) = roles_of(c.choice, 4, loss_parallel=True)
    assert key.sequence_parallel and key.loss_parallel
    run = Roles(build_model("hf:llama", 256, "bfloat16", CONFIG), hw,
                model_identity("hf:llama", 256, "bfloat16", CONFIG)).get(key)
    comm = run.report.communication
    by_group = {g: {(r.kind, r.group_size) for r in comm if r.group == g} for g in ("tp", "dp")}
    # sequence parallelism's collectives and loss parallelism's all-reduces over "tp"; FSDP2's
    # over "dp": the same kinds and group size, told apart by the group only
    assert by_group == {"tp": {("all_gather", 2), ("reduce_scatter", 2), ("all_reduce", 2)},
                        "dp": {("all_gather", 2), ("reduce_scatter", 2)}}
    assert {r.group for r in comm} == {"tp", "dp"}

    def seconds(records: list[Any]) -> float:
        return sum(12e-6 * r.calls + r.bus_bytes / 450e9 for r in records)

    tp = [r for r in comm if r.group == "tp"]
    dp = [r for r in comm if r.group == "dp"]
    # at the bound (no host time: nothing runs in a wait for the host) every tensor-parallel
    # second is exposed; the prediction (host-bound here) exposes no more
    bound = c.bound_step
    assert bound.tp_comm == pytest.approx(seconds(tp), rel=1e-12)
    assert 0.0 <= c.time.tp_comm <= bound.tp_comm
    for t in (bound, c.time):
        assert t.fsdp_comm + t.fsdp_hidden == pytest.approx(seconds(dp), rel=1e-12)
    # the first all-gather of the step (the root's, forward) is exposed, the rest hidden
    first = next(r for r in dp if r.kind == "all_gather" and r.phase.value == "forward")
    assert bound.fsdp_comm == pytest.approx(seconds([first]) / first.calls, rel=1e-12)
    assert "(where TP differs" not in plan.notes[1]


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    assert main(["plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
                 "--global-batch", "1", "--tp", "2", "--checkpointing", "block",
                 "--sequence-parallel", "--format", "json", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["sequence_parallel"] is True
    assert main(["plan", "hf:llama", "--gpus", "2", "--serve", "--sequence-parallel"]) == 2
    err = capsys.readouterr().err
    assert "--sequence-parallel applies to a training plan" in err and "Traceback" not in err
    with pytest.raises(UsageError, match="sequence parallelism needs tensor parallelism"):
        flopscope.plan("torchvision:resnet18", gpus=2, sequence_parallel=True)


def test_searched_sequence_parallelism() -> None:
    # "search": the one tensor-parallel layout (TP2 PP1 DP1 mb1x1 ckpt) planned without and
    # with sequence parallelism, each the same run as the plan that applies it or not
    plain, sp, both = (flopscope.plan("hf:llama", **ARGS, sequence_parallel=s)
                       for s in (False, True, "search"))
    assert isinstance(plain, Plan) and isinstance(sp, Plan) and isinstance(both, Plan)
    (a,), (b,) = plain.ranked, sp.ranked
    by_label = {c.choice.label: c for c in both.ranked}
    assert sorted(by_label) == ["TP2 PP1 DP1 SP mb1x1 ckpt", "TP2 PP1 DP1 mb1x1 ckpt"]
    assert a.choice.label == "TP2 PP1 DP1 mb1x1 ckpt" and not a.choice.sequence_parallel
    assert b.choice.label == "TP2 PP1 DP1 SP mb1x1 ckpt" and b.choice.sequence_parallel
    for one in (a, b):
        same = by_label[one.choice.label]
        assert (same.memory_bytes, same.time, same.applied) == (one.memory_bytes, one.time,
                                                                 one.applied)
    assert both.to_dict()["sequence_parallel"] == "search"
    assert [r["sequence_parallel"] for r in both.to_dict()["ranked"]] == [
        c.choice.sequence_parallel for c in both.ranked]
    assert "sequence parallelism searched" in both.notes[1]
    # "why it wins" names the winner's twin, the other way round, first
    why = why_it_wins(both.ranked, "tokens")
    loser = both.ranked[1].choice
    assert loser.sequence_parallel != both.ranked[0].choice.sequence_parallel
    assert "the same layout with" in why[1] and why[2].startswith(f"  {loser.label}: ")


def test_searched_layouts_are_the_tensor_parallel_ones_without_stages() -> None:
    from flopscope.plan.space import ModelShape, enumerate_layouts

    shape = ModelShape(4, 8, 4, 512)
    off = enumerate_layouts(4, shape, 4, ("none",))
    on = enumerate_layouts(4, shape, 4, ("none",), "on")
    search = enumerate_layouts(4, shape, 4, ("none",), "search")
    eligible = [c for c in off if c.tp > 1 and c.pp == 1]
    # TP2 x DP2 and TP4 x DP1, at micro-batches 1 and 2 (TP2: 2 sequences a rank) and 1..4
    assert len(eligible) == 2 + 3
    assert len(on) == len(off) and len(search) == len(off) + len(eligible)
    assert {c.label for c in on if c.sequence_parallel} == {
        c.label.replace(" mb", " SP mb") for c in eligible}
    assert [c for c in search if not c.sequence_parallel] == off


def test_bad_sequence_parallel_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from flopscope.plan.space import SEQUENCE_PARALLEL

    with pytest.raises(UsageError, match="sequence_parallel must be True, False or one of"):
        flopscope.plan("hf:llama", **ARGS, sequence_parallel="yes")
    assert main(["plan", "hf:llama", "--gpus", "2", "--sequence-parallel", "maybe"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'maybe'" in err and "Traceback" not in err
    for word in SEQUENCE_PARALLEL:  # the CLI offers exactly the plan's modes
        assert f"'{word}'" in err
    # asked for where no layout has tensor parallelism without stages: the note says so
    none = flopscope.plan("hf:llama", **{**ARGS, "gpus": 1, "tp": 1}, sequence_parallel="search")
    assert isinstance(none, Plan) and not any(c.choice.sequence_parallel for c in none.ranked)
    assert "sequence parallelism asked for, but no layout here" in none.notes[1]
    # a mixture of experts: refused before any layout is simulated
    with pytest.raises(UsageError, match="mixture of experts: sequence parallelism"):
        flopscope.plan("hf:mixtral", gpus=2, sequence_parallel="search",
                       config={"num_hidden_layers": 1, "hidden_size": 64,
                               "intermediate_size": 128, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "vocab_size": 128,
                               "num_local_experts": 4})


def test_the_updates_all_reduces_of_partial_gradients() -> None:
    # sequence parallelism's norms are replicated parameters used on sequence shards: their
    # gradients are partial over the tensor-parallel ranks after the backward, and AdamW's
    # operators all-reduce them. 4 layers x 2 norms + the final norm = 9 such parameters of
    # hidden 256 elements (2,304); the layout without it, and the one with FSDP2 (mixed
    # precision shards at degree 1 too, and FSDP2 hands back replicated gradients), none
    build = build_model("hf:llama", 256, "bfloat16", CONFIG)
    hw = PROFILES["h100-sxm"]
    roles = Roles(build, hw, ("partial test",))
    for sp, mixed, held in ((True, None, (9, 2_304)), (False, None, (0, 0)),
                            (True, ("bfloat16", "float32"), (0, 0))):
        run = roles.get(RoleKey(2, 1, 0, 1, 1, 1, "block", mixed, sp, True))
        assert (run.partial_tensors, run.partial_elements) == held
    # three all-reduces per parameter, each of its whole gradient: 27 calls, 3 x 2,304 x 4
    # bytes of float32; the ring's bus bytes 2 (n - 1) / n of that (1 at TP 2, 1.5 at TP 4)
    from flopscope.plan.update import update_collectives

    (two,) = update_collectives(9, 2_304, torch.float32, hw, 2)
    assert (two.kind, two.group, two.calls, two.payload_bytes, two.bus_bytes) == (
        "all_reduce", "tp", 27, 27_648, 27_648)
    (four,) = update_collectives(9, 2_304, torch.float32, hw, 4)
    assert (four.group_size, four.bus_bytes) == (4, 41_472)
    assert update_collectives(0, 0, torch.float32, hw, 2) == ()
    # the plan's update carries them at the links: 27 x 12 us + 3 x 2,304 x 2 bytes (bfloat16)
    # / 450 GB/s on the H100's NVLink
    plain, sp_plan = (flopscope.plan("hf:llama", **ARGS, sequence_parallel=s)
                      for s in (False, True))
    assert isinstance(plain, Plan) and isinstance(sp_plan, Plan)
    extra = sp_plan.ranked[0].time.optimizer - plain.ranked[0].time.optimizer
    assert extra == pytest.approx(27 * 12e-6 + 13_824 / 450e9, rel=1e-9)


def test_partial_gradients_all_reduced_as_torch_counts_them() -> None:
    # independent: torch's CommDebugMode around AdamW's step on the model itself, sharded with
    # sequence parallelism on a fake group of 2, counts the all-reduces update_collectives says
    from torch.distributed.tensor.debug import CommDebugMode

    from flopscope.distributed import Layout, apply_layout
    from flopscope.distributed.world import fake_world
    from flopscope.plan.update import update_collectives

    build = build_model("hf:llama", 64, "float32", CONFIG)
    with fake_world(2, 0):
        model, args, kwargs = build(1, "none")
        model = model.to_empty(device="cpu") if next(model.parameters()).is_meta else model
        layout = Layout(2, tp=2, rank=0, sequence_parallel=True)
        apply_layout(model, layout, layout.mesh())
        model(*args, **kwargs).logits.float().sum().backward()
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        with CommDebugMode() as comm:
            opt.step()
        counted = comm.get_comm_counts()
    (record,) = update_collectives(9, 2_304, torch.float32, PROFILES["h100-sxm"], 2)
    assert sum(counted.values()) == record.calls == 27
    assert {str(k) for k in counted} == {"c10d_functional.all_reduce"}
