"""flopscope plan for a mixture of experts: a tiny transformers Mixtral planned with expert
parallelism (issue 31)."""

from __future__ import annotations

from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan import Plan, ServePlan
from flopscope.plan.build import build_model
from flopscope.plan.experts import ExpertRoles, expert_layouts
from flopscope.plan.serve_rows import serve_layouts
from flopscope.plan.space import Choice, ModelShape, expert_degree

# hidden 256, 8 heads of 32, 4 KV heads, 2 layers, vocab 512; 4 experts of MLP size 512, top 2
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                              num_local_experts=4, num_experts_per_tok=2)
ARGS: dict[str, Any] = dict(gpus=4, hardware="h100", config=CONFIG, seq_len=64, global_batch=4,
                            checkpointing=("none",))


@pytest.fixture(scope="module")
def mixtral() -> Plan:
    plan = flopscope.plan("hf:mixtral", **ARGS)
    assert isinstance(plan, Plan)
    return plan


def test_ep_sizes_divide_the_experts() -> None:
    shape = ModelShape(layers=2, heads=8, kv_heads=4, intermediate=512)
    # 4 GPUs, 4 experts, 4 sequences: tp 1 (4 data-parallel ranks, 1 sequence each): ep 2
    # (groups of 2) and 4; tp 2 (2 ranks of 2 sequences: micro-batch 1 or 2) and tp 4 (1 rank of
    # 4: micro-batch 1, 2, 4): ep 4, the whole world
    got = expert_layouts(4, shape, 4, 4, ("none",))
    assert [(c.tp, c.dp, c.ep, c.micro_batch) for c in got] == [
        (1, 4, 2, 1), (1, 4, 4, 1), (2, 2, 4, 1), (2, 2, 4, 2), (4, 1, 4, 1), (4, 1, 4, 2),
        (4, 1, 4, 4)]
    assert got[1].label == "TP1 PP1 DP4 EP4 mb1x1"
    # 8 GPUs and 4 experts: ep 8 would split an expert; 2 and 4 do not; with tp, no ep = 8
    eight = expert_layouts(8, shape, 4, 8, ("none",))
    assert {c.ep for c in eight} == {2, 4} and {c.tp for c in eight} == {1}


def test_plan_has_expert_parallel_layouts(mixtral: Plan) -> None:
    every = (*mixtral.ranked, *mixtral.dropped)
    eps = {c.choice.label for c in every if c.choice.ep > 1}
    assert eps == {"TP1 PP1 DP4 EP2 mb1x1", "TP1 PP1 DP4 EP4 mb1x1", "TP2 PP1 DP2 EP4 mb1x2",
                   "TP2 PP1 DP2 EP4 mb2x1", "TP4 PP1 DP1 EP4 mb1x4", "TP4 PP1 DP1 EP4 mb2x2",
                   "TP4 PP1 DP1 EP4 mb4x1"}
    assert all(c.choice.pp == 1 for c in every if c.choice.ep > 1)
    for c in every:
        t = c.time
        assert t.total == pytest.approx(sum(t.parts().values()))
        # the dispatch and combine all-to-alls: every second exposed at the bound (no host);
        # in the prediction only beyond the time the device waits for the host (this tiny
        # model's steps on the H100 are host-bound: some or all of them hide there)
        assert (c.bound_step.ep_comm > 0) == (c.choice.ep > 1)
        assert 0.0 <= t.ep_comm <= c.bound_step.ep_comm


