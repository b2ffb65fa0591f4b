"""Shared pytest configuration."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import flopscope


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def quiet() -> object:
    """Silence flopscope's own warnings inside a test that expects them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", flopscope.FlopscopeWarning)
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tier: a test marked ``slow`` runs only with ``FLOPSCOPE_SLOW=1`` (CI runs the
    default tier; README.md, "Tests")."""
    if os.environ.get("FLOPSCOPE_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow tier: set FLOPSCOPE_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files in tests/golden/ from the current output instead of "
        "comparing against them",
    )
