"""Report comparison (the library behind ``flopscope diff``)."""

from __future__ import annotations

import math

import torch
from torch import nn

import flopscope
from flopscope.report.diff import diff_reports, relative_change


def _report(width: int, extra: bool = False) -> flopscope.Report:
    layers: list[nn.Module] = [nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4)]
    if extra:
        layers.append(nn.Linear(4, 4))
    torch.manual_seed(0)
    return flopscope.count(nn.Sequential(*layers), torch.randn(1, 8), warn=False)


def test_relative_change() -> None:
    assert relative_change(5, 5) == 0.0
    assert relative_change(100, 101) == 0.01
    assert math.isinf(relative_change(0, 1))


def test_identical() -> None:
    d = diff_reports(_report(16), _report(16))
    assert d.identical and d.beyond(0.0) == () and d.compared == 4


def test_changes_and_tolerance() -> None:
    a, b = _report(16), _report(17)
    d = diff_reports(a, b)
    paths = [c.path for c in d.changes]
    assert paths == ["", "0", "1", "2"]  # the ReLU runs on 16 vs 17 elements: 1 FLOP each
    root = d.changes[0]
    assert root.counts_a == (a.params, a.macs, a.flops)
    assert root.presence == "" and root.depth == 0
    assert {c.path for c in d.beyond(0.01)} == {"", "0", "1", "2"}  # 17/16: 6.25% more
    assert d.beyond(10.0) == ()


def test_module_only_in_one_report() -> None:
    d = diff_reports(_report(16), _report(16, extra=True))
    added = next(c for c in d.changes if c.path == "3")
    assert added.presence == "only in B" and added.a is None
    assert added.counts_a == (0, 0, 0) and math.isinf(added.relative)
