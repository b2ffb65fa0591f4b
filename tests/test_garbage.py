"""A count leaves no reference cycles behind: what it made is freed when the last reference goes.

A cycle (the Counter's tracker holding a bound method of the Counter was one) leaves every count's
Counter, tracker, ledger and records to Python's cyclic collector; surviving the young
generations' collections during the count, they pile up in the oldest generation until a full
collection of the whole process runs (150-250 ms with torch and torchvision imported, about every
150 counts of mobilenet_v3_large). A cycle through the model's output keeps its autograd graph
alive as long.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import flopscope


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)  # buffers: the copy on write of a real count
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@contextmanager
def _cycles() -> Iterator[list[object]]:
    """The objects found unreachable (in reference cycles) by one collection after the block."""
    found: list[object] = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def _ours(objects: list[object]) -> list[str]:
    """The names of the flopscope objects and tensors among ``objects``."""
    return sorted({type(o).__qualname__ for o in objects
                   if type(o).__module__.startswith("flopscope") or isinstance(o, torch.Tensor)})


def _block(model: nn.Module, x: torch.Tensor) -> None:
    with flopscope.Counter(model, warn=False) as counter:
        model(x)
    assert counter.report.macs > 0


RUNS: dict[str, Callable[[nn.Module, torch.Tensor], object]] = {
    "count": lambda m, x: flopscope.count(m, x, warn=False),
    "count backward": lambda m, x: flopscope.count(m, x, backward=True, warn=False),
    "Counter block": _block,
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_count_leaves_no_cycles(run: str) -> None:
    model = Net().eval()
    x = torch.randn(2, 3, 6, 6)
    RUNS[run](model, x)  # warm: lazily made module-level state is not a count's garbage
    with _cycles() as found:
        RUNS[run](model, x)
    assert _ours(found) == []


def test_the_check_sees_a_cycle() -> None:
    """The check itself: a Counter kept in a cycle is found."""
    with _cycles() as found:
        counter = flopscope.Counter(Net(), warn=False)
        holder: list[object] = [counter]
        holder.append(holder)
        del counter, holder
    assert "Counter" in _ours(found)
