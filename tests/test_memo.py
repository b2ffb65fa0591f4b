"""Shape-only counting on meta tensors with memoised outputs and costs (flopscope.core.memo)."""

from __future__ import annotations

import torch
from torch import nn

import flopscope
from flopscope.core import memo as _memo
from flopscope.core.facts import MemoKind, facts
from flopscope.report import Report


def _table(report: Report) -> dict[tuple[str, str, str], tuple[int, int, int, int, int]]:
    return {(r.module, r.op, r.phase.value): (r.calls, r.cost.macs, r.cost.flops, r.cost.bytes_read,
                                            r.cost.bytes_written) for r in report.records}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(self.bn(self.conv(x)) + x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x)).mean((2, 3))
        return self.head(y)


def test_signature_only_for_plain_meta_tensors() -> None:
    meta = torch.empty(2, 3, device="meta")
    assert _memo.signature(1, (meta, 2, 1.0, None, [1, 2]), {}) is not None
    assert _memo.signature(1, (torch.ones(2, 3),), {}) is None  # values could be read
    assert _memo.signature(1, (meta, object()), {}) is None  # an argument it cannot key
    assert _memo.signature(1, (torch.empty(2, device="meta", dtype=torch.complex64),), {}) is None
    # 1, 1.0 and True promote differently: different keys
    keys = {_memo.signature(1, (meta, v), {}) for v in (1, 1.0, True)}
    assert len(keys) == 3


def test_shape_only_equals_real_count_exactly() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    real = flopscope.count(model, x)
    shape_only = flopscope.count(model, x, shape_only=True)
    again = flopscope.count(model, x, shape_only=True)  # memoised outputs and costs
    assert shape_only.shape_only
    assert _table(shape_only) == _table(real) == _table(again)
    assert shape_only.params == real.params
    # the model is untouched: same tensors on the CPU, same values
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert model.head.weight is model.emb.weight
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_backward_shape_only_equals_real() -> None:
    model = Net().train()
    x = torch.randn(2, 3, 16, 16)
    real = flopscope.count(model, x, backward=True)
    shape_only = flopscope.count(model, x, backward=True, shape_only=True)
    assert _table(shape_only) == _table(real)
    assert all(p.grad is None for p in model.parameters())


def test_user_rules_are_not_memoised() -> None:
    seen: list[int] = []

    def rule(call: flopscope.OpCall) -> flopscope.Cost:
        seen.append(1)
        return call.cost(macs=1)

    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))
    report = flopscope.count(model, torch.randn(2, 4), rules={"aten::addmm": rule})
    assert len(seen) == 3
    assert report.macs == 3


def test_in_place_replay_returns_its_argument() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4),
                              nn.ReLU(inplace=True))
    x = torch.randn(3, 4)
    first = flopscope.count(model, x)
    second = flopscope.count(model, x)
    assert _table(first) == _table(second)
    relu = torch.ops.aten.relu_.default
    assert facts(relu).memo_kind == MemoKind.SELF
    assert facts(torch.ops.aten.resize_.default).memo_kind == MemoKind.OTHER
    assert facts(torch.ops.aten.view.default).memo_kind == MemoKind.OTHER
    assert facts(torch.ops.aten.mm.default).memo_kind == MemoKind.NEW


def test_default_dtype_is_part_of_the_key() -> None:
    meta = torch.empty(2, dtype=torch.int64, device="meta")
    first = _memo.signature(1, (meta, 0.5), {})
    torch.set_default_dtype(torch.float64)
    try:
        assert _memo.signature(1, (meta, 0.5), {}) != first
        out = flopscope.Counter()
        with out:
            y = meta * 0.5
        assert y.dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    with flopscope.Counter():
        assert (meta * 0.5).dtype == torch.float32


def test_a_mode_below_the_counter_still_sees_every_call() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
    x = torch.randn(2, 8)
    flopscope.count(model, x)  # remembered outputs from now on
    with FlopCounterMode(display=False) as fcm:
        report = flopscope.count(model, x)
    assert fcm.get_total_flops() == 2 * report.macs == 2 * 4 * 2 * 8 * 8


def test_a_real_count_after_a_symbolic_one_gets_real_tensors() -> None:
    """A factory given only scalars (``torch.full((), 2.0)``) has the same memo key in every
    count; a symbolic count remembers fake outputs for it, which must go when that count ends."""
    from flopscope.symbolic import count_symbolic

    seen: list[type] = []

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = torch.full((), 2.0)
            seen.append(type(t))
            return x * t

    count_symbolic(Scaled(), torch.ones(3, 4), symbolic={"n": [(0, 0)]}, warn=False)
    assert seen[0] is not torch.Tensor  # fake during the symbolic count
    seen.clear()
    with flopscope.Counter(warn=False):
        Scaled()(torch.ones(3, 4))
    report = flopscope.count(Scaled(), torch.ones(3, 4), warn=False)
    assert seen == [torch.Tensor, torch.Tensor]
    assert report.flops == 12  # 3 x 4 multiplies