def test_each_rank_holds_its_share_of_the_experts() -> None:
    """Every rank of TP1 x EP4 holds one whole expert per layer and a quarter of the rest
    (FSDP2 over the 4 ranks): experts per layer 4 x (2 x 512 x 256 + 256 x 512) = 1,572,864
    parameters, one of four on each rank: 393,216 x 2 layers; the rest (embedding and head
    512 x 256 each, final norm 256, per layer q, o 256 x 256, k, v 128 x 256, two norms 256,
    router 4 x 256: 198,144) 658,688 / 4; bfloat16."""
    roles = ExpertRoles(build_model("hf:mixtral", 64, "bfloat16", CONFIG), PROFILES["h100-sxm"],
                        "test")
    (run,) = roles.runs(Choice(1, 1, 4, 1, 1, "none", "fsdp", 4))
    assert run.parameter_bytes == 2 * (393_216 * 2 + 658_688 // 4)
    sends = [c for c in run.report.communication if c.kind == "all_to_all"]
    assert sends and {c.group_size for c in sends} == {4}
    (groups,) = roles.runs(Choice(1, 1, 4, 1, 1, "none", "fsdp", 2))
    assert {c.group_size for c in groups.report.communication if c.kind == "all_to_all"} == {2}


def test_cli_ep_filter_and_errors(capsys: pytest.CaptureFixture[str], mixtral: Plan) -> None:
    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    argv = ["plan", "hf:mixtral", "--gpus", "4", "--hardware", "h100", "--seq-len", "64",
            "--global-batch", "4", "--checkpointing", "none", "--ep", "4", *flags]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "6 layouts: " in out  # the EP4 layouts of the test above
    assert " EP4 " in out.split("Best: ")[1].splitlines()[0]
    assert main(["plan", "hf:llama", "--gpus", "2", "--ep", "2"]) == 2
    assert "hf:llama has no experts: --ep 2 applies to a mixture of experts" in \
        capsys.readouterr().err


def test_api_ep_on_a_dense_model() -> None:
    with pytest.raises(UsageError, match="has no experts"):
        flopscope.plan("hf:llama", gpus=2, ep=2, config={"num_hidden_layers": 2})


def test_serving_layouts_shard_the_experts_over_the_tensor_parallel_ranks() -> None:
    # 6 experts: tp 2 divides them (ep 2), tp 4 does not (no such layout); a dense model as before
    moe = ModelShape(layers=2, heads=8, kv_heads=4, intermediate=512, experts=6)
    got = [(s.tp, s.pp, s.replicas, s.ep) for s in serve_layouts(4, moe)]
    assert got == [(1, 1, 4, 1), (1, 2, 2, 1), (2, 1, 2, 2), (2, 2, 1, 2)]
    assert serve_layouts(4, moe)[2].label == "TP2 PP1 DP2 EP2"
    dense = ModelShape(layers=2, heads=8, kv_heads=4, intermediate=512)
    assert [s.ep for s in serve_layouts(4, dense)] == [1] * 5
    assert expert_degree(6, 4) is None and expert_degree(0, 4) == 1 and expert_degree(4, 4) == 4


def test_serving_a_mixture_of_experts() -> None:
    plan = flopscope.plan("hf:mixtral", gpus=2, hardware="h100", config=CONFIG, mode="serve",
                          seq_len=64, max_new_tokens=8, batches=[1], memory_budget=64 * 2**20)
    assert isinstance(plan, ServePlan)
    rows = {c.layout.label: c for c in plan.ranked if c.batch == 1}
    assert set(rows) == {"TP1 PP1 DP2", "TP1 PP2 DP1", "TP2 PP1 DP1 EP2"}
    # weights per rank, bfloat16: per layer attention q, o 256 x 256 and k, v 256 x 128 (196,608),
    # 2 norms (512), the router 4 x 256 (1,024), 4 experts of 3 x 256 x 512 (1,572,864); the
    # embedding and the head 512 x 256 each and the final norm (262,400). TP2 EP2 halves the
    # attention and holds 2 of the 4 experts (it was every expert on every rank: 7.0 of 7.6 MB)
    assert rows["TP1 PP1 DP2"].weights_bytes == 2 * (2 * 1_771_008 + 262_400)
    assert rows["TP2 PP1 DP1 EP2"].weights_bytes == 2 * (2 * 886_272 + 262_400)
    sharded, whole = rows["TP2 PP1 DP1 EP2"].decode, rows["TP1 PP1 DP2"].decode
    # the tokens' dispatch to their experts' ranks and back: a part of its own, exposed
    assert sharded.ep_comm > 0 and whole.ep_comm == 0 and whole.tp_comm == 0
    assert sharded.total >= sharded.compute + sharded.tp_comm + sharded.ep_comm
    step = plan.to_dict()["ranked"]
    assert {r["layout"]: r["decode_step_s"]["ep_comm"] > 0 for r in step if r["batch"] == 1} == {
        "TP1 PP1 DP2": False, "TP1 PP2 DP1": False, "TP2 PP1 DP1 EP2": True}
    assert {r["layout"]: r["ep"] for r in step if r["batch"] == 1} == {
        "TP1 PP1 DP2": 1, "TP1 PP2 DP1": 1, "TP2 PP1 DP1 EP2": 2}


def test_a_shared_expert_is_sharded_as_a_dense_mlp() -> None:
    from flopscope.plan.serving import simulate_serving

    # a tiny Qwen2-MoE: hidden 256, 8 heads of 32, 4 KV heads, 4 experts of MLP 128 (top 2) and a
    # shared expert of MLP 512, 2 layers, vocab 512
    config = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                  moe_intermediate_size=128, shared_expert_intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                  num_experts=4, num_experts_per_tok=2)
    build = build_model("hf:qwen2_moe", 64, "bfloat16", config)

    def model() -> Any:
        return build(1, "none")[0].eval()

    run = simulate_serving(model, 2, 1, 64, 2, PROFILES["h100-sxm"])
    # per layer on a rank of TP2 EP2: attention q, o 256 x 256 and k, v 128 x 256 halved with
    # their biases (98,560), 2 norms (512), the router 4 x 256 (1,024), 2 of the 4 experts of
    # 3 x 256 x 128 (196,608), the shared expert's 3 x 512 x 256 halved (196,608; it was whole)
    # and its gate 256; the embedding, the head (512 x 256 each) and the final norm 262,400;
    # bfloat16
    assert run.weight_bytes == 2 * (2 * 493_568 + 262_400)
    # one all-reduce after attention and one after the shared expert, per layer
    assert sum(c.calls for c in run.last.communication if c.kind == "all_reduce") == 4


def test_role_tasks_are_the_roles_the_plan_asks_for(mixtral: Plan) -> None:
    from flopscope.plan.sweeps import role_tasks

    # the sweep's tasks come from the same layouts (plan.experts.decoder_layouts): the 7
    # expert-parallel layouts of test_ep_sizes_divide_the_experts one role each, and the
    # layouts without experts sharded 12 roles
    tasks = role_tasks("hf:mixtral", gpus=4, hardware=PROFILES["h100-sxm"], config=CONFIG,
                       seq_len=64, global_batch=4, checkpointing=("none",))
    assert len(tasks) == len(set(tasks)) == mixtral.roles == 19
    assert sorted(t.ep for t in tasks if t.kind == "experts") == [2, 4, 4, 4, 4, 4, 4]


def test_serving_takes_the_expert_degree_from_tp() -> None:
    with pytest.raises(UsageError, match=r"does not take ep: .*\(ep = tp\); choose the degree"):
        flopscope.plan("hf:mixtral", gpus=4, hardware="h100", config=CONFIG, mode="serve", ep=2)
