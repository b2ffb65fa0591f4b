"""flopscope.plan's sweep / flopscope plan with several points, --jobs and --ray: rank roles
simulated in worker processes or as Ray tasks, plans streamed as they complete (issue 31)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

import flopscope
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.estimate import PROFILES
from flopscope.plan import Plan
from flopscope.plan.display import sweep_line
from flopscope.plan.roles import RoleKey, clear_cache
from flopscope.plan.sweeps import SweepRow, role_tasks, sweep
from flopscope.plan.workers import RoleTask, TaskFailure, results

CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
OPTIONS: dict[str, Any] = dict(hardware="h100", config=CONFIG, global_batch=2,
                               checkpointing=("none",))


def _summary(plan: Plan | Any) -> list[tuple[str, int, float]]:
    return [(c.choice.label, c.memory_bytes, c.time.total) for c in plan.ranked]


@pytest.fixture(scope="module")
def here() -> dict[int, Plan]:
    """The plans made in this process, one role after the other."""
    clear_cache()
    out = {}
    for gpus in (1, 2):
        made = flopscope.plan("hf:llama", gpus=gpus, seq_len=64, **OPTIONS)
        assert isinstance(made, Plan)
        out[gpus] = made
    clear_cache()
    return out


def test_role_tasks_are_the_roles_a_plan_asks_for(here: dict[int, Plan]) -> None:
    # 2 GPUs, batch 2, no checkpointing: TP1 PP1 DP2 mb1 (1 role), TP1 PP2 mb1x2 (2 stages),
    # TP2 mb1x2 and mb2x1 (1 each): 5, as the plan counted
    tasks = role_tasks("hf:llama", gpus=2, hardware=PROFILES["h100-sxm"], seq_len=64,
                       config=CONFIG, global_batch=2, checkpointing=("none",))
    assert len(tasks) == len(set(tasks)) == here[2].roles == 5
    assert {t.kind for t in tasks} == {"train"}
    assert sorted((t.key.tp, t.key.pp, t.key.stage, t.key.micro_batch)
                  for t in tasks if t.key is not None) == [
        (1, 1, 0, 1), (1, 2, 0, 1), (1, 2, 1, 1), (2, 1, 0, 1), (2, 1, 0, 2)]


def test_role_tasks_of_every_data_parallel_kind() -> None:
    # with DDP, ZeRO-1 and ZeRO-2 searched the one layout with data parallelism (TP1 PP1 DP2)
    # adds two roles, the replica (ZeRO-1 shares DDP's) and FSDP2 keeping its gathered
    # parameters: 7 tasks where FSDP2 alone gave 5
    every = role_tasks("hf:llama", gpus=2, hardware=PROFILES["h100-sxm"], seq_len=64,
                       config=CONFIG, global_batch=2, checkpointing=("none",),
                       data_parallel="search")
    ddp = role_tasks("hf:llama", gpus=2, hardware=PROFILES["h100-sxm"], seq_len=64,
                     config=CONFIG, global_batch=2, checkpointing=("none",), data_parallel="ddp")
    replicas = [t.key for t in every if t.key is not None and t.key.replicate]
    kept = [t.key for t in every if t.key is not None and t.key.keep_gathered]
    assert len(every) == 7 and len(replicas) == len(kept) == 1
    assert (replicas[0].tp, replicas[0].pp, replicas[0].dp) == (1, 1, 2)
    assert set(ddp) < set(every)


def test_worker_processes_give_the_same_plans(here: dict[int, Plan]) -> None:
    seen: list[tuple[int, int]] = []
    rows = list(sweep(["hf:llama"], gpus=[1, 2], seq_lens=[64], jobs=2,
                      on_task=lambda task, done, total: seen.append((done, total)),
                      **OPTIONS))
    # 1 GPU: mb1x2 and mb2x1 (2 roles); 2 GPUs: 5; none shared
    assert seen[-1] == (7, 7) and len(seen) == 7
    assert sorted(r.gpus for r in rows) == [1, 2]
    for row in rows:
        assert row.error is None and isinstance(row.plan, Plan)
        # a role a worker gave no result for says why (it was once None, cause unknown)
        assert row.worker_errors == ()
        assert row.plan.simulations == 0  # every role came from a worker
        assert _summary(row.plan) == _summary(here[row.gpus])


def test_ray_tasks_give_the_same_plans(here: dict[int, Plan]) -> None:
    ray = pytest.importorskip("ray")
    clear_cache()
    for attempt in range(3):  # Ray gives its raylet 30 s to start: too little at load 10+
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception as e:  # noqa: BLE001  (Ray raises a bare Exception)
            ray.shutdown()
            if attempt == 2:
                pytest.skip(f"a local Ray cluster did not start here: {e}")
    try:
        rows = list(sweep(["hf:llama"], gpus=[2], seq_lens=[64], ray="local", **OPTIONS))
    finally:
        ray.shutdown()
    (row,) = rows
    assert isinstance(row.plan, Plan) and row.plan.simulations == 0
    assert _summary(row.plan) == _summary(here[2])


def test_ray_missing_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    task = RoleTask("train", "hf:llama", 64, "bfloat16", (), PROFILES["h100-sxm"])
    with pytest.raises(UsageError, match=r"--ray needs Ray: pip install 'flopscope\[ray\]'"):
        list(results([task], ray="local"))


def test_a_failing_task_says_why_here_and_from_a_worker_process() -> None:
    # a source that does not load: run_task raises in the worker; the failure comes back
    # (pickled from the spawned worker) with the role, the exception's type and message
    bad = [RoleTask("train", f"hf:no-such-model-{i}", 64, "bfloat16", (),
                    PROFILES["h100-sxm"], RoleKey(1, 1, 0, 1, 1, 1, "none")) for i in (1, 2)]
    for jobs in (1, 2):
        got = dict(results(bad, jobs=jobs))
        assert set(got) == set(bad)
        for task, failure in got.items():
            assert isinstance(failure, TaskFailure)
            assert failure.task == task.label and failure.error == "SourceError"
            assert f"'{task.source.removeprefix('hf:')}'" in failure.message and failure.where
            assert str(failure).startswith(f"{task.label}: SourceError: ")


def test_a_row_names_its_failed_roles_in_the_table() -> None:
    failure = TaskFailure("hf:llama TP1 PP1 stage 0 DP2 mb1", "MemoryError", "out of\nmemory",
                          "x.py:3 in f")
    row = SweepRow("hf:llama", 2, 64, None, "boom", (str(failure),))
    assert row.to_dict()["worker_errors"] == [
        "hf:llama TP1 PP1 stage 0 DP2 mb1: MemoryError: out of memory (at x.py:3 in f)"]
    assert sweep_line(row).splitlines()[1] == (
        "    worker failed, simulated here: hf:llama TP1 PP1 stage 0 DP2 mb1: MemoryError: "
        "out of memory (at x.py:3 in f)")


def test_a_failing_point_is_a_row_with_its_error() -> None:
    # 3 GPUs divide neither the 8 heads nor a batch of 2
    from flopscope.plan import sweep as exported

    assert exported is sweep  # the package's name for it
    rows = list(sweep(["hf:llama"], gpus=[3], seq_lens=[64], **OPTIONS))
    assert rows == [SweepRow("hf:llama", 3, 64, None, rows[0].error)]
    assert rows[0].error is not None and "no layout of 3 devices" in rows[0].error


@pytest.fixture
def cached(here: dict[int, Plan]) -> None:
    """The roles of `here` in this process's cache (the CLI test plans in this process)."""
    for gpus in (1, 2):
        flopscope.plan("hf:llama", gpus=gpus, seq_len=64, **OPTIONS)


