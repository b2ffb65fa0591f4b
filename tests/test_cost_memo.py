"""A default rule's cost of a call on real tensors, remembered by the call's metadata
(flopscope.core.cost_memo): the same numbers as costing every call, and never a remembered cost
where the rule read a tensor's values or the output's size depends on them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchvision
from torch import nn

import flopscope
from flopscope.core import recorder as recorder_module
from flopscope.core.cost_memo import cost_key
from flopscope.report import Report


def _table(report: Report) -> dict[tuple[str, str, str], tuple[int, int, int, int, int]]:
    return {(r.module, r.op, r.phase.value): (r.calls, r.cost.macs, r.cost.flops, r.cost.bytes_read,
                                            r.cost.bytes_written) for r in report.records}


def _without_memo(monkeypatch: pytest.MonkeyPatch, fn: Any) -> Any:
    with monkeypatch.context() as m:
        m.setattr(recorder_module, "call_key", lambda *args: None)  # every call costed by its rule
        return fn()


class _Tiny(nn.Module):
    """A transformer-shaped model: attention, layer norm, GELU, embedding, loss-free."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.layers = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 3)
        self.head = nn.Linear(32, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.emb(ids)))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "tiny_transformer"])
@pytest.mark.parametrize("backward", [False, True])
def test_remembered_costs_equal_costing_every_call(
        name: str, backward: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    if name == "tiny_transformer":
        model: nn.Module = _Tiny()
        x = torch.randint(0, 50, (2, 7))
    else:
        model = torchvision.models.get_model(name, weights=None)
        x = torch.randn(1, 3, 64, 64)
    plain = _without_memo(monkeypatch, lambda: flopscope.count(model, x, backward=backward,
                                                               warn=False))
    first = flopscope.count(model, x, backward=backward, warn=False)
    again = flopscope.count(model, x, backward=backward, warn=False)  # every call remembered now
    third = flopscope.count(model, x, backward=backward, warn=False)  # its cost in the template
    assert _table(first) == _table(plain)
    assert _table(again) == _table(plain)
    assert _table(third) == _table(plain)
    assert first.to_dict() == plain.to_dict()


def test_a_rule_that_reads_values_is_costed_at_every_call() -> None:
    a, b = torch.randn(12, 8), torch.randn(3, 8, 4)
    macs = []
    for ends in ([2, 5, 12], [2, 5, 8], [2, 5, 12]):  # same metadata, different offsets
        offs = torch.tensor(ends, dtype=torch.int32)
        with flopscope.Counter(warn=False) as counter:
            torch._grouped_mm(a, b, offs=offs)
        macs.append(counter.report.macs)
    # rows covered by the groups times 8 * 4: 12 rows, then 8 (rows 8..11 in no group), then 12
    assert macs == [12 * 8 * 4, 8 * 8 * 4, 12 * 8 * 4]


def test_roi_boxes_are_read_at_every_call() -> None:
    from torchvision.ops import roi_align

    x = torch.randn(1, 2, 16, 16)
    flops = []
    for side in (2.0, 8.0):  # one box of side 2, then of side 8: same shapes, other values
        boxes = torch.tensor([[0.0, 0.0, 0.0, side, side]])
        with flopscope.Counter(warn=False) as counter:
            roi_align(x, boxes, output_size=2, sampling_ratio=0)
        flops.append(counter.report.flops)
    # adaptive grid: ceil(side / 2)^2 samples per bin, 4 bins, 2 channels, 8 FLOPs per sample,
    # plus 1 divide per output element (8): side 2: 1 * 4 * 2 * 8 + 8 = 72; side 8: 16 * 64 + 8
    assert flops == [72, 16 * 4 * 2 * 8 + 8]


def test_an_output_whose_size_depends_on_values_is_part_of_the_key() -> None:
    written = []
    for ones in (2, 5):
        x = torch.zeros(8)
        x[:ones] = 1
        with flopscope.Counter(warn=False) as counter:
            torch.nonzero(x)
        written.append(counter.report.by_op()["aten.nonzero.default"].cost.bytes_written)
    assert written == [2 * 8, 5 * 8]  # [n, 1] int64 indices


def test_what_is_not_keyed() -> None:
    t = torch.ones(2, 3)
    out = t + 1
    add = id(torch.ops.aten.add.Tensor)
    assert cost_key(add, (t, 1), {}, out) is not None
    assert cost_key(add, (t, 1), {}, out) == cost_key(add, (torch.zeros(2, 3), 1), {}, out)
    assert cost_key(add, (t, 1), {}, out) != cost_key(add, (t.t(), 1), {}, out.t())  # strides
    assert cost_key(add, (t, 1), {}, out) != cost_key(add, (t, 1.0), {}, out)  # 1 vs 1.0
    assert cost_key(add, (t.to("meta"), 1), {}, out) is None  # no values: the shape-only memo's
    assert cost_key(add, (t.to_sparse(), 1), {}, out) is None
    assert cost_key(add, (t.to(torch.complex64), 1), {}, out) is None
    assert cost_key(add, (t, object()), {}, out) is None  # an argument it cannot key
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert cost_key(add, (nested, 1), {}, out) is None
