"""Mixture of experts (issue 12): transformers' Mixtral under every CPU experts implementation
counts the router plus the k routed experts' MACs; ``generate()`` lists nothing uncounted."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import flopscope

transformers = pytest.importorskip("transformers")

# tiny Mixtral: hidden H = 32, expert intermediate INTER = 48, E = 4 experts, top k = 2, 2 layers
H, INTER, E, K, LAYERS, VOCAB = 32, 48, 4, 2, 2, 128
T = 10  # tokens (batch 1)


def _mixtral(impl: str) -> torch.nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=E,
        num_experts_per_tok=K, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    model.set_experts_implementation(impl)
    assert model.config._experts_implementation == impl
    return model


# "deepgemm" and "sonicmoe" are CUDA kernels; these are the implementations a CPU runs (eager:
# a Python loop over the experts hit; grouped_mm: aten._grouped_mm over tokens sorted by expert,
# the default on torch >= 2.9; batched_mm: one bmm per (token, expert) pair)
IMPLEMENTATIONS = ["eager", "grouped_mm", "batched_mm"]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_mixtral_counts_router_and_routed_experts(impl: str) -> None:
    model = _mixtral(impl)
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = flopscope.count(model, ids)
    assert report.uncounted == {}
    moe = report.by_module()
    # per MoE block, hand formula:
    #   router:  T * H * E                = 10 * 32 * 4          =  1,280 MACs
    #   experts: T * k pairs, each gate_up (H -> 2I) and down (I -> H) = 3 * H * I MACs:
    #            10 * 2 * 3 * 32 * 48     =                         92,160 MACs
    #   total                                                       93,440 MACs
    for layer in range(LAYERS):
        block = f"model.layers.{layer}.mlp"
        assert moe[f"{block}.gate"].inclusive.macs == T * H * E == 1_280
        assert moe[f"{block}.experts"].inclusive.macs == T * K * 3 * H * INTER == 92_160
        assert moe[block].inclusive.macs == 93_440
    # whole model: 2 * 93,440 (MoE) + attention per layer: q (32x32), k and v (32x16 each, 2 kv
    # heads of 8), o (32x32) = 3,072 per token -> 30,720, plus Q K^T and P V, 4 heads * 10 * 10 *
    # 8 each = 3,200 + 3,200, so 37,120 per layer; lm_head 10 * 32 * 128 = 40,960:
    # 186,880 + 74,240 + 40,960 = 302,080, the same for every implementation
    assert report.macs == 302_080


@pytest.mark.parametrize("backward", [False, True])
def test_float32_grouped_mm_counts_shape_only(backward: bool) -> None:
    """The CPU runs _grouped_mm in float32, torch's meta kernel accepts only bfloat16/float16:
    shape-only counts of a float32 Mixtral take the CPU's behaviour (flopscope.execution.meta)."""
    model = _mixtral("grouped_mm")
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = flopscope.count(model, ids, backward=backward)
        shape = flopscope.count(model, ids, shape_only=True, backward=backward)
        meta = flopscope.count(_mixtral("grouped_mm").to("meta"), ids, backward=backward)
    grouped = "aten._grouped_mm.default"
    for report in (shape, meta):
        # the same 302,080 forward MACs as test_mixtral_counts_router_and_routed_experts (and the
        # backward's), every _grouped_mm call in float32 at the CPU's cost
        assert report.macs == real.macs
        assert report.by_op()[grouped] == real.by_op()[grouped]
    assert shape.macs == (302_080 if not backward else real.macs)


def test_generate_on_tiny_llama_counts_everything() -> None:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with flopscope.Counter(model) as counter:
            out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8)
    report = counter.report
    assert report.uncounted == {}
    # generate() checks for stop tokens with aten.isin every step, now counted (a search)
    assert "aten.isin.Tensor_Tensor" in report.by_op() or any(
        name.startswith("aten.isin") for name in report.by_op())
    # lm_head: 3 forwards (the 5-token prompt, then 1 new token twice), each computing logits
    # for its last position only (generate() passes logits_to_keep=1): 3 * 32 * 128 = 12,288
    assert report.by_module()["lm_head"].inclusive.macs == 3 * 32 * VOCAB


# -- expert parallelism (issue 15) ----------------------------------------------------------------
EP_BATCH = 4  # the expert-parallel group's batch: 2 rows of T tokens per rank at ep = 2


