"""The edges a new user hits (issue 26), through the library: arguments that were wrong raise an
error that names the argument and what it takes, before anything is counted or built."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
import flopscope.estimate
from flopscope.errors import UsageError


class Recorded(nn.Module):
    """A linear layer that counts its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.proj(x)  # type: ignore[no-any-return]


# -- count_symbolic(symbolic=...) and count(observers=...): bare TypeErrors before -----------------
@pytest.mark.parametrize(("symbolic", "message"), [
    ({"batch": 0}, r"symbolic=\{'batch': 0\}: a place is \(argument index or keyword name, "
                   r"dimension\), e\.g\. \{'batch': \(0, 0\)\}"),
    ({"batch": "x"}, r"symbolic=\{'batch': 'x'\}: a place is"),
    (5, r"symbolic= must be a dict of symbol name -> place .* not int 5"),
])
def test_count_symbolic_wrong_spec(symbolic: object, message: str) -> None:
    model = Recorded()
    with pytest.raises(UsageError, match=message):
        flopscope.count_symbolic(model, torch.randn(2, 4), symbolic=symbolic)  # type: ignore[arg-type]
    assert model.forwards == 0


@pytest.mark.parametrize(("observers", "message"), [
    (5, r"observers= must be a list of objects with an on_call\(path, phase, op, call, cost\) "
        r"method, e\.g\. \[flopscope\.estimate\.CallLog\(\)\], not int 5"),
    ("log", r"observers= must be a list .* not str 'log'"),
    ([5], r"observers\[0\] is int 5, which has no on_call method"),
    (flopscope.estimate.CallLog(), r"observers= takes a list: observers=\[CallLog\(\.\.\.\)\]"),
])
def test_count_wrong_observers(observers: object, message: str) -> None:
    model = Recorded()
    with pytest.raises(UsageError, match=message):
        flopscope.count(model, torch.randn(2, 4), observers=observers)  # type: ignore[arg-type]
    assert model.forwards == 0


def test_count_right_observers() -> None:
    model, x = Recorded(), torch.randn(2, 4)
    log = flopscope.estimate.CallLog()
    report = flopscope.count(model, x, observers=[log], warn=False)
    # one addmm of (2 x 4) @ (4 x 3): 2 * 4 * 3 = 24 MACs, seen by the observer
    assert report.macs == 24
    assert "aten.addmm.default" in [rec.op for rec in log.records]
    assert flopscope.count(model, x, observers=(), warn=False).macs == 24
