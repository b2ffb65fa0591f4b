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


# -- get_hardware: an empty name, a profile file that does not exist ------------------------------
def test_get_hardware_empty_name() -> None:
    """``get_hardware('')`` said "unknown hardware ''"."""
    for empty in ("", "  "):
        with pytest.raises(UsageError, match=r"the hardware name is empty \('\s*'\): name one of "
                                             r"h100-sxm, .*, this-machine, or a JSON or TOML "
                                             r"file of profiles"):
            flopscope.estimate.get_hardware(empty)


def test_get_hardware_missing_file(tmp_path: object) -> None:
    """``get_hardware('missing.json')`` said "unknown hardware 'missing.json'"."""
    with pytest.raises(UsageError, match=r"hardware profile file 'missing.json' does not exist; "
                                         r"give an existing file or a shipped profile: h100-sxm"):
        flopscope.estimate.get_hardware("missing.json")
    with pytest.raises(UsageError, match=r"hardware profile file 'gone.toml' does not exist"):
        flopscope.estimate.get_hardware("gone.toml:h100")
    folder = f"{tmp_path}/profiles.json"
    import os

    os.mkdir(folder)
    with pytest.raises(UsageError, match=r"does not exist \(it is a directory\)"):
        flopscope.estimate.get_hardware(folder)
    # the shipped profiles and a real file are still found
    assert flopscope.estimate.get_hardware(" H100-SXM ").name == \
        flopscope.estimate.get_hardware("h100-sxm").name


def test_get_hardware_wrong_kind() -> None:
    with pytest.raises(UsageError, match=r"hardware must be a profile name, a file or a "
                                         r"Hardware, not int"):
        flopscope.estimate.get_hardware(5)  # type: ignore[arg-type]


# -- a RuleSet naming an operator that does not exist ---------------------------------------------
def _zero(call: flopscope.OpCall) -> flopscope.Cost:
    return flopscope.Cost()


def test_a_ruleset_naming_no_operator_is_refused() -> None:
    """``count(rules={...})`` refused "aten::mmm"; a RuleSet built from it, or ``with_rules``,
    took it silently and the count went on without the rule."""
    from flopscope.errors import RuleError

    model = Recorded()
    with pytest.raises(RuleError, match=r"'aten::mmm', which does not exist \(did you mean "
                                        r"aten::mm"):
        flopscope.RuleSet({"aten::mmm": _zero})
    with pytest.raises(RuleError, match=r"'aten::mmm', which does not exist"):
        flopscope.default_rules().with_rules({"aten::mmm": _zero})
    with pytest.raises(RuleError, match=r"'atne::mm', which does not exist \(did you mean "
                                        r"aten::mm"):
        flopscope.RuleSet({"atne::mm": _zero})
    with pytest.raises(RuleError, match=r"aten::mm has no overload 'fast' \(it has: "):
        flopscope.RuleSet({"aten::mm.fast": _zero})
    assert model.forwards == 0
    # the default table's own names (some exist only with their library) and every spelling of
    # an operator that exists are accepted
    rules = flopscope.default_rules()
    assert len(flopscope.RuleSet({k: rules[k] for k in rules})) == len(rules)
    accepted = flopscope.RuleSet({"aten::mm": _zero, "aten.addmm.default": _zero,
                                  torch.ops.aten.bmm: _zero, "higher_order::flex_attention": _zero})
    assert len(accepted) == 4
    # addmm of (2 x 4) @ (4 x 3) costed 0 by the user's rule
    assert flopscope.count(model, torch.randn(2, 4), rules=rules.with_rules(accepted),
                           warn=False).macs == 0