def _ep_build() -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, object]]:
    model = _mixtral("eager")
    ids = torch.randint(0, VOCAB, (EP_BATCH, T), generator=torch.Generator().manual_seed(1))
    return model, (ids,), {}


def _pairs_per_rank(ep: int) -> list[list[list[int]]]:
    """pairs[sender][layer][receiver]: (token, expert) pairs of sender's batch routed to
    receiver's experts, from the model's own router logits (output_router_logits), not from
    flopscope's routing pass."""
    model, (ids,), _ = _ep_build()
    out = []
    for rows in ids.chunk(ep):
        with torch.no_grad():
            logits = model(rows, output_router_logits=True).router_logits
        per_layer = []
        for layer_logits in logits:
            top = torch.topk(torch.softmax(layer_logits.float(), dim=-1), K, dim=-1).indices
            per_layer.append([int(((top // (E // ep)) == r).sum()) for r in range(ep)])
        out.append(per_layer)
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_expert_parallel_rank_from_the_real_routing(rank: int) -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    ep = 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_build, Layout(ep, ep=ep, rank=rank), shape_only=False,
                          warn=False)
        model, (ids,), _ = _ep_build()
        local = flopscope.count(model, ids.chunk(ep)[rank], warn=False)
    pairs = _pairs_per_rank(ep)
    assert report.uncounted == {}
    assert (report.rank, report.world_size) == (rank, ep)
    own_tokens = (EP_BATCH // ep) * T  # 20 tokens, 40 (token, expert) pairs per layer
    experts_total = 0
    for layer in range(LAYERS):
        block = f"model.layers.{layer}.mlp"
        received = sum(pairs[s][layer][rank] for s in range(ep))  # pairs this rank's experts run
        sent = own_tokens * K  # every pair of the rank's tokens goes through the dispatch
        assert sum(pairs[rank][layer]) == sent == 40
        # the rank's experts: 3 H I MACs per pair it received (gate_up H -> 2I, down I -> H)
        experts = report.total(Phase.FORWARD, module=f"{block}.experts").macs
        assert experts == received * 3 * H * INTER
        experts_total += experts
        # forward all-to-alls: the counts (ep x E/ep int64 = 32 bytes), the dispatch (its own
        # pairs' hidden states, H float32 each) and the combine (the results of the pairs its
        # experts ran): bus (n - 1) / n of each
        a2a = [r for r in report.communication
               if r.module == f"{block}.experts" and r.phase is Phase.FORWARD]
        assert [(r.kind, r.calls, r.group_size) for r in a2a] == [("all_to_all", 3, ep)]
        assert a2a[0].payload_bytes == ep * (E // ep) * 8 + (sent + received) * H * 4
        assert a2a[0].bus_bytes == sum(b * (ep - 1) // ep for b in (
            ep * (E // ep) * 8, sent * H * 4, received * H * 4))
    # everything but the experts is the unsharded model on the rank's own batch
    assert report.macs - experts_total == local.macs - sum(
        local.total(module=f"model.layers.{i}.mlp.experts").macs for i in range(LAYERS))


def test_expert_parallel_needs_moe() -> None:
    from flopscope.distributed import Layout, simulate
    from flopscope.errors import UsageError

    with pytest.raises(UsageError, match="built over the whole world"):
        Layout(4, tp=2, ep=2)
    with pytest.raises(UsageError, match="pipeline stages with experts"):
        Layout(4, pp=2, ep=4)
    with pytest.raises(UsageError, match="in groups of --ep ranks that divide the world"):
        Layout(4, ep=2)  # expert groups need FSDP2 over the whole world
    with pytest.raises(UsageError, match="in groups of --ep ranks that divide the world"):
        Layout(4, ep=2, tp=2, fsdp=2)
    with pytest.raises(UsageError, match="4 experts do not split over ep = 8 ranks"):
        simulate(_ep_meta_build, Layout(8, ep=8), shape_only=True, logical=False)
    with pytest.raises(UsageError, match="counted shape-only"):
        simulate(_ep_build, Layout(4, ep=4, tp=2), shape_only=False, logical=False)

    def dense() -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, object]]:
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=4,
                                          num_key_value_heads=2)
        return transformers.LlamaForCausalLM(config), (torch.zeros(2, 4, dtype=torch.long),), {}

    with pytest.raises(UsageError, match="has no mixture-of-experts blocks"):
        simulate(dense, Layout(2, ep=2), shape_only=False)


def test_expert_parallel_backward() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    ep, rank = 2, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_build, Layout(ep, ep=ep, rank=rank), shape_only=False,
                          backward=True, logical=False, warn=False)
    pairs = _pairs_per_rank(ep)
    assert report.uncounted == {}
    for layer in range(LAYERS):
        experts = f"model.layers.{layer}.mlp.experts"
        received = sum(pairs[s][layer][rank] for s in range(ep))
        # backward of the rank's experts: input and weight gradients, 2 x 3 H I per pair
        assert report.total(Phase.BACKWARD, module=experts).macs == received * 2 * 3 * H * INTER
        # the two all-to-alls run backwards: the combine's gradient goes to the experts' ranks
        # (the rank's own pairs), the dispatch's comes back (the pairs its experts ran)
        a2a = [r for r in report.communication
               if r.module == experts and r.phase is Phase.BACKWARD]
        assert [(r.kind, r.calls) for r in a2a] == [("all_to_all", 2)]
        assert a2a[0].payload_bytes == (40 + received) * H * 4
        # the router's own top-k weights carry its gradient: input and weight gradients of
        # the 20 tokens x H -> E product, 2 x 20 x 32 x 4 = 5,120 MACs
        gate = f"model.layers.{layer}.mlp.gate"
        assert report.total(Phase.BACKWARD, module=gate).macs == 2 * 20 * H * E == 5_120


# -- expert parallelism shape-only: balanced routing assumed ----------------------------------------
def test_balanced_routing_splits_evenly_and_receives_what_it_sends() -> None:
    from flopscope.distributed.experts import BalancedRouting

    routing = BalancedRouting(4)
    # 18 pairs over 4 ranks: 4 each and 2 left over, sent by rank s to ranks s and s + 1
    assert routing.sent(18, 0) == [5, 5, 4, 4]
    assert routing.sent(18, 3) == [5, 4, 4, 5]
    # rank 1 receives the extra pair from itself and from rank 0
    assert routing.received(18, 1) == [5, 5, 4, 4]
    for rank in range(4):
        assert sum(routing.received(18, rank)) == sum(routing.sent(18, rank)) == 18
        assert routing.received(18, rank) == [routing.sent(18, s)[rank] for s in range(4)]
    assert BalancedRouting(8).sent(256, 5) == [32] * 8
    assert BalancedRouting(8).to_dict()["routing"] == "balanced"


T_ODD = 9  # tokens of every rank's batch: 9 x top-2 = 18 pairs, which 4 ranks do not divide


def _ep_meta_build() -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, object]]:
    # bfloat16, Mixtral's published dtype: torch's meta kernel of _grouped_mm (the default
    # experts implementation) refuses float32, which the CPU kernel takes
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=E,
        num_experts_per_tok=K, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config).eval().to(torch.bfloat16)
    assert model.config._experts_implementation == "grouped_mm"
    return model, (torch.zeros(1, T_ODD, dtype=torch.long, device="meta"),), {}


def test_expert_parallel_shape_only_assumes_balanced_routing() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    ep, rank = 4, 2  # 4 ranks, one expert each
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build, Layout(ep, ep=ep, rank=rank), shape_only=True,
                          backward=True, warn=False)
    assert report.uncounted == {}
    assert report.shape_only and (report.rank, report.world_size) == (rank, ep)
    pairs = T_ODD * K  # 18: the rank sends 5, 5, 4, 4 and receives 5 + 5 + 4 + 4 = 18 pairs
    bf16 = 2
    experts_forward = 0
    for layer in range(LAYERS):
        experts = f"model.layers.{layer}.mlp.experts"
        # the rank's expert: 3 H I MACs per pair received (18 x 3 x 32 x 48 = 82,944), twice
        # that in backward (input and weight gradients)
        assert report.total(Phase.FORWARD, module=experts).macs == pairs * 3 * H * INTER == 82_944
        assert report.total(Phase.BACKWARD, module=experts).macs == 2 * 82_944
        experts_forward += 82_944
        fwd = [r for r in report.communication if r.module == experts and r.phase is Phase.FORWARD]
        bwd = [r for r in report.communication
               if r.module == experts and r.phase is Phase.BACKWARD]
        # forward: the counts (4 x 1 int64 = 32 bytes), 18 pairs' hidden states out (18 x 32
        # bf16 = 1,152 bytes) and 18 back; bus 3/4 of each: 24 + 864 + 864
        assert [(r.kind, r.calls, r.group_size) for r in fwd] == [("all_to_all", 3, ep)]
        assert fwd[0].payload_bytes == ep * 8 + 2 * pairs * H * bf16 == 2_336
        assert fwd[0].bus_bytes == 24 + 864 + 864
        # backward: the two pair exchanges again, the other way
        assert [(r.kind, r.calls, r.payload_bytes) for r in bwd] == [("all_to_all", 2, 2_304)]
    # the rest is the unsharded model on the rank's own batch (shape-only: the input is every
    # rank's batch); its experts run the same 18 pairs per layer
    logical_forward = sum(r.cost.macs for r in report.logical if r.phase is Phase.FORWARD)
    assert report.total(Phase.FORWARD).macs - experts_forward == logical_forward - LAYERS * 82_944


