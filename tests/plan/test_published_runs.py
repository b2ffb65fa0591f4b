"""benchmarks/published_runs.py's logic, on each run's layout with a tiny model (its --dry mode):
what CI can run of the comparison with published training runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's benchmarks/

from benchmarks import published_runs as pr  # noqa: E402


def _run(run_id: str) -> dict[str, object]:
    (run,) = [r for r in pr.RUNS if r["id"] == run_id]
    return run


def test_every_run_cites_its_source_and_says_what_is_not_modelled() -> None:
    for run in pr.RUNS:
        source = run["source"]
        assert source["repo"] and source["file"] and len(source["commit"]) == 40
        assert run["published"] and run["gap"]
        assert run["gpus"] % (run["tp"] * run["pp"]) == 0
        assert run["global_batch"] % (run["gpus"] // (run["tp"] * run["pp"])) == 0
    assert all(n["why"] for n in pr.NOT_PLANNED)


def test_a_torchtitan_run_on_a_tiny_model() -> None:
    run = pr.shrink(_run("torchtitan-70b-fsdp32-tp8"))
    # the same degrees, two data-parallel ranks, at most 2 sequences per rank
    assert (run["gpus"], run["tp"], run["pp"], run["global_batch"], run["micro_batch"]) == (
        16, 8, 1, 4, 2)
    row = pr.compare(run)
    assert row["dp"] == 2 and row["precision"].startswith("bfloat16 compute, float32")
    # the published micro-batch only, with the published checkpointing
    # (sequence parallelism, as torchtitan runs it: SP in the label)
    assert [p["layout"] for p in row["planned"]] == ["TP8 PP1 DP2 SP mb2x1 ckpt"]
    shown = row["compared"]
    assert shown == row["planned"][0] and shown["fits_budget"]
    # the published tokens/s at flopscope's FLOPs per token, against the bf16 dense peak
    published = row["published"]
    assert published["mfu_at_flopscope_flops"] == pytest.approx(
        597.3 * row["flops_per_token"] / 989.5e12)
    assert row["ratios"]["tokens_per_s_per_gpu_predicted_over_published"] == pytest.approx(
        shown["tokens_per_s_per_gpu"] / 597.3)
    assert row["ratios"]["mfu_predicted_over_published"] == pytest.approx(
        shown["mfu"] / published["mfu_at_flopscope_flops"])


def test_a_megatron_run_without_a_published_micro_batch(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    assert pr.main(["--dry", "--only", "megatron-gpt-1.7b", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (row,) = data["runs"]
    assert data["dry"] and data["not_planned"] == pr.NOT_PLANNED
    # every micro-batch and both checkpointing choices; the fastest that fits compared
    assert {(p["micro_batch"], p["checkpointing"]) for p in row["planned"]} == {
        (1, "none"), (1, "block"), (2, "none"), (2, "block")}
    # Megatron's distributed optimizer: DDP with ZeRO-1 (Z1 in the label)
    assert row["data_parallel"] == "zero1"
    assert all(" DDP2 Z1 " in p["layout"] for p in row["planned"])
    fastest = min((p for p in row["planned"] if p["fits_budget"]), key=lambda p: p["step_s"])
    assert row["compared"] == fastest
    assert row["ratios"]["mfu_predicted_over_published"] == pytest.approx(fastest["mfu"] / 0.41)


def test_unknown_run_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        pr.main(["--dry", "--only", "gpt-5"])
    assert e.value.code == 2
    assert "--only: unknown run id(s) gpt-5" in capsys.readouterr().err
