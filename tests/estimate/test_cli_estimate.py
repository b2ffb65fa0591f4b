"""`flopscope count --hardware/--memory/--roofline-plot`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cli.conftest import FIXTURES, Result

from flopscope.cli import main

Cli = Callable[..., Result]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


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
