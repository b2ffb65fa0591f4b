"""The edges a new user hits (issue 26): options that were silently ignored or misread are
one-line usage errors that name the flag and what to do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.cli.conftest import TINY, Result

import flopscope

Cli = Callable[..., Result]


def _one_line(r: Result, *words: str) -> None:
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1, r.err
    for w in words:
        assert w in r.err, r.err


def test_silently_ignored_options_are_usage_errors(cli: Cli) -> None:
    _one_line(cli("count", f"{TINY}:tiny", "--hardware", ""), "--hardware", "empty profile")
    _one_line(cli("count", f"{TINY}:tiny", "--tf32"), "--tf32", "--hardware")
    _one_line(cli("generate", "hf:llama", "--prompt-len", "4", "--new-tokens", "2",
                  "--hardware", " "), "--hardware", "empty profile")


def test_values_that_start_with_a_dash_reach_their_own_check(cli: Cli) -> None:
    """argparse said "expected one argument" for these."""
    _one_line(cli("count", f"{TINY}:tiny", "--input", "-1x3x8x8"), "--input",
              "every dimension must be at least 1")
    _one_line(cli("diff", "a.json", "b.json", "--tolerance", "-5%"), "--tolerance",
              "0 or more")


def test_tolerance_says_its_unit(cli: Cli, tmp_path: Path) -> None:
    """``--tolerance 1`` read as 100% let a doubled cost pass with exit 0; a bare number of 1 or
    more is now ambiguous, and a percentage or a fraction below 1 is what it says."""
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    assert cli("count", f"{TINY}:tiny", "--input", "2x3x8x8", "--format", "json",
               "--output", a).code == 0
    assert cli("count", f"{TINY}:tiny", "--input", "4x3x8x8", "--format", "json",
               "--output", b).code == 0  # twice the batch: twice every cost
    _one_line(cli("diff", a, b, "--tolerance", "1"), "ambiguous tolerance", "1%", "100%")
    assert cli("diff", a, b, "--tolerance", "50%").code == 1  # +100% is beyond 50%
    assert cli("diff", a, b, "--tolerance", "0.5").code == 1
    assert cli("diff", a, b, "--tolerance", "100%").code == 0


def test_a_rule_for_an_operator_that_does_not_exist_is_refused() -> None:
    model, x = torch.nn.Linear(4, 2), torch.randn(1, 4)
    with pytest.raises(flopscope.RuleError, match=r"'aten::mmm', which does not exist.*aten::mm"):
        flopscope.count(model, x, rules={"aten::mmm": lambda call: 0})
    with pytest.raises(flopscope.RuleError, match="has no overload 'nope'"):
        flopscope.count(model, x, rules={"aten::mm.nope": lambda call: 0})
    # an operator that exists, any spelling: accepted
    flopscope.count(model, x, rules={torch.ops.aten.mm: lambda call: 0}, warn=False)


def test_a_rules_file_naming_a_missing_operator_is_refused(cli: Cli, tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text("RULES = {'aten::addmmm': lambda call: 0}\n")
    _one_line(cli("count", f"{TINY}:tiny", "--rules", str(rules)), "aten::addmmm",
              "does not exist", "aten::addmm")


def test_peak_memory_refuses_training_options_without_train() -> None:
    from flopscope.estimate import peak_memory

    model, x = torch.nn.Linear(4, 2), torch.randn(1, 4)
    with pytest.raises(flopscope.UsageError, match=r"optimizer=.*train=True"):
        peak_memory(model, x, optimizer="adamw")
    with pytest.raises(flopscope.UsageError, match=r"loss_fn=.*train=True"):
        peak_memory(model, x, loss_fn=lambda out: out.sum())
    # 4 x 2 weights + 2 biases, float32: 40 B of parameters, live at any peak
    assert peak_memory(model, x).memory.at_peak["parameters"] == 40
    assert json.dumps(peak_memory(model, x, train=True).memory.to_dict())
