"""The zoo sweep (the library behind ``flopscope zoo``): rows as they finish, failures as rows."""

from __future__ import annotations

import pytest

import flopscope.zoo
from flopscope.errors import SourceError
from flopscope.zoo import TIMM_ZOO, ZooRow, count_model, sweep, zoo_models


def test_zoo_models() -> None:
    pytest.importorskip("timm")
    assert zoo_models("timm", ["resnet18,resnet50", " levit_128"]) == [
        "resnet18", "resnet50", "levit_128"]
    assert zoo_models("timm") == list(TIMM_ZOO)


def test_zoo_models_refuses_a_misspelt_name() -> None:
    pytest.importorskip("timm")
    with pytest.raises(SourceError, match=r"unknown timm model 'resnet5O' \(did you mean"):
        zoo_models("timm", ["resnet18", "resnet5O"])


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


def test_sweep_over_sequence_lengths() -> None:
    pytest.importorskip("transformers")
    rows = list(sweep("hf", ["gpt2"], seq_lens=[16, 32]))
    assert [(r.model, r.seq_len) for r in rows] == [("gpt2", 16), ("gpt2", 32)]
    assert all(r.error is None for r in rows), rows
    short, long = rows
    assert long.params == short.params
    assert long.macs > 2 * short.macs - 1  # linear layers double, attention products quadruple


def test_zoo_models_all_and_defaults() -> None:
    assert zoo_models("hf") == list(flopscope.zoo.HF_ZOO)
    assert zoo_models("timm", ["all"]) != list(TIMM_ZOO) if _has("timm") else True


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
