"""flopscope.plan: the layouts of a training step, their memory and time (issue 31)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES, Hardware
from flopscope.plan import Choice, enumerate_layouts, parse_bytes
from flopscope.plan.planner import Plan
from flopscope.plan.roles import clear_cache
from flopscope.plan.space import ModelShape
from flopscope.render.units import human_bytes

# hidden 256, 8 heads, 4 KV heads, intermediate 512, 4 layers, vocab 512: 2,623,744 parameters
# (per layer q, o 256x256, k, v 128x256, gate, up, down 512x256, two norms 256: 590,336; x 4
# layers; embedding and head 512 x 256 each; the final norm 256)
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
PARAMS = 2_623_744
ARGS = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=256, global_batch=2)


def _config_flags() -> list[str]:
    return [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]


@pytest.fixture(scope="module")
def two_gpus() -> Plan:
    clear_cache()
    return flopscope.plan("hf:llama", **ARGS)


def _by_label(plan: Plan) -> dict[str, Any]:
    return {c.choice.label: c for c in (*plan.ranked, *plan.dropped)}


def test_enumeration_is_the_divisor_triples() -> None:
    # 8 GPUs, 4 heads, 2 KV heads, 2 layers, global batch 8:
    # tp divides 8 and the heads (4), KV heads (2) and MLP (512): tp in {1, 2}
    # tp 1: pp 1 (dp 8, 1 sequence each: mb 1 x 1); pp 2 (dp 4, 2 each: mb 1 x 2; mb 2 x 1 has
    #       fewer microbatches than stages); pp 4, 8 > 2 layers
    # tp 2: pp 1 (dp 4, 2 each: mb 1 x 2, 2 x 1); pp 2 (dp 2, 4 each: mb 1 x 4, 2 x 2; 4 x 1 no)
    shape = ModelShape(layers=2, heads=4, kv_heads=2, intermediate=512)
    got = enumerate_layouts(8, shape, 8, ("none",))
    assert [(c.tp, c.pp, c.dp, c.micro_batch, c.microbatches) for c in got] == [
        (1, 1, 8, 1, 1), (1, 2, 4, 1, 2),
        (2, 1, 4, 1, 2), (2, 1, 4, 2, 1), (2, 2, 2, 1, 4), (2, 2, 2, 2, 2)]
    assert all(c.gpus == 8 for c in got)
    both = enumerate_layouts(8, shape, 8)
    assert len(both) == 12 and {c.checkpoint for c in both} == {"none", "block"}


def test_enumeration_refuses_unknown_checkpointing() -> None:
    with pytest.raises(UsageError, match="unknown checkpointing 'full'; use one of none, block, "
                                         "selective, selective-half"):
        enumerate_layouts(2, ModelShape(2, 4, 2, 512), 2, ("full",))


def test_each_role_is_simulated_once_and_reused(two_gpus: Plan) -> None:
    # 2 GPUs, global batch 2 (per checkpointing choice): TP1 PP1 DP2 mb1x1 (1 role: both ranks
    # run the same shapes), TP1 PP2 DP1 mb1x2 (2 roles: the stages), TP2 PP1 DP1 mb1x2 and
    # mb2x1 (1 role each): 4 layouts, 5 roles, x 2 checkpointing choices = 8 layouts of 16 ranks,
    # 10 roles, 10 simulations
    assert len(two_gpus.ranked) + len(two_gpus.dropped) == 8
    assert two_gpus.roles == 10 and two_gpus.simulations == 10
    # global batch 4 shares the roles of TP1 PP1 mb 1 and TP2's mb 1 and 2 with the plan
    # above; new per choice: TP1 PP1 DP2 mb2x1, TP1 PP2 mb2x2 (2 stages), TP1 PP2 mb1x4 (2
    # stages, simulated over the step's 4 microbatches, pp + 2), TP2 mb4x1: 6, x 2 = 12
    # simulations of 18 roles
    again = flopscope.plan("hf:llama", **{**ARGS, "global_batch": 4})
    assert again.roles == 18 and again.simulations == 12


def test_memory_has_the_parameters_and_adamw_moments() -> None:
    one = flopscope.plan("hf:llama", **{**ARGS, "gpus": 1, "global_batch": 1})
    (c,) = [c for c in one.ranked if c.choice.checkpoint == "none"]
    assert c.at_peak["parameters"] == PARAMS * 2  # bfloat16
    assert c.at_peak["optimizer_state"] == PARAMS * 2 * 2  # exp_avg and exp_avg_sq
    assert c.memory_bytes == sum(c.at_peak.values())


def test_checkpointing_lowers_activations_and_adds_recompute(two_gpus: Plan) -> None:
    layouts = _by_label(two_gpus)
    for label in ("TP2 PP1 DP1 mb2x1", "TP1 PP1 DP2 mb1x1"):
        plain, ckpt = layouts[label], layouts[label + " ckpt"]
        assert ckpt.at_peak["activations"] < plain.at_peak["activations"]
        assert plain.time.recompute == 0 < ckpt.time.recompute
        # the same forward work: its bound the same (its prediction, host-bound on this model,
        # differs by host time: the checkpointed forward saves nothing for backward, 12 fewer
        # aten.detach calls at TP 1 x FSDP 2)
        assert ckpt.bound_step.forward == pytest.approx(plain.bound_step.forward)


def test_a_layout_that_cannot_fit_is_dropped_with_its_reason(two_gpus: Plan) -> None:
    sizes = sorted(c.memory_bytes for c in two_gpus.ranked)
    budget = sizes[len(sizes) // 2]
    tight = flopscope.plan("hf:llama", **ARGS, memory_budget=budget)
    assert tight.simulations == 0  # every role cached
    assert tight.dropped and tight.ranked
    assert all(c.memory_bytes <= budget for c in tight.ranked)
    for c in tight.dropped:
        assert not c.fits and c.memory_bytes > budget
        category, size = max(c.at_peak.items(), key=lambda kv: kv[1])
        assert c.reason == (
            f"peak {human_bytes(c.memory_bytes)} is {human_bytes(c.memory_bytes - budget)} over "
            f"the {human_bytes(budget)} budget, at {c.peak_where}; largest: "
            f"{category.replace('_', ' ')} {human_bytes(size)}")
        assert "(" in c.peak_where  # module (phase)


def test_ranked_by_time_and_the_pareto_front(two_gpus: Plan) -> None:
    times = [c.time.total for c in two_gpus.ranked]
    assert times == sorted(times)
    front = two_gpus.pareto
    assert front[0] is two_gpus.ranked[0]
    for a, b in zip(front, front[1:], strict=False):
        assert a.time.total <= b.time.total and b.memory_bytes < a.memory_bytes
    for c in two_gpus.ranked:  # nothing off the front beats a front layout on both
        assert any(f.time.total <= c.time.total and f.memory_bytes <= c.memory_bytes
                   for f in front)


def test_step_time_parts_add_up_and_mfu(two_gpus: Plan) -> None:
    hw = PROFILES["h100-sxm"]
    for c in two_gpus.ranked:
        t = c.time
        assert t.total == pytest.approx(sum(t.parts().values()))
        # MFU = model FLOPs per step / (step x devices x dense bf16 peak)
        assert c.mfu == pytest.approx(two_gpus.model_flops / (t.total * 2 * hw.matrix["bf16"]))
        assert c.tokens_per_s_per_gpu == pytest.approx(2 * 256 / t.total / 2)
    # the all-reduces and sends are exposed at the bound (no host time); this tiny model's
    # predicted steps on the H100 are host-bound, where they run in the device's wait for the
    # host (estimate.overlap.host_overlap): exposed there only beyond it
    tp = _by_label(two_gpus)["TP2 PP1 DP1 mb2x1"]
    assert tp.bound_step.tp_comm > 0 and tp.time.fsdp_comm == 0
    assert 0.0 <= tp.time.tp_comm <= tp.bound_step.tp_comm
    pp = _by_label(two_gpus)["TP1 PP2 DP1 mb1x2"]
    assert pp.time.bubble > 0 and pp.bound_step.p2p > 0
    assert 0.0 <= pp.time.p2p <= pp.bound_step.p2p


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str], two_gpus: Plan) -> None:
    code = main(["plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
                 "--global-batch", "2", *_config_flags()])
    out = capsys.readouterr().out
    assert code == 0
    assert "8 layouts: 8 fit, 0 dropped; 10 rank roles" in out
    assert "layout" in out and "tok/s/GPU" in out and "MFU" in out
    assert f"Best: {two_gpus.ranked[0].choice.label}," in out
    assert "Pareto front" in out and "where its time goes" in out
    # why the best wins: against the next fastest, by how much and where
    second = two_gpus.ranked[1]
    assert (f"  {second.choice.label}: " in out.split("Why it wins")[1])


def test_compare_names_where_the_other_spends_more(two_gpus: Plan) -> None:
    from flopscope.plan.timing import compare

    best, tp = _by_label(two_gpus)["TP1 PP1 DP2 mb1x1"], _by_label(two_gpus)["TP2 PP1 DP1 mb2x1"]
    for a, b in ((best.time, tp.time), (best.bound_step, tp.bound_step)):
        diffs = dict(compare(a, b))
        assert diffs.get("tensor-parallel collectives", 0.0) == pytest.approx(b.tp_comm
                                                                              - a.tp_comm)
        assert sum(diffs.values()) == pytest.approx(b.total - a.total)
    # at the bound the all-reduces are exposed: a difference named
    assert "tensor-parallel collectives" in dict(compare(best.bound_step, tp.bound_step))


def test_cli_json(capsys: pytest.CaptureFixture[str], two_gpus: Plan) -> None:
    code = main(["plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
                 "--global-batch", "2", "--memory-budget", "1GiB", "--format", "json",
                 *_config_flags()])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["memory_budget"] == 2**30 and data["gpus"] == 2
    assert [r["layout"] for r in data["ranked"]] == [c.choice.label for c in two_gpus.ranked]
    assert data["pareto"] == [c.choice.label for c in two_gpus.pareto]
    assert set(data["ranked"][0]["time_s"]) >= {"forward", "backward", "bubble", "total"}


@pytest.mark.parametrize(("argv", "message"), [
    (["mypackage.models:build", "--gpus", "2"],
     "plan takes a transformers decoder (hf:llama, hf:ORG/NAME, hf:path/to/config.json) or a vision model, "
     "torchvision:NAME or timm:NAME"),
    (["tv:resnet50", "--gpus", "2"], "torchvision:NAME or timm:NAME (data parallel only), not "
                                     "'tv:resnet50'"),
    (["hf:llama", "--gpus", "2", "--hardware", "l4"], "has no link bandwidths"),
    (["hf:llama", "--gpus", "2", "--memory-budget", "lots"], "is not a memory size"),
    (["hf:llama", "--gpus", "2", "--checkpointing", "all"], "--checkpointing 'all'"),
])
def test_cli_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                          message: str) -> None:
    code = main(["plan", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("80 GB") == 80 * 10**9
    assert parse_bytes("1.5TiB") == int(1.5 * 2**40)
    assert parse_bytes("1024") == 1024
    with pytest.raises(UsageError, match="'80 parsecs' is not a memory size"):
        parse_bytes("80 parsecs")


def test_shipped_gpus_have_link_figures() -> None:
    h100 = PROFILES["h100-sxm"]
    # NVLink 4: 900 GB/s total per GPU, 450 each way; InfiniBand NDR 400 Gb/s = 50 GB/s
    assert h100.intra_node_bandwidth == 450e9 and h100.inter_node_bandwidth == 50e9
    assert h100.intra_node_latency > 0 and h100.inter_node_latency > 0
    assert PROFILES["a100-80gb"].inter_node_bandwidth == 25e9  # HDR 200 Gb/s
    assert PROFILES["l4"].intra_node_bandwidth is None
    back = Hardware.from_dict(h100.to_dict())
    assert back.intra_node_bandwidth == pytest.approx(450e9)
    assert back.inter_node_latency == pytest.approx(h100.inter_node_latency)
    old = Hardware.from_dict({"name": "x", "memory_bandwidth_gb_s": 100,
                              "vector_tflops": {"fp32": 1}})  # a profile file of before
    assert old.intra_node_bandwidth is None and old.inter_node_latency == 0
    with pytest.raises(UsageError, match="intra node bandwidth must be positive"):
        Hardware.from_dict({"name": "x", "memory_bandwidth_gb_s": 100,
                            "vector_tflops": {"fp32": 1}, "intra_node_gb_s": 0})


def test_choice_label() -> None:
    assert Choice(2, 1, 4, 2, 3, "block").label == "TP2 PP1 DP4 mb2x3 ckpt"


def test_cli_refuses_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "hf:llama", "--gpus", "2", "--batch", "4"])
    assert code == 2
    assert "--batch does not apply to a training plan" in capsys.readouterr().err


def test_middle_stages_of_equal_layers_share_a_role() -> None:
    from flopscope.plan.layout_roles import roles_of

    # 8 layers on 8 stages: one each; the first (embedding) and last (head) stages are their own
    # roles, the six middle stages run the same shapes: stage 1 stands for them
    stages = [k.stage for k in roles_of(Choice(1, 8, 1, 1, 8, "none"), 8)]
    assert stages == [0, 1, 1, 1, 1, 1, 1, 7]
    # 6 layers on 4 stages: 2, 2, 1, 1: stage 2 has one layer fewer than stage 1, so a role of
    # its own
    assert [k.stage for k in roles_of(Choice(1, 4, 1, 1, 4, "none"), 6)] == [0, 1, 2, 3]
    assert [k.stage for k in roles_of(Choice(2, 1, 4, 1, 1, "block"), 6)] == [0]


def test_a_shared_middle_stage_does_the_same_work() -> None:
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles

    # 4 layers on 4 stages, 4 microbatches: stages 1 and 2 share stage 1's role; simulated
    # apart, stage 2 computes and sends exactly what stage 1 does, and keeps fewer microbatches
    # in flight (1F1B: 4 - 2 = 2 against 3), so its peak is no higher
    roles = Roles(build_model("hf:llama", 256, "bfloat16", CONFIG), PROFILES["h100-sxm"], "t")
    one, two = (roles.get(RoleKey(1, 4, s, 1, 1, 4, False)) for s in (1, 2))
    assert one.report.flops == two.report.flops and one.report.macs == two.report.macs
    assert sorted((c.kind, c.phase, c.calls, c.bus_bytes) for c in one.report.communication) == \
        sorted((c.kind, c.phase, c.calls, c.bus_bytes) for c in two.report.communication)
    assert two.estimate.total.time_s == pytest.approx(one.estimate.total.time_s)
    assert two.memory.peak_bytes < one.memory.peak_bytes


def test_no_layout_is_a_usage_error() -> None:
    # 3 GPUs: tp 3 does not divide 8 heads; pp 1 needs dp 3 to divide the batch of 1, pp 3 needs
    # 3 microbatches of a batch of 1
    with pytest.raises(UsageError, match="no layout of 3 devices divides this model"):
        flopscope.plan("hf:llama", **{**ARGS, "gpus": 3, "global_batch": 1})


def test_one_gpu_memory_agrees_with_peak_memory_of_a_training_step() -> None:
    """On one GPU the plan's figure is flopscope.estimate.peak_memory's training step (the real
    AdamW step, shape-only, from the same loss: the causal LM's cross-entropy) but for one known
    difference: AdamW's step counters (one float32 scalar per parameter tensor: 4 layers x 9 +
    embedding, norm, head = 39, x 4 bytes = 156), which the plan leaves out. Both release the
    model's output (the logits, 1 x 256 x 512 bfloat16 = 262,144 bytes) once the loss is
    computed, as trainers do; the simulated rank held it through backward until 2026-11-30."""
    from flopscope import sources
    from flopscope.estimate import peak_memory
    from flopscope.execution.training import causal_lm_loss

    one = flopscope.plan("hf:llama", **{**ARGS, "gpus": 1, "global_batch": 1})
    (c,) = [c for c in one.ranked if c.choice.checkpoint == "none"]
    loaded = sources.load_model("hf:llama", batch=1, seq_len=256, config=CONFIG,
                                shape_only=True, dtype="bfloat16")
    loaded.model.train()
    ids = loaded.inputs.kwargs["input_ids"]
    _, mem = peak_memory(loaded.model, *loaded.inputs.args, train=True, optimizer="adamw",
                         shape_only=True,
                         loss_fn=lambda out: causal_lm_loss(out, ids.to(out.logits.device)),
                         **loaded.inputs.kwargs)
    # the peak: the cross-entropy's backward (the root's: the float32 log-softmax and its
    # gradients of 256 x 512 x 4 bytes each live)
    assert (mem.peak_module, mem.peak_phase) == ("", "backward")
    assert c.peak_where == "(root) (backward)"
    assert c.at_peak["activations"] == mem.at_peak["activations"]
    assert c.at_peak["optimizer_state"] == mem.at_peak["optimizer_state"] - 156
    assert c.memory_bytes == mem.peak_bytes - 156


def test_simulate_prepare_is_refused_with_experts() -> None:
    from flopscope.distributed import Layout, simulate

    def build() -> Any:
        raise AssertionError("not reached: refused before the model is built")

    with pytest.raises(UsageError, match=r"simulate\(prepare=...\) is not built for expert"):
        simulate(build, Layout(2, ep=2), prepare=lambda m, a, k: None)


def test_flopscope_plan_is_the_callable_package_whatever_the_import_order() -> None:
    """``flopscope.plan`` is the package, callable as the function: loading the lazy exports
    first (any ``flopscope.X`` name) used to replace it with the bare function, so
    ``flopscope.plan.planner`` failed after ``flopscope.count`` had been touched."""
    import subprocess
    import sys

    code = ("import flopscope; flopscope.count; import flopscope.plan.planner as p; "
            "assert callable(flopscope.plan); assert flopscope.plan.planner is p; "
            "from flopscope.plan import plan; assert flopscope.plan.plan is plan")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def test_seq_len_defaults_to_the_sources_token_ids() -> None:
    # an hf: source passes its token ids as the input_ids keyword (128 tokens by default); the
    # plan read only a positional argument and planned 1 token per sequence without --seq-len
    plan = flopscope.plan("hf:llama", gpus=1, hardware="h100", config=CONFIG, global_batch=1,
                          checkpointing=("none",))
    assert isinstance(plan, Plan)
    assert plan.seq_len == 128 and plan.to_dict()["seq_len"] == 128


def test_a_transformers_model_that_is_not_llama_style_is_planned_data_parallel() -> None:
    # BERT's config has layers, heads and an MLP size, but its layers are not Llama-style
    # (bert.encoder.layer, no q/k/v/o projections): it was taken for a decoder and failed
    # inside the first tensor-parallel role's simulation; now data parallel, saying why (its
    # layers found by their structure, the reason names the projections they lack)
    bert = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=128)
    plan = flopscope.plan("hf:bert", gpus=2, hardware="h100", config=bert, seq_len=32)
    assert isinstance(plan, Plan)
    assert {c.choice.label for c in (*plan.ranked, *plan.dropped)} == {
        "TP1 PP1 DP2 mb1x1", "TP1 PP1 DDP2 mb1x1"}
    assert any("Llama-style decoders: BertLayer has no self_attn.q_proj" in n
               for n in plan.notes)
    with pytest.raises(UsageError, match="data parallel only: --tp 2 .*BertLayer has no"):
        flopscope.plan("hf:bert", gpus=2, hardware="h100", config=bert, seq_len=32, tp=2)
