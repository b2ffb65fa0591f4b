"""Selective activation checkpointing in a plan (flopscope.plan.checkpointing): inside each
decoder block the matrix products, attention and tensor-parallel collectives are kept, the rest
is run again in backward; its cost and memory sit between no checkpointing and every block."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from flopscope.cli import main
from flopscope.cost import Phase
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model
from flopscope.plan.checkpointing import enable, saved_class
from flopscope.plan.roles import RoleKey, RoleRun, Roles, clear_cache

# hidden 256, 8 heads, 4 KV heads, MLP 512, 4 layers, vocabulary 512 (tests/plan/test_plan.py)
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)


@pytest.mark.parametrize(("op", "cls"), [
    (torch.ops.aten.mm.default, "matmul"),
    (torch.ops.aten.addmm.default, "matmul"),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, "attention"),
    (torch.ops._c10d_functional.all_reduce.default, "collective"),
    ("_c10d_functional.reduce_scatter_tensor.default", "collective"),
    # sequence parallelism's all-gathers are run again (their outputs are tp times the input)
    (torch.ops._c10d_functional.all_gather_into_tensor.default, None),
    ("aten.bmm.default", "matmul"),
    (torch.ops.aten.mul.Tensor, None),
    (torch.ops.aten.silu.default, None),
    (torch.ops.aten._fused_rms_norm.default if hasattr(torch.ops.aten, "_fused_rms_norm")
     else torch.ops.aten.rsqrt.default, None),
    # FSDP2's own collectives are run again with the block, as FSDP2 does
    (torch.ops.c10d._allgather_base_.default, None),
    ("aten.mm_backward_is_not_an_op.default", None),
])
def test_saved_classes(op: Any, cls: str | None) -> None:
    assert saved_class(op) == cls


def test_unknown_choice_and_a_model_without_the_switch() -> None:
    with pytest.raises(UsageError, match="unknown checkpointing 'full'; use one of none, block, "
                                         "selective, selective-half"):
        enable(torch.nn.Linear(2, 2), "full", "mine")
    with pytest.raises(UsageError, match="mine: the model has no activation checkpointing "
                                         "switch"):
        enable(torch.nn.Linear(2, 2), "selective", "mine")


def _flops(run: RoleRun, phase: Phase, keep: Any = lambda op: True) -> int:
    return sum(r.cost.flops for r in run.report.records if r.phase is phase and keep(r.op))


@pytest.fixture(scope="module")
def runs() -> dict[tuple[int, str], RoleRun]:
    clear_cache()
    roles = Roles(build_model("hf:llama", 256, "bfloat16", CONFIG), PROFILES["h100-sxm"],
                  ("test_checkpointing",))
    # TP 2 (its all-reduces are DTensor's functional collectives) and FSDP2 over 2 ranks
    return {(tp, how): roles.get(RoleKey(tp, 1, 0, 3 - tp, 1, 1, how, loss="cross_entropy"))
            for tp in (1, 2) for how in ("none", "block", "selective", "selective-half")}


@pytest.mark.parametrize("tp", [1, 2])
def test_selective_recomputes_all_but_the_saved_classes(
        runs: dict[tuple[int, str], RoleRun], tp: int) -> None:
    none, block, sel = (runs[tp, h] for h in ("none", "block", "selective"))
    # the forward is the same work whichever way the blocks are checkpointed, and the backward
    # the same under both checkpointings (under either, each block's input gradient is summed
    # once more in backward than without: an add of 256 x 256 per layer at down_proj)
    assert _flops(sel, Phase.FORWARD) == _flops(block, Phase.FORWARD) == _flops(
        none, Phase.FORWARD) > 0
    assert _flops(sel, Phase.BACKWARD) == _flops(block, Phase.BACKWARD) == _flops(
        none, Phase.BACKWARD) + 256 * 256 * 4
    # every block recomputes its whole forward; selective only what is not saved: its
    # recomputed FLOPs are exactly block checkpointing's recomputed FLOPs of the operators
    # outside the saved classes (two separate simulations)
    recomputed = {r.op for r in sel.report.records if r.phase is Phase.RECOMPUTE}
    assert recomputed and not any(saved_class(op) for op in recomputed)
    assert any(saved_class(r.op) == "matmul" for r in block.report.records
               if r.phase is Phase.RECOMPUTE)
    assert _flops(none, Phase.RECOMPUTE) == 0
    assert 0 < _flops(sel, Phase.RECOMPUTE) == _flops(
        block, Phase.RECOMPUTE, lambda op: saved_class(op) is None) < _flops(block,
                                                                            Phase.RECOMPUTE)
    # no collective is run again under selective: TP's all-reduces are kept, where every block
    # checkpointed runs one of the two per layer again (4 layers); FSDP2 gathers the layer's
    # parameters for backward (and its recomputation) in backward's pre-hook either way
    def again(run: RoleRun) -> dict[str, int]:
        calls: dict[str, int] = {}
        for c in run.report.communication:
            if c.phase is Phase.RECOMPUTE:
                calls[c.kind] = calls.get(c.kind, 0) + c.calls
        return calls
    assert again(sel) == {}
    assert again(block) == ({} if tp == 1 else {"all_reduce": 4})
    # memory: selective keeps more than every block and less than no checkpointing
    assert block.memory.peak_bytes < sel.memory.peak_bytes < none.memory.peak_bytes


@pytest.mark.parametrize("tp", [1, 2])
def test_selective_half_recomputes_every_other_product(
        runs: dict[tuple[int, str], RoleRun], tp: int) -> None:
    block, sel, half = (runs[tp, h] for h in ("block", "selective", "selective-half"))
    # each block's products in order: q, k, v, o (attention), gate, up, down (MLP); the even
    # ones (k, o, up) run again: on 256 tokens, k 2 x 256 x 256 x 128 = 16,777,216 FLOPs, o
    # 2 x 256 x 256 x 256 = 33,554,432, up 2 x 256 x 256 x 512 = 67,108,864; 117,440,512 per
    # layer, x 4 layers, split over the tensor-parallel ranks
    again = {r.module.rsplit(".", 1)[-1] for r in half.report.records
             if r.phase is Phase.RECOMPUTE and saved_class(r.op) == "matmul"}
    assert again == {"k_proj", "o_proj", "up_proj"}
    assert _flops(half, Phase.RECOMPUTE) == _flops(sel, Phase.RECOMPUTE) + 117_440_512 * 4 // tp
    assert _flops(half, Phase.BACKWARD) == _flops(block, Phase.BACKWARD)
    assert block.memory.peak_bytes < half.memory.peak_bytes < sel.memory.peak_bytes


def test_cli_plans_selective(capsys: pytest.CaptureFixture[str]) -> None:
    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    code = main(["plan", "hf:llama", "--gpus", "1", "--hardware", "h100", "--seq-len", "256",
                 "--checkpointing", "none,selective", *flags, "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    labels = [r["layout"] for r in data["ranked"]]
    assert sorted(labels) == ["TP1 PP1 DP1 mb1x1", "TP1 PP1 DP1 mb1x1 sac"]
    (sac,) = [r for r in data["ranked"] if r["layout"].endswith("sac")]
    assert sac["checkpoint"] == "selective" and sac["time_s"]["recompute"] > 0
    assert any(n.startswith("sac: selective activation checkpointing") for n in data["notes"])


def test_cli_refuses_an_unknown_choice(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "hf:llama", "--gpus", "1", "--checkpointing", "none,full"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert ("--checkpointing 'none,full': give a comma-separated list of none, block, "
            "selective, selective-half" in err)
