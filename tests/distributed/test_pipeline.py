"""Pipeline parallelism on a fake process group: every stage of the tiny Llama counted under torch's
own pipeline schedules, the activations and gradients each stage sends, and the bubble."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
import torch
from tests.distributed._models import BATCH, CONFIG, SEQ, tiny_llama
from torch import nn

import flopscope
from flopscope.cost import Phase
from flopscope.distributed import Layout, PipelineReport, simulate, simulate_pipeline
from flopscope.distributed.pipeline import bubble, split_layers
from flopscope.errors import UsageError

pytest.importorskip("torch.distributed.pipelining")

PARAMS = 1_443_072  # the tiny Llama's parameters
HIDDEN = CONFIG["hidden_size"]


@pytest.fixture(scope="module")
def whole() -> flopscope.Report:
    model, args, kwargs = tiny_llama()
    return flopscope.count(model, *args, backward=True, warn=False, **kwargs)


@pytest.fixture(scope="module", params=["1f1b", "gpipe"])
def piped(request: pytest.FixtureRequest) -> PipelineReport:
    return simulate_pipeline(lambda: tiny_llama(), Layout(2, pp=2), microbatches=2,
                             schedule=request.param, backward=True, warn=False)


def _by_module(report: flopscope.Report) -> dict[str, tuple[int, int]]:
    return {p: (m.inclusive.macs, m.inclusive.flops) for p, m in report.by_module().items()}


def test_each_stage_runs_its_own_layers(piped: PipelineReport,
                                        whole: flopscope.Report) -> None:
    first, last = piped.stages
    assert first.uncounted == last.uncounted == {}
    assert (first.rank, last.rank, piped.ranks) == (0, 1, (0, 1))
    layers = {s: {r.module.split(".")[2] for r in rep.records
                  if r.module.startswith("model.layers.")} for s, rep in enumerate(piped.stages)}
    assert layers == {0: {"0"}, 1: {"1"}}
    assert any(r.module == "model.embed_tokens" for r in first.records)
    assert not any(r.module in ("lm_head", "model.norm") for r in first.records)
    assert any(r.module == "lm_head" for r in last.records)
    # a layer's work on the stage over m microbatches = its work in the whole model's step
    # (products are linear in the batch): MACs and FLOPs, forward and backward
    ref = _by_module(whole)
    for stage in piped.stages:
        for path, cost in _by_module(stage).items():
            if path.startswith("model.layers.") and path.count(".") >= 3:
                assert cost[0] == ref[path][0], path
                forward = (stage.total(Phase.FORWARD, module=path).flops,
                           whole.total(Phase.FORWARD, module=path).flops)
                assert forward[0] == forward[1], path
    assert first.macs + last.macs == whole.macs == 532_676_608


def test_stage_flops_add_up_to_the_whole_step(piped: PipelineReport,
                                              whole: flopscope.Report) -> None:
    m, pp = 2, 2
    rotary = whole.total(module="model.rotary_emb").flops
    # cos and sin of (1, 64, 32) and their scaling: 4 x 2,048; positions x inverse frequencies
    # (64 x 16): 1,024
    assert rotary == 4 * 2048 + 1024 == 9216
    extra = (PARAMS * (m - 1)  # gradients accumulated over the microbatches: one add each
             + PARAMS  # the schedule scales the accumulated gradients by 1 / m: one div each
             + BATCH * SEQ * CONFIG["vocab_size"]  # the loss: the sum of the logits
             + rotary * (pp * m - 1))  # each stage computes cos/sin for every microbatch
    assert sum(s.flops for s in piped.stages) - whole.flops == extra == 2_979_328


def test_activations_forward_gradients_backward(piped: PipelineReport) -> None:
    # per microbatch: (2 / 2) x 64 x 256 float32 = 65,536 bytes, each way
    act = (BATCH // 2) * SEQ * HIDDEN * 4
    assert act == 65_536
    assert piped.p2p_per_microbatch(0) == {"send_forward": act, "recv_forward": 0,
                                           "send_backward": 0, "recv_backward": act}
    assert piped.p2p_per_microbatch(1) == {"send_forward": 0, "recv_forward": act,
                                           "send_backward": act, "recv_backward": 0}
    for stage in piped.stages:
        p2p = [r for r in stage.communication if r.kind in ("send", "recv")]
        assert all((r.module, r.calls, r.group_size, r.bus_bytes) == ("", 2, 2, 2 * act)
                   for r in p2p)
        assert {r.phase for r in p2p} == {Phase.FORWARD, Phase.BACKWARD}
    data = piped.to_dict()
    assert data["stages"][1]["p2p_bytes_per_microbatch"]["send_backward"] == act
    assert data["bubble_fraction"] == str(piped.bubble)


def test_bubble_is_the_replayed_schedule(piped: PipelineReport) -> None:
    forward = [Fraction(s.total(Phase.FORWARD).flops, 2) for s in piped.stages]
    backward = [Fraction(s.total(Phase.BACKWARD).flops, 2) for s in piped.stages]
    # with 2 stages and 2 microbatches GPipe and 1F1B run the same order: F0 F1 B0 B1 on the
    # first stage; the last stage starts each backward right after that microbatch's forward
    # under 1F1B (F0 B0 F1 B1), after all forwards under GPipe (F0 F1 B0 B1)
    orders = {"1f1b": [[("F", 0), ("F", 1), ("B", 0), ("B", 1)],
                       [("F", 0), ("B", 0), ("F", 1), ("B", 1)]],
              "gpipe": [[("F", 0), ("F", 1), ("B", 0), ("B", 1)],
                        [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]}
    assert (piped.bubble, piped.stage_bubbles) == bubble(orders[piped.schedule], forward,
                                                         backward)
    # equal stages, backward = 2 x forward: the textbook (p - 1) / (m + p - 1) = 1/3
    assert bubble(orders[piped.schedule], [1, 1], [2, 2])[0] == Fraction(1, 3)
    assert 0 < piped.bubble < Fraction(1, 2)


def _gpipe(p: int, m: int) -> list[list[tuple[str, int]]]:
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def _one_f_one_b(p: int, m: int) -> list[list[tuple[str, int]]]:
    out = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        acts = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [("F", warm + i), ("B", i)]
        acts += [("B", i) for i in range(m - warm, m)]
        out.append(acts)
    return out


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 32)])
def test_textbook_bubble(p: int, m: int) -> None:
    for order in (_gpipe(p, m), _one_f_one_b(p, m)):
        whole, each = bubble(order, [1] * p, [2] * p)
        assert whole == Fraction(p - 1, m + p - 1)
        assert set(each) == {Fraction(p - 1, m + p - 1)}


def test_pipeline_with_tensor_parallel_stages(whole: flopscope.Report) -> None:
    # rank 2 of pp 2 x tp 2: stage 1 (layer 1, norm, head), first tensor-parallel rank
    report = simulate(lambda: tiny_llama(), Layout(4, tp=2, pp=2, rank=2), microbatches=2,
                      backward=True, logical=False, warn=False)
    assert report.uncounted == {}
    for name in ("self_attn.q_proj", "mlp.down_proj"):
        path = f"model.layers.1.{name}"
        assert report.total(module=path).macs * 2 == whole.total(module=path).macs
    assert report.total(module="lm_head").macs == whole.total(module="lm_head").macs
    kinds = report.communication_by_kind()
    # tensor parallel inside the stage: 2 forward + 5 backward all-reduces per microbatch, each
    # of a microbatch's hidden states (1 x 64 x 256 float32 = 65,536 bytes)
    assert kinds["all_reduce"].calls == 7 * 2
    assert kinds["all_reduce"].payload_bytes == 7 * 2 * 65_536
    assert (kinds["recv"].payload_bytes, kinds["send"].payload_bytes) == (2 * 65_536,
                                                                          2 * 65_536)


def test_split_layers() -> None:
    assert split_layers(80, 8) == [range(10 * s, 10 * s + 10) for s in range(8)]
    assert split_layers(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    with pytest.raises(UsageError, match="--pp 3 is more pipeline stages than the model's 2"):
        split_layers(2, 3)


def test_bad_pipelines_are_refused() -> None:
    with pytest.raises(UsageError, match="3 microbatches do not split the batch of 2"):
        simulate(lambda: tiny_llama(), Layout(2, pp=2), microbatches=3, logical=False)
    with pytest.raises(UsageError, match="unknown pipeline schedule 'zb'"):
        simulate(lambda: tiny_llama(), Layout(2, pp=2), schedule="zb", logical=False)
    with pytest.raises(UsageError, match="needs a layout with pp >= 2"):
        simulate_pipeline(lambda: tiny_llama(), Layout(2, tp=2))
    with pytest.raises(UsageError, match="not a multiple of tp x pp = 2 x 2"):
        Layout(6, tp=2, pp=2)

    def mlp() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        return nn.Sequential(nn.Linear(4, 4)), (torch.zeros(2, 4, dtype=torch.long),), {}

    with pytest.raises(UsageError, match="Sequential is not split into pipeline stages"):
        simulate(mlp, Layout(2, pp=2), logical=False)


def test_pipeline_with_fsdp_stages() -> None:
    # rank 0 of pp 2 x fsdp 2: stage 0 sharded over 2 ranks; gradients are reduce-scattered once
    # per step, after the last microbatch's backward (charged to backward, like the 1/m scaling
    # and the gradients sent back, though torch's schedule runs them outside autograd's nodes)
    report = simulate(lambda: tiny_llama(), Layout(4, fsdp=2, pp=2), microbatches=2,
                      backward=True, logical=False, warn=False)
    assert report.uncounted == {}
    scatters = [r for r in report.communication if r.kind == "reduce_scatter"]
    assert {r.phase for r in scatters} == {Phase.BACKWARD}
    assert sum(r.calls for r in scatters) == 2  # the root's group and layer 0's
    recv = [r for r in report.communication if r.kind == "recv"]
    assert [(r.phase, r.payload_bytes) for r in recv] == [(Phase.BACKWARD, 2 * 65_536)]
    ops = {(r.op, r.phase) for r in report.records if r.module == ""}
    assert ("aten.div_.Tensor", Phase.FORWARD) not in ops  # the 1/m scaling is backward work
    assert ("c10d.recv_.default", Phase.BACKWARD) in ops


def test_sequence_parallel_stages() -> None:
    # PP 2 x TP 2 with sequence parallelism: each stage's layers run on sequence shards and
    # the boundary carries this rank's shard, 1 x 32 x 256 float32 = 32,768 bytes a
    # microbatch where plain tensor parallelism sends the whole 65,536
    for rank in (0, 2):
        report = simulate(lambda: tiny_llama(), Layout(4, tp=2, pp=2, rank=rank,
                                                       sequence_parallel=True),
                          microbatches=2, backward=True, logical=False, warn=False)
        assert report.uncounted == {}
        kinds = report.communication_by_kind()
        assert (kinds["send"].payload_bytes, kinds["recv"].payload_bytes) == (2 * 32_768,
                                                                              2 * 32_768)
        # per microbatch, a layer's all-gathers before attention and the MLP and
        # reduce-scatters after, the reverse in backward (2 + 2 each); the first stage's first
        # layer takes its shard of the embedding (a slice) whose backward gathers (+1), the
        # last stage's head gathers the norm's shards (+1): 5 all-gathers and 4
        # reduce-scatters of n x shard = 65,536 bytes each, 2 microbatches
        assert "all_reduce" not in kinds
        assert (kinds["all_gather"].calls, kinds["reduce_scatter"].calls) == (10, 8)
        assert kinds["all_gather"].payload_bytes == 10 * 65_536
        assert kinds["reduce_scatter"].payload_bytes == 8 * 65_536


def test_sequence_parallel_stages_need_whole_shards() -> None:
    # 63 tokens do not split over 2 tensor-parallel ranks: refused before the step, by name
    def odd() -> Any:
        model, args, kwargs = tiny_llama()
        return model, args, {"input_ids": kwargs["input_ids"][:, :63]}

    with pytest.raises(UsageError, match="sequence of 63 tokens does not split over 2"):
        simulate(odd, Layout(4, tp=2, pp=2, sequence_parallel=True), microbatches=2,
                 logical=False, warn=False)


def test_the_loss_parallel_hint_and_the_pipelines_head() -> None:
    # the off line suggests --loss-parallel only for layouts that can take it
    from flopscope.distributed.display import loss_parallel_section

    (plain,) = loss_parallel_section(Layout(2, tp=2), "sum").text
    (staged,) = loss_parallel_section(Layout(4, tp=2, pp=2), "sum").text
    (on,) = loss_parallel_section(Layout(4, tp=2, pp=2, loss_parallel=True),
                                  "cross_entropy").text
    assert "--loss-parallel shards it" in plain and "--loss-parallel shards it" in staged
    assert "lm_head of the last pipeline stage whole" in staged
    assert on.startswith("loss parallelism: on: lm_head of the last pipeline stage column-wise")
