"""Helpers for the command-line tests: running ``main`` and comparing with golden files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from flopscope.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent.parent / "golden"
TINY = str(FIXTURES / "tiny_models.py")


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``cli("count", SOURCE, ...)`` runs ``main`` and returns exit code, stdout and stderr."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(name, text)`` compares ``text`` with tests/golden/NAME; ``--update-golden``
    rewrites the file instead."""
    update = bool(request.config.getoption("--update-golden"))

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.exists(), f"no golden file {path}; run pytest with --update-golden to create it"
        assert text == path.read_text(encoding="utf-8"), (
            f"output differs from {path}; if the change is intended, run pytest --update-golden"
        )

    return check
