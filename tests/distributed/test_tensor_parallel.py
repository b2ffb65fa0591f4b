"""Tensor parallelism on a fake process group: a rank's report is its local shards' work, the
logical (global) figure beside it, and the all-reduces the plan inserts, with their bytes."""

from __future__ import annotations

import pytest
import torch
from tests.distributed._models import BATCH, CONFIG, SEQ, tiny_llama
from torch import nn

import flopscope
from flopscope.cost import Phase
from flopscope.distributed import Layout, fake_world, simulate

pytest.importorskip("torch.distributed.tensor")


def test_mlp_on_8_ranks_is_the_local_shard_and_one_all_reduce() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    with fake_world(8):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
        parallelize_module(model, init_device_mesh("cpu", (8,)),
                           {"0": ColwiseParallel(), "2": RowwiseParallel()})
        report = flopscope.count(model, torch.randn(4, 1024))
    # local: 4 x 1024 x (4096 / 8) + 4 x (4096 / 8) x 1024 = 2 x 2,097,152
    assert report.macs == 4_194_304
    # global: 4 x 1024 x 4096 x 2 = 33,554,432, costed on the DTensors' global shapes
    assert report.logical_total().macs == 33_554_432
    assert report.uncounted == {}
    assert (report.rank, report.world_size) == (0, 8)
    kinds = report.communication_by_kind()
    assert list(kinds) == ["all_reduce"]
    # the row-wise layer's partial sums: 4 x 1024 float32 = 16,384 bytes; ring 2 x 7/8 x 16,384
    assert kinds["all_reduce"].calls == 1
    assert kinds["all_reduce"].payload_bytes == 16_384
    assert kinds["all_reduce"].bus_bytes == 28_672
    assert report.communication[0].group_size == 8
    data = report.to_dict()
    assert data["communication"]["kinds"]["all_reduce"] == {
        "calls": 1, "payload_bytes": 16_384, "bus_bytes": 28_672}
    assert data["logical"]["totals"]["macs"] == 33_554_432
    assert flopscope.Report.from_dict(data) == report


SHARDED = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


@pytest.mark.parametrize("tp", [2, 4])
def test_llama_tensor_parallel_plan(tp: int) -> None:
    report = simulate(lambda: tiny_llama(), Layout(tp, tp=tp), backward=True, warn=False)
    model, args, kwargs = tiny_llama()
    whole = flopscope.count(model, *args, backward=True, warn=False, **kwargs)
    assert report.uncounted == {}
    assert report.logical_total() == whole.total()
    for layer in range(CONFIG["num_hidden_layers"]):
        for name in SHARDED:  # the sharded projections: global / tp, forward and backward
            path = f"model.layers.{layer}.{name}"
            for phase in (Phase.FORWARD, Phase.BACKWARD):
                assert report.total(phase, module=path).macs * tp == whole.total(
                    phase, module=path).macs, (path, phase)
        for name in ("input_layernorm", "post_attention_layernorm"):  # replicated: in full
            path = f"model.layers.{layer}.{name}"
            assert report.total(module=path) == whole.total(module=path)
    for path in ("lm_head", "model.embed_tokens", "model.norm"):
        assert report.total(module=path) == whole.total(module=path)
    assert report.replicated_total(Phase.FORWARD).flops >= whole.total(
        Phase.FORWARD, module="lm_head").flops
    # one all-reduce after attention and one after the MLP per layer in forward, each of the
    # block's output: 2 x 64 x 256 float32 = 131,072 bytes; ring 2 (tp - 1) / tp of it; charged
    # to the row-wise projection whose partial sums it adds (RowwiseParallel's output hook)
    hidden = BATCH * SEQ * CONFIG["hidden_size"] * 4
    forward = [r for r in report.communication if r.phase is Phase.FORWARD]
    assert sorted(r.module for r in forward) == sorted(
        f"model.layers.{i}.{b}" for i in range(2) for b in ("mlp.down_proj", "self_attn.o_proj"))
    for r in forward:
        assert (r.kind, r.calls, r.group_size) == ("all_reduce", 1, tp)
        assert r.payload_bytes == hidden
        assert r.bus_bytes == hidden * 2 * (tp - 1) // tp
    # backward: the input gradient of each column-wise projection is a partial sum, all-reduced
    # where the projection's input was made a replicated DTensor (q, k, v; gate, up)
    backward = [r for r in report.communication if r.phase is Phase.BACKWARD]
    assert sorted(r.module for r in backward) == sorted(
        f"model.layers.{i}.{n}" for i in range(2) for n in SHARDED
        if not n.endswith(("o_proj", "down_proj")))
    assert all(r.kind == "all_reduce" and r.payload_bytes == hidden for r in backward)


