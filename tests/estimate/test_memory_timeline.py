"""The memory timeline (``MemoryProfile.timeline``, the ``memory`` section's ``"timeline"``): live
bytes by category at each operator call, thinned to at most ``TIMELINE_POINTS`` calls with the
peak kept exact."""

from __future__ import annotations

import json

import pytest
import torch
from tests.cli.conftest import TINY
from torch import nn

from flopscope.cli import main
from flopscope.estimate import peak_memory
from flopscope.estimate.memory import TIMELINE_POINTS


def _highest(tl: dict) -> tuple[int, dict[str, int]]:  # type: ignore[type-arg]
    totals = [sum(v[i] for v in tl["categories"].values()) for i in range(len(tl["index"]))]
    k = totals.index(max(totals))
    return totals[k], {c: v[k] for c, v in tl["categories"].items() if v[k]}


def test_timeline_of_a_training_step_holds_the_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["count", f"{TINY}:tiny", "--memory", "--backward", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    memory, tl = data["memory"], data["memory"]["timeline"]
    # one point per operator call the count saw (forward, backward and AdamW's step)
    assert tl["calls"] == sum(rec["calls"] for rec in data["records"]) == len(tl["index"])
    assert tl["index"] == list(range(tl["calls"]))
    assert list(dict.fromkeys(tl["phase"])) == ["forward", "backward", "optimizer"]
    assert _highest(tl) == (memory["peak_bytes"], memory["at_peak"])


def test_a_long_run_is_thinned_and_keeps_its_peak() -> None:
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(150)])  # 150 addmm + views per pass
    _, memory = peak_memory(model, torch.ones(4, 8), train=True)
    tl = memory.timeline
    assert tl["calls"] > TIMELINE_POINTS
    assert len(tl["index"]) <= TIMELINE_POINTS
    assert _highest(tl) == (memory.peak_bytes, memory.at_peak)


def test_no_timeline_without_a_call() -> None:
    _, memory = peak_memory(nn.Identity(), torch.ones(2))
    assert memory.timeline == {} and "timeline" not in memory.to_dict()