def test_expert_parallel_with_fsdp2_shards_the_rest() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    ep, rank = 4, 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build, Layout(ep, ep=ep, fsdp=ep, rank=rank),
                          shape_only=True, backward=True, logical=False, warn=False)
    assert report.uncounted == {}
    bf16 = 2
    # FSDP2 units: each decoder layer without its experts (q 32x32, k and v 16x32, o 32x32,
    # router 4x32, two norms of 32: 3,264 parameters) and the root (embedding and head 128x32
    # each, final norm 32: 8,224); the experts' 4 x 3 x 32 x 48 parameters per layer stay on
    # their ranks and are never gathered
    layer_bytes, root_bytes = 3_264 * bf16, 8_224 * bf16
    model, _, _ = _ep_meta_build()
    assert sum(p.numel() * bf16 for n, p in model.named_parameters()
               if ".experts." not in n) == LAYERS * layer_bytes + root_bytes
    by_kind: dict[tuple[str, Phase], list[int]] = {}
    for r in report.communication:
        acc = by_kind.setdefault((r.kind, r.phase), [0, 0, 0])
        acc[0] += r.calls
        acc[1] += r.payload_bytes
        acc[2] += r.bus_bytes
    gathered = LAYERS * layer_bytes + root_bytes  # 29,504 bytes, bus 3/4 of it
    assert by_kind[("all_gather", Phase.FORWARD)] == [3, gathered, gathered * 3 // 4]
    # backward: the layers gathered again (the root stays unsharded), every unit's gradients
    # reduce-scattered, the experts' gradients not (each expert lives on one rank)
    assert by_kind[("all_gather", Phase.BACKWARD)] == [2, 2 * layer_bytes, 2 * layer_bytes * 3 // 4]
    assert by_kind[("reduce_scatter", Phase.BACKWARD)] == [3, gathered, gathered * 3 // 4]
    # the all-to-alls and the rank's experts as without FSDP2 (18 pairs per layer)
    assert by_kind[("all_to_all", Phase.FORWARD)] == [6, 2 * 2_336, 2 * 1_752]
    for layer in range(LAYERS):
        experts = f"model.layers.{layer}.mlp.experts"
        assert report.total(Phase.FORWARD, module=experts).macs == 82_944
        assert report.total(Phase.BACKWARD, module=experts).macs == 2 * 82_944


def test_count_cli_shape_only_ep_says_routing_is_assumed(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from flopscope.cli import main

    mixtral = ["hf:mixtral", "--config", f"hidden_size={H}", "--config",
               f"intermediate_size={INTER}", "--config", f"num_hidden_layers={LAYERS}",
               "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2",
               "--config", f"num_local_experts={E}", "--config", f"vocab_size={VOCAB}",
               "--seq-len", str(T_ODD), "--dtype", "bfloat16", "--shape-only"]
    capsys.readouterr()
    assert main(["count", *mixtral, "--world-size", "4", "--ep", "4", "--fsdp", "4",
                 "--rank", "3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["expert_routing"]["routing"] == "balanced"
    assert data["expert_routing"]["ep"] == 4
    kinds = data["communication"]["kinds"]
    # the same rank as in the library tests: 2 x 3 all-to-alls of 2,336 bytes; FSDP2's forward
    # all-gathers of the 29,504 bytes of non-expert parameters
    assert kinds["all_to_all"]["payload_bytes"] == 2 * 2_336
    assert kinds["all_gather"]["payload_bytes"] == 29_504
    capsys.readouterr()
    assert main(["count", *mixtral, "--world-size", "4", "--ep", "4"]) == 0
    assert "expert routing: assumed balanced" in capsys.readouterr().out


def test_expert_parallel_with_tensor_parallel_attention_and_fsdp2() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    # 4 ranks: tp 2 (ranks 0-1 and 2-3 share a batch of 9 tokens), FSDP2 over 2, experts over 4
    world, tp, rank = 4, 2, 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build, Layout(world, ep=world, tp=tp, fsdp=2, rank=rank),
                          shape_only=True, backward=True, logical=False, warn=False)
    assert report.uncounted == {}
    bf16, f32 = 2, 4
    # transformers' dispatch slices the shared batch: 9 tokens -> 5 rows (tp rank 0), 4 (tp rank
    # 1); pairs of ranks 0..3: 10, 8, 10, 8. Balanced: rank 1 sends 2 to each rank (8 / 4) and
    # receives 3 from rank 0 (10 = 2 x 4 + 2 extra, to ranks 0 and 1), 2 from ranks 1, 2, 3: 9
    sent, received = 8, 9
    comm: dict[tuple[str, str, Phase], list[int]] = {}
    for r in report.communication:
        acc = comm.setdefault((r.module, r.kind, r.phase), [0, 0])
        acc[0] += r.calls
        acc[1] += r.payload_bytes
    for layer in range(LAYERS):
        block = f"model.layers.{layer}"
        experts = f"{block}.mlp.experts"
        assert report.total(Phase.FORWARD, module=experts).macs == received * 3 * H * INTER
        assert report.total(Phase.BACKWARD, module=experts).macs == 2 * 9 * 3 * H * INTER
        # the router runs on the whole shared batch on both tensor-parallel ranks: 9 x 32 x 4
        assert report.total(Phase.FORWARD, module=f"{block}.mlp.gate").macs == 9 * H * E
        # q_proj column-wise: 9 tokens x 32 x 32 / tp
        assert report.total(Phase.FORWARD, module=f"{block}.self_attn.q_proj").macs == (
            9 * H * H // tp)
        # all-to-alls: counts (4 x 1 int64) + 8 pairs out + 9 back, bf16 hidden states
        assert comm[(experts, "all_to_all", Phase.FORWARD)] == [
            3, world * 8 + (sent + received) * H * bf16]
        # the slices' results all-gathered over tp (float32, the routing weights' dtype; the
        # shard of 4 rows padded to 5): 2 x 5 x 32 x 4 bytes
        assert comm[(experts, "all_gather", Phase.FORWARD)] == [1, 2 * 5 * H * f32]
        # backward of the slicing: the row gradients of the hidden states (bf16) and of the
        # routing weights (float32, k = 2 per row) all-gathered, 10 rows each
        assert comm[(experts, "all_gather", Phase.BACKWARD)] == [
            2, 10 * H * bf16 + 10 * K * f32]
        # the attention's tensor-parallel all-reduce: 9 x 32 bf16
        assert comm[(f"{block}.self_attn.o_proj", "all_reduce", Phase.FORWARD)] == [
            1, 9 * H * bf16]
    # FSDP2 over the 2 data-parallel ranks: per layer the tensor-parallel shards of attention
    # (3,072 / 2) + router 128 + norms 64 = 1,728 parameters; the root 8,224
    assert comm[("model.layers.0", "all_gather", Phase.FORWARD)] == [1, 1_728 * bf16]
    assert comm[("", "all_gather", Phase.FORWARD)] == [1, 8_224 * bf16]
    assert comm[("", "reduce_scatter", Phase.BACKWARD)] == [1, 8_224 * bf16]


def test_expert_parallel_real_routing_with_fsdp2() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    ep, rank = 2, 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_build, Layout(ep, ep=ep, fsdp=ep, rank=rank), shape_only=False,
                          backward=True, logical=False, warn=False)
    pairs = _pairs_per_rank(ep)
    assert report.uncounted == {}
    f32 = 4
    # float32 this time: per layer 3,264 non-expert parameters, the root 8,224 (as above)
    layer_bytes, root_bytes = 3_264 * f32, 8_224 * f32
    units = {"": root_bytes, "model.layers.0": layer_bytes, "model.layers.1": layer_bytes}
    for unit, size in units.items():
        gathered = [(r.calls, r.payload_bytes, r.bus_bytes) for r in report.communication
                    if r.module == unit and r.kind == "all_gather" and r.phase is Phase.FORWARD]
        assert gathered == [(1, size, size // 2)]
        # every unit's gradients reduce-scattered, the router's included (its top-k weights are
        # its own outputs, connected to it), the experts' not
        reduced = [(r.calls, r.payload_bytes) for r in report.communication
                   if r.module == unit and r.kind == "reduce_scatter"]
        assert reduced == [(1, size)]
    for layer in range(LAYERS):
        received = sum(pairs[s][layer][rank] for s in range(ep))
        experts = f"model.layers.{layer}.mlp.experts"
        assert report.total(Phase.FORWARD, module=experts).macs == received * 3 * H * INTER
        assert report.total(Phase.BACKWARD, module=experts).macs == received * 6 * H * INTER


@pytest.mark.parametrize("shape_only", [True, False])
def test_expert_groups_smaller_than_the_world(shape_only: bool) -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    # 4 ranks in 2 expert groups of 2 (ranks 0-1, 2-3): each expert has 2 copies, FSDP2-sharded
    # over them; the rest FSDP2-sharded over all 4. Rank 3 is position 1 of the second group.
    world, ep, rank = 4, 2, 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build if shape_only else _ep_build,
                          Layout(world, ep=ep, fsdp=world, rank=rank), shape_only=shape_only,
                          backward=True, logical=False, warn=False)
    assert report.uncounted == {}
    size = 2 if shape_only else 4  # bfloat16 / float32
    pairs = None if shape_only else _pairs_per_rank(ep)
    for layer in range(LAYERS):
        experts = f"model.layers.{layer}.mlp.experts"
        # balanced: 18 pairs, 9 to each rank of the group, 18 received; real: the pairs the
        # group's 2 batches route to position 1 (every group routes the same batches)
        received = 18 if pairs is None else sum(pairs[s][layer][rank % ep] for s in range(ep))
        assert report.total(Phase.FORWARD, module=experts).macs == received * 3 * H * INTER
        # the rank's 2 experts (2 x 3 x 32 x 48 parameters) all-gathered from their 2 copies in
        # forward and their gradients reduce-scattered between them
        mine = 2 * 3 * H * INTER * size
        ops = [(r.kind, r.phase, r.payload_bytes) for r in report.communication
               if r.module == experts and r.group_size == 2 and r.kind != "all_to_all"]
        assert ops == [("all_gather", Phase.FORWARD, mine),
                       ("reduce_scatter", Phase.BACKWARD, mine)]
        # the rest of the layer (3,264 parameters) over all 4 ranks
        gathered = [r.payload_bytes for r in report.communication
                    if r.module == f"model.layers.{layer}" and r.kind == "all_gather"
                    and r.phase is Phase.FORWARD]
        assert gathered == [3_264 * size]



def test_expert_groups_with_one_expert_per_rank_shard_along_dimension_1() -> None:
    from flopscope.cost import Phase
    from flopscope.distributed import Layout, simulate

    # 8 ranks, groups of 4: one expert per rank, 2 copies of it. Sharding the expert dimension
    # (size 1) over 2 copies would pad it to 2 and gather 2 experts' worth; torchtitan shards
    # dimension 1 instead, so the copies gather exactly one expert: 3 x 32 x 48 x 2 bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build, Layout(8, ep=4, fsdp=8, rank=5), shape_only=True,
                          backward=True, logical=False, warn=False)
    for layer in range(LAYERS):
        ops = [(r.kind, r.phase, r.payload_bytes) for r in report.communication
               if r.module == f"model.layers.{layer}.mlp.experts" and r.group_size == 2]
        assert ops == [("all_gather", Phase.FORWARD, 3 * H * INTER * 2),
                       ("reduce_scatter", Phase.BACKWARD, 9_216)]


# -- a real 2-process gloo job with expert parallelism (slow tier) ---------------------------------
EP_GLOO_FSDP = [None, 2]  # the rest replicated, then FSDP2 over both ranks


def _ep_reports(rank: int) -> Iterator[object]:
    """The tiny Mixtral's experts over 2 gloo ranks, the rank's own half of the batch, counted
    with count_rank (forward and backward), once per FSDP degree of EP_GLOO_FSDP."""
    from flopscope.distributed import Layout, apply_layout, count_rank

    for fsdp in EP_GLOO_FSDP:
        model, (ids,), _ = _ep_build()
        layout = Layout(2, ep=2, fsdp=fsdp, rank=rank)
        apply_layout(model, layout, layout.mesh())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield count_rank(model, (ids.chunk(2)[rank],), {}, backward=True, warn=False)


def _ep_gloo_rank(rank: int, out: str, port: int) -> None:
    """One rank of a real job; reports gathered to rank 0 (tests.distributed._gloo_job)."""
    from tests.distributed._gloo_job import run_ranks

    run_ranks(rank, out, port, _ep_reports)


def _ep_gloo_job(out: str, port: int) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ep_gloo_rank, args=(out, port), nprocs=2)


@pytest.mark.skipif(not __import__("os").environ.get("FLOPSCOPE_SLOW"),
                    reason="slow tier: FLOPSCOPE_SLOW=1")
def test_expert_parallel_real_gloo_job_equals_simulated(tmp_path: object) -> None:
    import json
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import torch.distributed as dist

    from flopscope import Report
    from flopscope.cost import Cost
    from flopscope.distributed import Layout, simulate

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch built without gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = Path(str(tmp_path)) / "ep.json"
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", "from tests.test_moe import _ep_gloo_job; "
                    f"_ep_gloo_job({str(out)!r}, {port})"], cwd=root, check=True, timeout=600)
    real = [[Report.from_dict(d) for d in job] for job in json.loads(out.read_text())]
    for fsdp, job in zip(EP_GLOO_FSDP, real, strict=True):
        for rank in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim = simulate(_ep_build, Layout(2, ep=2, fsdp=fsdp, rank=rank),
                               shape_only=False, backward=True, logical=False, warn=False)
            got = job[rank]
            assert (got.rank, got.world_size) == (rank, 2)
            assert sim.uncounted == got.uncounted == {}
            assert sim.communication == got.communication
            assert sim.macs == got.macs > 0
            assert sim.flops == got.flops
            if fsdp is None:
                assert sim.records == got.records
                continue
            # with FSDP2 every record that costs anything but gloo's own copy-out
            # (ProcessGroupGloo finishes an all-gather into a tensor and a reduce-scatter with a
            # split (a view, free) and a copy of the rank's chunk in Work.wait(); the fake
            # process group has none): zero-FLOP copies
            a = {(r.module, r.op, r.phase): r.cost for r in sim.records if r.cost != Cost()}
            b = {(r.module, r.op, r.phase): r.cost for r in got.records if r.cost != Cost()}
            extra = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
            assert {k[1] for k in extra} <= {"aten.copy_.default"}, extra
            assert all(k in b and b[k].flops == 0 for k in extra)
            assert len(a) - len(extra) > 50  # the rest, equal, is most of the model


@pytest.mark.parametrize(("layout", "groups"), [
    # experts over the whole world, FSDP2 on the rest over the same 4 ranks
    (dict(world_size=4, ep=4, fsdp=4),
     {("all_gather", "dp", 4), ("reduce_scatter", "dp", 4), ("all_to_all", "ep", 4)}),
    # tensor-parallel attention: the all-to-alls over every rank, FSDP2 over 2
    (dict(world_size=4, ep=4, tp=2, fsdp=2),
     {("all_gather", "tp", 2), ("all_reduce", "tp", 2), ("all_gather", "dp", 2),
      ("reduce_scatter", "dp", 2), ("all_to_all", "ep", 4)}),
    # expert groups of 4 in 8 ranks: each expert FSDP2-sharded over its 2 copies (efsdp), the
    # rest over all 8
    (dict(world_size=8, ep=4, fsdp=8),
     {("all_gather", "dp", 8), ("reduce_scatter", "dp", 8), ("all_gather", "efsdp", 2),
      ("reduce_scatter", "efsdp", 2), ("all_to_all", "ep", 4)}),
])
def test_expert_parallel_records_name_their_mesh_dimension(
        layout: dict[str, int], groups: set[tuple[str, str, int]]) -> None:
    # CommRecord.group names the device mesh's dimension, as tensor parallelism's and FSDP2's
    # records do: the all-to-alls ``ep`` (they were ``world`` with tensor parallelism), FSDP2 on
    # the non-expert parameters ``dp`` (``world`` in expert groups, ``ep`` over the whole world)
    from flopscope.distributed import Layout, simulate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(_ep_meta_build, Layout(**layout), shape_only=True, backward=True,
                          logical=False, warn=False)
    assert {(r.kind, r.group, r.group_size) for r in report.communication} == groups