def test_llama_sequence_parallel_plan() -> None:
    tp = 2
    report = simulate(lambda: tiny_llama(), Layout(tp, tp=tp, sequence_parallel=True),
                      backward=True, warn=False)
    plain = simulate(lambda: tiny_llama(), Layout(tp, tp=tp), backward=True, logical=False,
                     warn=False)
    model, args, kwargs = tiny_llama()
    whole = flopscope.count(model, *args, backward=True, warn=False, **kwargs)
    assert report.uncounted == {}
    assert report.logical_total().macs == whole.macs
    assert report.macs == plain.macs  # the products are sharded as without sequence parallelism
    # the norms run on the rank's half of the tokens: forward and backward FLOPs / tp
    for path in ("model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm",
                 "model.norm"):
        assert report.total(module=path).flops * tp == whole.total(module=path).flops, path
    for path in ("lm_head", "model.embed_tokens"):  # replicated, in full (bytes differ: the
        # head's gathered input is a new tensor)
        mine, ref = report.total(module=path), whole.total(module=path)
        assert (mine.macs, mine.flops) == (ref.macs, ref.flops), path
    # forward, per attention and MLP block: an all-gather of the sequence shards before q/k/v
    # (gate/up) and a reduce-scatter after o (down) instead of one all-reduce, each of the whole
    # block input 2 x 64 x 256 float32 = 131,072 bytes, bus (n - 1) / n of it: together the
    # all-reduce's 2 (n - 1) / n; and the head's input gathered once
    hidden = BATCH * SEQ * CONFIG["hidden_size"] * 4
    forward = [r for r in report.communication if r.phase is Phase.FORWARD]
    blocks = sorted(f"model.layers.{i}.{b}" for i in range(2) for b in ("mlp", "self_attn"))
    rowwise = sorted(f"model.layers.{i}.{b}" for i in range(2)
                     for b in ("mlp.down_proj", "self_attn.o_proj"))
    # the gather by the block's input hook, the reduce-scatter by the row-wise projection's
    # output hook
    assert sorted(r.module for r in forward if r.kind == "all_gather") == sorted(
        [*blocks, "lm_head"])
    assert sorted(r.module for r in forward if r.kind == "reduce_scatter") == rowwise
    assert not [r for r in report.communication if r.kind == "all_reduce"]
    for r in report.communication:
        assert (r.calls, r.group_size, r.payload_bytes) == (1, tp, hidden)
        assert r.bus_bytes == hidden * (tp - 1) // tp
    # backward: the same pair per block (each the backward of a forward one, charged where
    # that ran), and the first layer's input gradient gathered
    backward = [r for r in report.communication if r.phase is Phase.BACKWARD]
    assert sorted((r.module, r.kind) for r in backward) == sorted(
        [(b, "reduce_scatter") for b in blocks] + [(b, "all_gather") for b in rowwise]
        + [("model.layers.0", "all_gather")])
    total_bus = report.communication_total(Phase.FORWARD).bus_bytes
    plain_bus = plain.communication_total(Phase.FORWARD).bus_bytes
    assert total_bus == plain_bus + hidden * (tp - 1) // tp  # + the head's gather


def test_sequence_parallel_needs_tensor_parallel() -> None:
    with pytest.raises(flopscope.UsageError, match="it needs tp >= 2"):
        simulate(lambda: tiny_llama(), Layout(2, sequence_parallel=True), logical=False)
