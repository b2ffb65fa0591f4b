"""The planner's loss (a causal LM's cross-entropy, logits upcast to float32) and loss
parallelism (torchtitan's and Megatron-LM's tensor parallelism): the head column-wise over the
vocabulary, its logits left as vocabulary shards, the cross-entropy computed on the shards under
torch's ``loss_parallel()``."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.distributed import Layout, simulate
from flopscope.distributed.simulate import count_rank
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES, MemoryTracker
from flopscope.plan.build import build_model
from flopscope.plan.display import plan_text
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.planner import Plan
from flopscope.plan.roles import RoleKey, Roles, local_tensor
from flopscope.plan.space import Choice
from flopscope.report.report import Report

# hidden 256, 8 heads, 4 KV heads, MLP 512, 4 layers, vocab 512 (tests/plan/test_plan.py);
# one sequence of 256 tokens, bfloat16, tensor parallel over 2 ranks
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
TOKENS, HIDDEN, VOCAB = 256, 256, 512


def _rank(loss_parallel: bool) -> tuple[Report, list[tuple[str, str, str, int]], int]:
    """The TP 2 rank's report, each call's (module, phase, op, rise of the live bytes) and its
    parameter bytes."""
    build = build_model("hf:llama", TOKENS, "bfloat16", CONFIG)
    tracker, params = MemoryTracker(), []

    def prepare(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        params.extend(local_tensor(p) for p in model.parameters())
        tracker.register(params, "parameters")
        tracker.register([*args, *kwargs.values()], "inputs")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(lambda: build(1, "none"), Layout(2, tp=2, loss_parallel=loss_parallel),
                          backward=True, logical=False, loss="cross_entropy", prepare=prepare,
                          observers=[tracker], warn=False)
    tracker.profile()
    rises, before = [], 0
    for p in tracker.call_points():
        live = sum(p.live.values())
        rises.append((p.module, p.phase, p.op, live - before))
        before = live
    return report, rises, sum(t.untyped_storage().nbytes() for t in params)


def _rise(rises: list[tuple[str, str, str, int]], module: str, phase: str, op: str,
          nth: int = 0) -> int:
    return [r for m, ph, o, r in rises if (m, ph, o) == (module, phase, op)][nth]


def test_vocabulary_sharded_logits_and_their_gradient() -> None:
    whole, whole_rises, whole_params = _rank(False)
    shards, rises, params = _rank(True)
    for (report, at, vocab) in ((whole, whole_rises, VOCAB), (shards, rises, VOCAB // 2)):
        # the head's product: 2 x 256 tokens x 256 hidden x its vocabulary (512 whole, 256 a
        # shard) FLOPs: 67,108,864 / 33,554,432
        (mm,) = [r for r in report.records if (r.module, r.op, r.phase.value)
                 == ("lm_head", "aten.mm.default", "forward")]
        assert mm.cost.flops == 2 * TOKENS * HIDDEN * vocab
        # what the memory tracker sees come alive, to the byte: the bfloat16 logits (256 x
        # vocab x 2: 262,144 / 131,072) at the head's product, their float32 upcast (x 4:
        # 524,288 / 262,144) at the loss's _to_copy
        assert _rise(at, "lm_head", "forward", "aten.mm.default") == TOKENS * vocab * 2
        assert _rise(at, "", "forward", "aten._to_copy.default") == TOKENS * vocab * 4
        # the logits' gradient, cast back to bfloat16 (256 x vocab x 2), then the head's
        # weight gradient (vocab x 256 x 2: 262,144 / 131,072), its first backward product
        assert _rise(at, "", "backward", "aten._to_copy.default") == TOKENS * vocab * 2
        assert _rise(at, "lm_head", "backward", "aten.mm.default") == vocab * HIDDEN * 2
    # the head's weight is halved on each rank: 512 x 256 x 2 / 2 = 131,072 bytes fewer
    assert whole_params - params == VOCAB * HIDDEN * 2 // 2 == 131_072
    # the collectives loss parallelism adds over the tensor-parallel group ("tp"): in forward
    # three all-reduces of one float32 per token (the logits' maximum, the sum of their
    # exponentials, the target's logit: 3 x 256 x 4 = 3,072 bytes, bus = payload at n = 2);
    # in backward the head's input gradient, partial on each rank, all-reduced (256 x 256 x 2)
    assert {(c.module, c.phase.value, c.kind, c.group, c.calls, c.payload_bytes)
            for c in shards.communication if not c.module.startswith("model.layers")} == {
        ("", "forward", "all_reduce", "tp", 3, 3 * TOKENS * 4),
        ("lm_head", "backward", "all_reduce", "tp", 1, TOKENS * HIDDEN * 2)}
    assert all(c.module.startswith("model.layers") for c in whole.communication)
    # the cross-entropy's own calls on the whole logits: log-softmax and the NLL
    ops = {r.op for r in whole.records if r.module == ""}
    assert {"aten._log_softmax.default", "aten.nll_loss_forward.default"} <= ops


def test_plan_applies_it_by_default_where_there_is_tensor_parallelism() -> None:
    args: dict[str, Any] = dict(gpus=2, hardware="h100", config=CONFIG, seq_len=TOKENS,
                                global_batch=1, tp=2, checkpointing=("none",))
    on, off = (flopscope.plan("hf:llama", **args, **extra)
               for extra in ({}, {"loss_parallel": False}))
    assert isinstance(on, Plan) and isinstance(off, Plan)
    (a,), (b,) = on.ranked, off.ranked
    assert on.loss_parallel and not off.loss_parallel
    assert on.to_dict()["loss_parallel"] is True and on.to_dict()["loss"] == "cross_entropy"
    assert "loss parallelism on tensor-parallel layouts" in on.notes[1]
    assert "loss parallelism" not in off.notes[1]
    # the head's weight shard (131,072 bytes less) and AdamW's two moments of it
    assert b.at_peak["parameters"] - a.at_peak["parameters"] == 131_072
    assert b.at_peak["optimizer_state"] - a.at_peak["optimizer_state"] == 2 * 131_072
    assert a.memory_bytes < b.memory_bytes
    # each layout says what it had applied: the JSON's "applied", the table's "TP with"
    assert a.applied == ("loss",) and b.applied == ()
    assert on.to_dict()["ranked"][0]["applied"] == ["loss"]
    header, row = [line.split() for line in plan_text(on).splitlines()[3:6:2]]
    assert header[-2:] == ["TP", "with"] and row[-1] == "loss"
    assert "TP with" not in plan_text(off)
    # it applies to tensor parallelism, with pipeline stages on the last (the head's)
    assert [k.loss_parallel for k in roles_of(Choice(2, 1, 1, 1, 1, "none"), 4,
                                              loss_parallel=True)] == [True]
    assert [k.loss_parallel for k in roles_of(Choice(1, 1, 2, 1, 1, "none"), 4,
                                              loss_parallel=True)] == [False]
    assert [k.loss_parallel for k in roles_of(Choice(2, 2, 1, 1, 2, "none"), 4,
                                              loss_parallel=True)] == [False, True]
    assert [k.loss_parallel for k in roles_of(Choice(1, 2, 2, 1, 2, "none"), 4,
                                              loss_parallel=True)] == [False, False]


def test_a_pipelines_last_stage_runs_the_cross_entropy() -> None:
    build = build_model("hf:llama", 64, "bfloat16", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], ("loss test", 64))
    last = roles.get(RoleKey(1, 2, 1, 1, 1, 2, False, loss="cross_entropy"))
    ops = {(r.op, r.calls) for r in last.report.records if r.module == ""}
    # one cross-entropy per microbatch (2)
    assert ("aten.nll_loss_forward.default", 2) in ops


def test_a_pipelines_last_stage_shards_its_head() -> None:
    build = build_model("hf:llama", TOKENS, "bfloat16", CONFIG)
    roles = Roles(build, PROFILES["h100-sxm"], ("loss test", TOKENS))
    whole, shards = (roles.get(RoleKey(2, 2, 1, 1, 1, 2, "none", loss="cross_entropy",
                                       loss_parallel=lp)) for lp in (False, True))

    def head(run: Any) -> dict[str, tuple[int, int]]:
        return {op: (s.calls, s.cost.flops) for op, s in run.report.by_op(module="lm_head").items()
                if op == "aten.mm.default"}

    # the last stage of TP 2 x PP 2, two microbatches of one sequence: the head's products in
    # forward and backward (3 a microbatch: logits, input and weight gradients) of 256 tokens x
    # 256 x 512, 2 x 256 x 256 x 512 = 67,108,864 FLOPs each whole, half on vocabulary shards
    assert head(whole) == {"aten.mm.default": (6, 6 * 67_108_864)}
    assert head(shards) == {"aten.mm.default": (6, 6 * 67_108_864 // 2)}
    # half of the head's 512 x 256 bfloat16 weight (262,144 bytes) fewer parameters
    assert whole.parameter_bytes - shards.parameter_bytes == 131_072
    # the loss on the shards (torch's loss_parallel): three all-reduces of its per-token
    # reductions a microbatch, and the head's input gradient all-reduced in backward; whole,
    # the loss is local (the stage's only collectives its sends and receives)
    def comm(run: Any) -> set[tuple[str, str, int, str]]:
        return {(c.module, c.kind, c.calls, c.phase.value) for c in run.report.communication
                if "layers" not in c.module}

    assert comm(whole) == {("", "recv", 2, "forward"), ("", "send", 2, "backward")}
    assert comm(shards) == comm(whole) | {("", "all_reduce", 6, "forward"),
                                          ("lm_head", "all_reduce", 2, "backward")}
    assert shards.memory.peak_bytes < whole.memory.peak_bytes


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    base = ["plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
            "--global-batch", "1", "--tp", "2", "--checkpointing", "none", "--format", "json",
            *flags]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["loss_parallel"] is True
    assert main([*base, "--no-loss-parallel"]) == 0
    assert json.loads(capsys.readouterr().out)["loss_parallel"] is False
    assert main(["plan", "hf:llama", "--gpus", "2", "--serve", "--no-loss-parallel"]) == 2
    err = capsys.readouterr().err
    assert "--loss-parallel applies to a training plan" in err and "Traceback" not in err


def test_bad_use() -> None:
    with pytest.raises(UsageError, match="loss parallelism shards the logits over the "
                                         "tensor-parallel ranks: it needs --tp >= 2"):
        Layout(2, tp=1, loss_parallel=True)
    with pytest.raises(UsageError, match="not built with --ep"):
        Layout(4, tp=2, ep=4, loss_parallel=True)
    Layout(4, tp=2, pp=2, loss_parallel=True)  # a pipeline's last stage shards its head
    with pytest.raises(UsageError, match="unknown loss 'mse': use one of sum, cross_entropy"):
        count_rank(build_model("hf:llama", 8, "float32", CONFIG)(1, "none")[0], backward=True,
                   loss="mse")
