"""The estimate tests that run the command line share the CLI tests' ``cli`` fixture, with the
CLI's fixture models (``tiny_models``) importable."""

from __future__ import annotations

import pytest
from tests.cli.conftest import FIXTURES, cli

__all__ = ["cli"]  # the command-line fixture of tests/cli/conftest.py, shared


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
