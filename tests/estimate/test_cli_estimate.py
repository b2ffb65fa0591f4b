"""`flopscope count --hardware/--memory/--roofline-plot`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cli.conftest import Result

Cli = Callable[..., Result]


def test_json_has_estimate_and_memory(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--hardware", "h100-sxm", "--memory",
                    "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["estimate"]["hardware"]["name"] == "h100-sxm"
    assert data["estimate"]["kind"] == "roofline lower bound"
    assert data["estimate"]["total"]["flops"] == sum(
        rec["flops"] for rec in data["records"])
    assert data["memory"]["peak_bytes"] > 0 and data["memory"]["train"] is False


def test_table_has_estimate_columns_and_lines(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--hardware", "a100-80gb", "--memory", "--backward",
            "--optimizer", "sgd")
    assert r.code == 0, r.err
    assert "est. time" in r.out and "bound" in r.out and "bytes" in r.out
    assert "roofline on a100-80gb" in r.out and "lower bound" in r.out
    assert "peak memory" in r.out and "SGD.step()" in r.out


def test_unknown_hardware_is_a_usage_error(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--hardware", "h100-sx")
    assert r.code == 2
    assert "did you mean" in r.err or "h100-sxm" in r.err


def test_roofline_plot_needs_hardware(cli: Cli, tmp_path: Path) -> None:
    r = cli("count", "tiny_models:tiny", "--roofline-plot", str(tmp_path / "r.png"))
    assert r.code == 2 and "--roofline-plot needs --hardware" in r.err


def test_roofline_plot_written(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.svg"
    r = cli("count", "tiny_models:tiny", "--hardware", "h100-sxm", "--roofline-plot", str(out))
    assert r.code == 0, r.err
    assert out.read_text().startswith("<?xml")


@pytest.mark.parametrize("backward", [False, True])
def test_shape_only_memory_of_a_transformers_model(cli: Cli, backward: bool) -> None:
    """docs/memory.md's way to size a large language model: an hf: model built on meta, whose
    forward reads its position ids (so it runs on fake CPU tensors), shape-only, as a forward
    and as a training step; its parameters are reported as parameters. GPT-2 with one block of
    width 32: the block 12,704 (two norms 2 x 64, attention 32x96+96 and 32x32+32, MLP
    32x128+128 and 128x32+32) + 64 tokens x 32 = 2,048 (the output projection is tied to it)
    + 8 positions x 32 = 256 + the final norm 64 = 15,072 parameters x 4 bytes = 60,288."""
    pytest.importorskip("transformers")
    r = cli("count", "hf:gpt2", "--config", "n_layer=1", "--config", "n_embd=32",
            "--config", "n_head=2", "--config", "vocab_size=64", "--config", "n_positions=8",
            "--seq-len", "8", "--shape-only", "--memory", "--format", "json",
            *(["--backward"] if backward else []))
    assert r.code == 0, r.err
    memory = json.loads(r.out)["memory"]
    assert memory["at_peak"]["parameters"] == 60_288
    assert memory["at_peak"]["inputs"] == 64  # 8 int64 token ids
    assert "other" not in memory["at_peak"]
    assert memory["train"] is backward


def test_optimizer_without_a_training_step_is_a_usage_error(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--memory", "--optimizer", "sgd")
    assert r.code == 2
    assert "--optimizer sizes a training step's optimizer state: it needs --memory --backward" \
        in r.err
