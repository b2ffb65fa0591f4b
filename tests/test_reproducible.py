"""A fresh install is reproducible: CI runs README's test command exactly, and the constraints
file pins every dependency the package, its extras and its tests can install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    """The normalised project name of a requirement string (PEP 503)."""
    name = re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_ci_runs_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    commands = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
    assert all("-c constraints.txt" in c for c in commands)


def test_constraints_pin_every_dependency() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[_name(name)] = version
    assert sorted(wanted - set(pins)) == []
    # the pair that must belong together, as README says
    assert pins["torch"].startswith("2.") and pins["torchvision"]
