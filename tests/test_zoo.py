"""The zoo sweep (the library behind ``flopscope zoo``): rows as they finish, failures as rows."""

from __future__ import annotations

import pytest

import flopscope.zoo
from flopscope.zoo import TIMM_ZOO, ZooRow, count_model, sweep, zoo_models


def test_zoo_models() -> None:
    assert zoo_models("timm", ["a,b", "c"]) == ["a", "b", "c"]
    assert zoo_models("timm") == list(TIMM_ZOO)


def test_a_failing_model_is_a_row() -> None:
    pytest.importorskip("torchvision")
    row = count_model("torchvision", "not_a_model")
    assert row.error is not None and "SourceError" in row.error and row.macs == 0


def test_sweep_yields_each_row_as_it_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    def fake(library: str, name: str) -> ZooRow:
        events.append(f"count {name}")
        return ZooRow(name, 0.0, macs=1)

    monkeypatch.setattr(flopscope.zoo, "count_model", fake)
    for row in sweep("timm", ["a", "b"], on_start=lambda n: events.append(f"start {n}")):
        events.append(f"got {row.model}")
    assert events == ["start a", "count a", "got a", "start b", "count b", "got b"]
