"""Data-dependent sizes under a symbolic count (issue 14: "a clear message that names the
operator, or an explicit unknown symbol"): a size computed from tensor values (``nonzero``,
``masked_select``, a router's tokens per expert) is an unbacked symbol ``u0`` of PyTorch's
ShapeEnv. Where it reaches a cost it stays an explicit symbol, listed in
``SymbolicReport.unknowns`` with the operator that made it and its module, and given a value at
evaluation. Where the model's own code needs its value (``int(t.item())``) the count is refused
with the operator that made it and the module named (test_symbolic.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope.symbolic import count_symbolic


class _Where(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0)


def test_a_data_dependent_size_in_a_cost_is_an_explicit_symbol() -> None:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    rep = count_symbolic(_Where(), x, symbolic={"batch": (0, 0)}, warn=False)
    assert rep.unknowns == {"u0": "data-dependent size made by aten.nonzero.default in module ''"}
    # x > 0 reads 4 * batch floats (16 bytes a row) and writes 4 * batch bools; nonzero reads
    # those and writes u0 rows of 2 int64 indices (16 bytes each)
    b = rep.symbols["batch"]
    total = rep.total()
    assert str(total.bytes_written) == "4*batch + 16*u0"
    assert total.bytes_read == 20 * b
    n = int((x > 0).sum())
    assert rep.evaluate(batch=6, u0=n).total() == flopscope.count(_Where(), x, warn=False).total()
    with pytest.raises(flopscope.UsageError, match=re.escape("give a value for ['u0']")):
        rep.evaluate(batch=6)
    with pytest.raises(flopscope.UsageError, match=r"data-dependent sizes \['u0'\]"):
        rep.evaluate(batch=6, u1=3)


class _NonZeroRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x[torch.nonzero(x[:, 0] > 0)[:, 0]])


class _MaskedSelect(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.masked_select(x, x > 0)[:, None])


class _Routed(nn.Module):
    """Top-1 routing as Mixtral's eager experts do it: each expert runs on the tokens routed to
    it (torch.where), a count known only from the router's values."""

    def __init__(self, experts: int = 4, d: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            (tokens,) = torch.where(top == i)
            out.index_add_(0, tokens, expert(x[tokens]))
        return out


def _rows(m: nn.Module, x: torch.Tensor) -> list[int]:
    return [int((x[:, 0] > 0).sum())]


def _selected(m: nn.Module, x: torch.Tensor) -> list[int]:
    return [int((x > 0).sum())]


def _per_expert(m: nn.Module, x: torch.Tensor) -> list[int]:
    top = m.gate(x).argmax(-1)  # type: ignore[operator]
    return [int((top == i).sum()) for i in range(len(m.experts))]  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "width", "per_row", "sizes", "made_by", "module"), [
    (_NonZeroRows, 4, 8 * 4, _rows, "aten.nonzero.default", "lin"),
    (_MaskedSelect, 4, 8 * 1, _selected, "aten.masked_select.default", "lin"),
    (_Routed, 8, 8 * 8, _per_expert, "aten.nonzero.default", "experts.0"),
])
def test_a_data_dependent_size_that_reaches_a_product(
        model: type[nn.Module], width: int, per_row: int, sizes: Any, made_by: str,
        module: str) -> None:
    # a Linear(i, o) on u0 rows costs o * i * u0 MACs (per_row * u0): the costs hold u0 (the
    # Counter tests a cost against zero without a guard, which on u0 PyTorch could not make: the
    # count was refused before), the report names what made it, and evaluated at the sizes the
    # values give it equals the concrete count
    torch.manual_seed(0)
    m = model().eval()
    x = torch.randn(6, width)
    rep = count_symbolic(m, x, symbolic={"batch": (0, 0)}, warn=False)
    assert rep.unknowns["u0"] == f"data-dependent size made by {made_by} in module ''"
    u0 = next(s for s in rep.by_module()[module].macs.free_symbols if str(s) == "u0")
    assert rep.by_module()[module].macs == per_row * u0
    values = {f"u{i}": n for i, n in enumerate(sizes(m, x))}
    with torch.no_grad():
        concrete = flopscope.count(m, x, warn=False)
    assert rep.evaluate(batch=6, **values).total() == concrete.total()
