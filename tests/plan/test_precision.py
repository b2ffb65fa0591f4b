"""Mixed precision in a training plan: float32 parameters, bfloat16 compute, gradients reduced in
float32 (FSDP2's MixedPrecisionPolicy on the simulated rank, as torchtitan trains)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.distributed import Layout, simulate
from flopscope.errors import UsageError
from flopscope.plan.build import build_model
from flopscope.plan.planner import Plan
from flopscope.plan.roles import clear_cache

# the model of tests/plan/test_plan.py: hidden 256, 8 heads, 4 KV heads, MLP 512, 4 layers,
# vocab 512: 2,623,744 parameters; a decoder layer 590,336 (q, o 256x256; k, v 128x256; gate,
# up, down 512x256; two norms of 256); the root's own (embedding and head 512 x 256 each, the
# final norm 256) 262,400
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
PARAMS, LAYER, ROOT = 2_623_744, 590_336, 262_400
ARGS: dict[str, Any] = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=256, global_batch=2,
                            checkpointing=("none",), tp=1, pp=1)


@pytest.fixture(scope="module")
def mixed() -> Plan:
    clear_cache()
    made = flopscope.plan("hf:llama", **ARGS, param_dtype="float32")
    assert isinstance(made, Plan)
    return made


def test_mixed_precision_memory_to_the_byte(mixed: Plan) -> None:
    (c,) = mixed.ranked  # TP1 PP1 DP2 mb1x1
    # the rank's float32 shards: 2,623,744 parameters / 2 ranks x 4 bytes = 5,247,488
    assert c.at_peak["parameters"] == PARAMS // 2 * 4 == 5_247_488
    # AdamW's two moments per shard element, in float32: 2 x 5,247,488 = 10,494,976
    assert c.at_peak["optimizer_state"] == 2 * PARAMS // 2 * 4 == 10_494_976
    # the peak is in layer 2's backward: layer 3's gradients are reduce-scattered and kept as
    # its float32 shard, 590,336 / 2 x 4 = 1,180,672 bytes
    assert c.peak_where == "model.layers.2.mlp (backward)"
    assert c.at_peak["gradients"] == LAYER // 2 * 4 == 1_180_672
    assert c.memory_bytes == sum(c.at_peak.values())
    # the same layout in bfloat16 throughout: half the parameter bytes, half the moments
    plain = flopscope.plan("hf:llama", **ARGS)
    assert isinstance(plain, Plan)
    (b,) = plain.ranked
    assert b.at_peak["parameters"] == PARAMS // 2 * 2
    assert b.at_peak["optimizer_state"] == 2 * PARAMS // 2 * 2
    # the compute runs in bfloat16 both ways: the same model FLOPs, MFU against the bf16 peak
    assert mixed.model_flops == plain.model_flops
    assert "MFU against the dense bf16 peak" in mixed.notes[0]


def test_all_gathers_in_the_compute_dtype_reduce_scatters_in_the_reduce_dtype() -> None:
    build = build_model("hf:llama", 256, "float32", CONFIG)

    def payloads(reduce: str) -> dict[tuple[str, str, str], int]:
        layout = Layout(2, fsdp=2, mixed_precision=("bfloat16", reduce))
        report = simulate(lambda: build(1, "none"), layout, backward=True, logical=False)
        return {(c.module, c.phase.value, c.kind): c.payload_bytes
                for c in report.communication}

    got = payloads("float32")
    # a layer's 590,336 parameters gathered as bfloat16 (2 bytes each, the whole layer per
    # rank), its gradients reduce-scattered in float32 (4 bytes)
    assert got[("model.layers.1", "forward", "all_gather")] == LAYER * 2
    assert got[("model.layers.1", "backward", "reduce_scatter")] == LAYER * 4
    assert got[("", "forward", "all_gather")] == ROOT * 2
    assert got[("", "backward", "reduce_scatter")] == ROOT * 4
    # reduced in bfloat16 instead: half
    assert payloads("bfloat16")[("model.layers.1", "backward", "reduce_scatter")] == LAYER * 2


def test_one_rank_still_casts(mixed: Plan) -> None:
    """A data-parallel group of one gets fully_shard too (FSDP2 casts without a collective): a
    pipeline stage keeps float32 parameters and computes in bfloat16."""
    one = flopscope.plan("hf:llama", **{**ARGS, "gpus": 1, "global_batch": 1},
                         param_dtype="float32")
    assert isinstance(one, Plan)
    (c,) = one.ranked
    assert c.at_peak["parameters"] == PARAMS * 4
    assert c.at_peak["optimizer_state"] == 2 * PARAMS * 4
    assert c.time.fsdp_comm == 0 and c.time.fsdp_hidden == 0
    plain, wide = (flopscope.plan("hf:llama", **{**ARGS, "gpus": 1, "global_batch": 1},
                                  dtype=d) for d in ("bfloat16", "float32"))
    assert isinstance(plain, Plan) and isinstance(wide, Plan)
    # the forward runs in bfloat16 plus FSDP2's casts of the float32 parameters: at the bound
    # slower than bfloat16 throughout, faster than float32 throughout (without the cast it
    # would be that); predicted (h100's reference calibration) the casts' calls take host
    # time too, which on this small model is most of the step
    bounds = [p.bound_step.forward for p in (plain.ranked[0], c, wide.ranked[0])]
    assert bounds == sorted(bounds) and len(set(bounds)) == 3
    assert plain.ranked[0].time.forward < c.time.forward


def test_cli_mixed_precision(capsys: pytest.CaptureFixture[str], mixed: Plan) -> None:
    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    argv = ["plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
            "--global-batch", "2", "--tp", "1", "--pp", "1", "--checkpointing", "none",
            "--param-dtype", "fp32", *flags]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("bfloat16 compute, float32 parameters and optimizer state, gradients reduced in "
            "float32") in out.splitlines()[0]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["dtype"], data["param_dtype"], data["reduce_dtype"]) == (
        "bfloat16", "float32", "float32")
    assert data["ranked"][0]["memory_bytes"] == mixed.ranked[0].memory_bytes


@pytest.mark.parametrize(("argv", "message"), [
    (["hf:llama", "--gpus", "2", "--serve", "--param-dtype", "float32"],
     "--param-dtype applies to a training plan"),
    (["hf:llama", "--gpus", "2", "--param-dtype", "int8"], "--param-dtype"),
])
def test_cli_refuses(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_refused_where_not_built() -> None:
    with pytest.raises(UsageError, match="mixed precision .* is planned for transformers "
                                         "decoders only"):
        flopscope.plan("torchvision:resnet18", gpus=2, param_dtype="float32")
    with pytest.raises(UsageError, match="serving keeps the weights in --dtype"):
        flopscope.plan("hf:llama", gpus=2, mode="serve", param_dtype="float32")
    with pytest.raises(UsageError, match="not built with expert parallelism"):
        Layout(2, ep=2, mixed_precision=("bfloat16", "float32"))
    with pytest.raises(UsageError, match="'int8' is not a floating-point dtype"):
        Layout(2, mixed_precision=("int8", "float32"))
