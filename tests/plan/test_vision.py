"""flopscope plan for a torchvision model: data parallel only, DDP or FSDP2 over the batch
(issue 31)."""

from __future__ import annotations

import pytest
from torch import nn

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan import Plan
from flopscope.plan.build import build_model
from flopscope.plan.space import Choice
from flopscope.plan.vision import VisionRoles, blocks, data_parallel_layouts

PARAMS = 11_689_512  # torchvision's ResNet-18
ARGS = dict(gpus=4, hardware="h100", global_batch=8)


@pytest.fixture(scope="module")
def resnet() -> Plan:
    plan = flopscope.plan("torchvision:resnet18", **ARGS)
    assert isinstance(plan, Plan)
    return plan


def test_layouts_are_data_parallel_only() -> None:
    # 8 samples on 4 GPUs: 2 per rank, micro-batch 1 (x 2) or 2 (x 1), FSDP2 or DDP
    got = data_parallel_layouts(4, 8)
    assert [(c.tp, c.pp, c.dp, c.micro_batch, c.microbatches, c.data_parallel) for c in got] == [
        (1, 1, 4, 1, 2, "fsdp"), (1, 1, 4, 1, 2, "ddp"), (1, 1, 4, 2, 1, "fsdp"),
        (1, 1, 4, 2, 1, "ddp")]
    assert got[1].label == "TP1 PP1 DDP4 mb1x2" and got[0].label == "TP1 PP1 DP4 mb1x2"
    assert data_parallel_layouts(4, 6) == []


def test_blocks_are_the_residual_blocks() -> None:
    import torchvision

    model = torchvision.models.resnet18()
    # layer1..layer4 are Sequentials of two BasicBlocks each
    assert [type(b).__name__ for b in blocks(model)] == ["BasicBlock"] * 8
    assert blocks(nn.Linear(2, 2)) == []


def test_plan_ranks_ddp_and_fsdp(resnet: Plan) -> None:
    assert resnet.unit == "samples" and resnet.seq_len == 1
    assert len(resnet.ranked) + len(resnet.dropped) == 4 and resnet.roles == 4
    hw = PROFILES["h100-sxm"]
    for c in resnet.ranked:
        # samples per second per GPU and MFU over the 4 devices' dense bf16 peak
        assert c.tokens_per_s_per_gpu == pytest.approx(8 / c.time.total / 4)
        assert c.mfu == pytest.approx(resnet.model_flops / (c.time.total * 4 * hw.matrix["bf16"]))
        assert c.time.tp_comm == 0 and c.time.bubble == 0
    by = {c.choice.label: c for c in resnet.ranked}
    ddp, fsdp = by["TP1 PP1 DDP4 mb2x1"], by["TP1 PP1 DP4 mb2x1"]
    # DDP keeps whole bfloat16 parameters and AdamW's two moments of them
    assert ddp.at_peak["parameters"] == PARAMS * 2
    assert ddp.at_peak["optimizer_state"] == PARAMS * 2 * 2
    # FSDP2 keeps a quarter (each parameter's dimension 0 padded to a multiple of 4)
    assert PARAMS * 2 // 4 <= fsdp.at_peak["parameters"] < PARAMS * 2 // 4 + 64 * 1024
    assert fsdp.memory_bytes < ddp.memory_bytes


def test_ddp_all_reduces_every_gradient_once() -> None:
    roles = VisionRoles(build_model("torchvision:resnet18", None, "bfloat16", None),
                        PROFILES["h100-sxm"], "test")
    (run,) = roles.runs(Choice(1, 1, 4, 2, 1, "none", "ddp"))
    reduces = [c for c in run.report.communication if c.kind == "all_reduce"]
    assert reduces and all(c.phase.value == "backward" and c.group_size == 4 for c in reduces)
    # the ring all-reduce moves 2 (n - 1) / n of the gradients: 1.5 x 11,689,512 x 2 bytes
    assert sum(c.payload_bytes for c in reduces) == PARAMS * 2
    assert sum(c.bus_bytes for c in reduces) == PARAMS * 2 * 3 // 2
    assert not [c for c in run.report.communication if c.kind == "all_gather"]
    (fsdp,) = roles.runs(Choice(1, 1, 4, 2, 1, "none", "fsdp"))
    assert {c.kind for c in fsdp.report.communication} >= {"all_gather", "reduce_scatter"}


def test_cli_plans_a_vision_model(capsys: pytest.CaptureFixture[str], resnet: Plan) -> None:
    code = main(["plan", "torchvision:resnet18", "--gpus", "4", "--hardware", "h100",
                 "--global-batch", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "global batch 8 samples" in out and "samples/s/GPU" in out
    assert f"Best: {resnet.ranked[0].choice.label}," in out
    assert "4 layouts: 4 fit" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--serve"], "--serve plans a transformers decoder's generation"),
    (["--checkpointing", "block"], "is planned data parallel only (DDP or FSDP2 over the batch)"),
    (["--global-batch", "6"], "a global batch of 6 does not split over 4 devices"),
    (["--tp", "2"], "torchvision:resnet18 is planned data parallel only: --tp 2 does not apply"),
])
def test_cli_refuses_what_does_not_apply(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         message: str) -> None:
    code = main(["plan", "torchvision:resnet18", "--gpus", "4", "--hardware", "h100", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_api_refuses_checkpointing() -> None:
    with pytest.raises(UsageError,
                       match=r"activation checkpointing \(per block or selective\) is built"):
        flopscope.plan("torchvision:resnet18", **ARGS, checkpointing=("none", "block"))
