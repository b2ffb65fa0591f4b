"""A usual module call in one Python frame (:mod:`flopscope.core.usual_calls`): a Counter alone
takes it; a Counter inside another (two listeners) takes the tracker's ``enter``/``leave``. Both
must say the same thing of every module: calls, costs, phase, opaque flags, failures caught
inside the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopscope import Counter


class Flaky(nn.Module):
    """Raises when its input holds a negative sum (the parent catches it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if float(y.sum()) < 1e9:
            raise ValueError("flaky")
        return y


class Alloc(nn.Module):
    """Allocation only: flagged opaque."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.flaky = Flaky()
        self.alloc = Alloc()
        self.blocks = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        try:
            x = self.flaky(x)
        except ValueError:
            x = x * 2  # the parent's own work, after a child raised
        x = x + self.alloc(x)
        return self.blocks(self.blocks(x))  # a module called twice


def _table(counter: Counter) -> tuple[object, ...]:
    report = counter.report
    rows = sorted((m.path, m.calls, m.self_cost.flops, m.self_cost.bytes_read)
                  for m in report.by_module().values())
    return tuple(rows), tuple(report.opaque), report.total().flops


@pytest.mark.filterwarnings("ignore:flopscope. these modules produced outputs")
def test_a_counter_alone_and_inside_another_agree() -> None:
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 4)
    with torch.no_grad(), Counter(model):  # a module class seen for the first time takes
        model(x)  # enter/leave (its kind is learnt there): the one-frame path from the second
    with torch.no_grad(), Counter(model) as alone:
        model(x)
    with torch.no_grad(), Counter(model) as outer, Counter(model) as inner:
        model(x)
    assert _table(alone) == _table(inner)
    rows, opaque, flops = _table(alone)
    calls = {path: c for path, c, _, _ in rows}
    assert calls["blocks"] == 2 and calls["blocks.0"] == 2  # called twice
    assert calls["flaky"] == 1 and calls["flaky.fc"] == 1
    assert opaque == ("alloc",)
    # the root's own work: x * 2 (2x4 = 8 FLOPs) and x + alloc(x) (8 FLOPs), after flaky raised
    root = next(r for r in rows if r[0] == "")
    assert root[2] == 16
    assert flops == _table(outer)[2]