def test_cli_sweep_table_and_json(capsys: pytest.CaptureFixture[str], cached: None,
                                  here: dict[int, Plan]) -> None:
    argv = ["plan", "hf:llama", "--gpus", "1,2,3", "--seq-len", "64", "--hardware", "h100",
            "--global-batch", "2", "--checkpointing", "none",
            *[a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    # the first line says what the times are: the shipped profile's reference prediction
    assert out.pop(0).startswith("step, MFU: predictions from a reference calibration (")
    assert out[0].split() == ["model", "GPUs", "seq", "fit", "best", "layout", "step", "MFU",
                              "MFU", "(bound)", "tok/s/GPU", "peak/GPU"]
    best = here[2].ranked[0]
    # the shipped profile's reference calibration: the step predicted, the bound's MFU beside
    assert best.time.compute == "prediction" and best.bound_time is not None
    assert out[3].split()[10:12] == [f"{best.mfu:.1%}", f"{best.mfu_bound:.1%}"]  # after the step (value, unit)
    layouts = len(here[2].ranked) + len(here[2].dropped)  # 4: the 5 roles' layouts
    assert out[3].split()[:8] == ["hf:llama", "2", "64", f"{len(here[2].ranked)}/{layouts}",
                                  *best.choice.label.split()]
    assert "error: no layout of 3 devices" in out[4]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(d["gpus"], d["error"] is None) for d in data] == [(1, True), (2, True), (3, False)]
    assert data[1]["plan"]["ranked"][0]["layout"] == best.choice.label


def test_serve_tasks_take_the_sources_prompt_without_seq_len() -> None:
    # an hf: source passes its token ids as the input_ids keyword, 128 tokens by default
    # (sources.DEFAULT_SEQ_LEN); the tasks read only a positional argument and asked for
    # prompts of 0 tokens, which failed inside the model
    tasks = role_tasks("hf:llama", gpus=1, hardware=PROFILES["h100-sxm"], mode="serve",
                       config=CONFIG, batches=[1], max_new_tokens=8)
    assert {t.serve for t in tasks} == {(1, 1, 128, 8), (1, 2, 128, 8)}


def test_serve_tasks_include_a_pipelines_micro_batches() -> None:
    # 2 GPUs: TP1 PP1 DP2, TP1 PP2 DP1, TP2 PP1 DP1 at batches 1, 2 (the largest batch's
    # slope) and 6; the PP2 layout's micro-batches of 6 and 2 sequences are 3 and 1
    tasks = role_tasks("hf:llama", gpus=2, hardware=PROFILES["h100-sxm"], mode="serve",
                       config=CONFIG, seq_len=16, batches=[6], max_new_tokens=4)
    assert sorted({t.serve[:2] for t in tasks}) == [(1, 1), (1, 2), (1, 3), (1, 6), (2, 1),
                                                    (2, 2), (2, 6)]
