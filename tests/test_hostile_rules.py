"""Every value a rule returns is checked where it is returned: non-negative integers only
(issue 13). A bad value is a RuleError naming the rule, the operator or module, and the value."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope import Cost, OpCall, RuleError, count


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


X = torch.randn(2, 4)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (-5, r"returned a negative cost: -5"),
        (2.0, r"returned 2\.0 \(float\)"),
        (float("nan"), r"returned nan \(float\)"),
        (True, r"returned True \(bool\)"),
        ("10", r"returned '10' \(str\)"),
        (None, r"returned None \(NoneType\)"),
        (torch.tensor(1.5), r"returned tensor\(1\.5000\) \(Tensor\)"),
    ],
)
def test_op_rule_returning_a_bad_number(value: object, shown: str) -> None:
    def bad_rule(call: OpCall) -> Any:
        return value

    with pytest.raises(
        RuleError, match=rf"rule .*bad_rule for operator aten\.addmm\.default in module 'fc' {shown}"
    ):
        count(Net(), X, rules={"aten::addmm": bad_rule})


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"macs": -5, "flops": -10}, r"ValueError: Cost\.macs must not be negative, got -5"),
        ({"macs": float("nan")}, r"TypeError: Cost\.macs must be an int, not nan \(float\)"),
        ({"macs": "10"}, r"TypeError: Cost\.macs must be an int, not '10' \(str\)"),
        ({"flops": 3.0}, r"TypeError: Cost\.flops must be an int, not 3\.0 \(float\)"),
        ({"bytes_read": True}, r"TypeError: Cost\.bytes_read must be an int, not True \(bool\)"),
        ({"bytes_written": -1}, r"Cost\.bytes_written must not be negative, got -1"),
    ],
)
def test_op_rule_building_a_bad_cost(fields: dict[str, Any], shown: str) -> None:
    def bad_cost(call: OpCall) -> Cost:
        return Cost(**fields)

    with pytest.raises(
        RuleError, match=rf"rule .*bad_cost for operator aten\.addmm\.default failed in module 'fc'.*{shown}"
    ):
        count(Net(), X, rules={"aten::addmm": bad_cost})


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2.0, r"returned 2\.0 \(float\)"),
        (float("nan"), r"returned nan \(float\)"),
        (-3, r"returned a negative cost: -3"),
        (torch.tensor(-3), r"returned a negative cost: -3"),
    ],
)
def test_module_rule_returning_a_bad_number(value: object, shown: str) -> None:
    with pytest.raises(RuleError, match=rf"module rule .* for module 'fc' \(Linear\) {shown}"):
        count(Net(), X, rules={nn.Linear: lambda m, i, o: value})


def test_module_rule_building_a_nan_cost() -> None:
    def nan_rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> Cost:
        return Cost(macs=float("nan"))  # type: ignore[arg-type]

    with pytest.raises(
        RuleError,
        match=r"module rule .*nan_rule raised for module 'fc' \(Linear\): TypeError: Cost\.macs "
        r"must be an int, not nan \(float\)",
    ):
        count(Net(), X, rules={nn.Linear: nan_rule})


def test_cost_refuses_bad_fields_itself() -> None:
    with pytest.raises(TypeError, match=r"Cost\.macs must be an int, not 1\.5 \(float\)"):
        Cost(macs=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Cost\.flops must not be negative, got -1"):
        Cost(flops=-1)
    assert Cost(1, 2, 3, 4) + Cost(1, 1, 1, 1) == Cost(2, 3, 4, 5)
    assert Cost.from_macs(3, 1) == Cost(3, 7)


def test_good_values_still_work() -> None:
    # an int is MACs: 2 rows x 4 x 4 = 32 -> flops 2 * 32; an integer tensor too
    r = count(Net(), X, rules={"aten::addmm": lambda call: 32})
    assert (r.macs, r.flops) == (32, 64)
    r = count(Net(), X, rules={nn.Linear: lambda m, i, o: torch.tensor(32)})
    assert (r.macs, r.flops) == (32, 64)
    assert isinstance(flopscope.count(Net(), X).macs, int)
