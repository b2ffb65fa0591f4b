"""Helpers for the per-rule tests: count a snippet, look up one operator's cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import flopscope
from flopscope import Cost, Report


def count(fn: Callable[[], Any], *, backward: bool = False) -> Report:
    """Count ``fn()`` (and ``fn().sum().backward()`` when ``backward``)."""
    with flopscope.Counter(warn=False) as counter:
        out = fn()
        if backward:
            out.sum().backward()
    return counter.report


def op(report: Report, name: str, phase: str | None = None) -> Cost:
    """Total cost of one operator overload (e.g. ``"aten.mm.default"``) in a report."""
    stats = report.by_op(phase)
    assert name in stats, f"{name} did not run; ran: {sorted(stats)}"
    return stats[name].cost


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)
