"""Report: module-scoped queries, typed source facts, serialization, and how it shows itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import flopscope
from flopscope.core.params import ParamStats
from flopscope.cost import Cost, Phase
from flopscope.report import CommRecord, OpRecord, Report, SourceInfo


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _report() -> Report:
    model = nn.Sequential(Block(), nn.Linear(4, 2))
    return flopscope.count(model, torch.randn(3, 8), backward=True)


def test_total_of_one_module_is_its_inclusive_cost() -> None:
    r = _report()
    # forward MACs: block.fc1 3 x 16 x 8 = 384, block.fc2 3 x 4 x 16 = 192, last 3 x 2 x 4 = 24
    assert r.total("forward", module="0").macs == 384 + 192
    assert r.total("forward", module="0.fc1").macs == 384
    assert r.total("forward", module="1").macs == 24
    assert r.total(module="") == r.total()
    for path, stats in r.by_module().items():
        assert r.total(module=path) == stats.inclusive
        assert r.total(Phase.BACKWARD, module=path) == r.by_module("backward")[path].inclusive


def test_by_op_of_one_module() -> None:
    r = _report()
    ops = r.by_op("forward", module="0.fc2")
    assert ops["aten.addmm.default"].cost.macs == 192
    assert "aten.relu.default" not in ops  # relu runs in block "0" itself, not in fc2
    assert "aten.relu.default" in r.by_op("forward", module="0")


def test_unknown_module_path_suggests_close_ones() -> None:
    r = _report()
    with pytest.raises(flopscope.UsageError, match=r"no module '0\.fc3'; did you mean '0\.fc2', '0\.fc1'"):
        r.total(module="0.fc3")
    with pytest.raises(flopscope.UsageError, match=r"unknown phase 'sideways'"):
        r.total("sideways")


def test_uncounted_per_module() -> None:
    lib = torch.library.Library("flopscope_report", "FRAGMENT")  # noqa: TID251
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x.clone(), "CompositeExplicitAutograd")

    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.flopscope_report.opaque(x)  # type: ignore[no-any-return]

    model = nn.Sequential(nn.Linear(4, 4), Inner())
    r = flopscope.count(model, torch.randn(2, 4), warn=False)
    assert r.uncounted == {"flopscope_report.opaque.default": 1}
    assert r.uncounted_in("1") == {"flopscope_report.opaque.default": 1}
    assert r.uncounted_in("0") == {}


def test_source_info_is_typed_and_a_mapping() -> None:
    info = SourceInfo(source="torchvision:resnet18", inputs=("1x3x224x224",), reference_gmacs=1.814)
    assert info.inputs == ("1x3x224x224",)
    assert info["inputs"] == ["1x3x224x224"]  # the JSON view
    assert dict(info) == {"reference_gmacs": 1.814, "inputs": ["1x3x224x224"],
                          "source": "torchvision:resnet18"}
    assert SourceInfo.from_dict(info.to_dict()) == info
    merged = SourceInfo(inputs=("2x8",)).merged(SourceInfo(source="hf:llama"))
    assert (merged.source, merged.inputs) == ("hf:llama", ("2x8",))


def test_replace_and_json_round_trip_keep_everything() -> None:
    r = dataclasses.replace(_report(), meta=SourceInfo(source="x.py:f", inputs=("3x8",)),
                            shape_only=True)
    back = Report.from_json(r.to_json())
    assert back == r
    assert back.meta.source == "x.py:f"


def test_report_shows_itself_through_the_registered_renderer() -> None:
    r = _report()
    text = str(r)
    assert text == r.table()
    assert "Sequential" in text and "MAC" in text
    assert r.__rich__() is not None


def test_costs_add() -> None:
    assert Cost(1, 2, 3, 4) + Cost(10, 20, 30, 40) == Cost(11, 22, 33, 44)


def _sharded_report() -> Report:
    """A hand-made report of one rank of four: a linear layer's shard and one all-reduce."""
    fwd = Phase.FORWARD
    return Report(
        model="M",
        modules={"": ("M", 1), "fc": ("Linear", 1)},
        module_params={"": ParamStats(own=0, inclusive=64), "fc": ParamStats(own=64, inclusive=64)},
        # the shard: [2, 8] @ [8, 2] = 32 MACs; the logical product [2, 8] @ [8, 8] = 128 MACs
        records=(OpRecord("fc", "aten.mm.default", fwd, 1, Cost(32, 64, 192, 32)),),
        # all-reduce of 64 bytes over 4 ranks: ring bus bytes 2 * (4 - 1) / 4 * 64 = 96
        communication=(CommRecord("fc", fwd, "all_reduce", 4, 1, 64, 96),),
        logical=(OpRecord("fc", "aten.mm.default", fwd, 1, Cost(128, 256, 640, 128)),),
        rank=1,
        world_size=4,
    )


def test_sharded_views_and_their_json_round_trip() -> None:
    r = _sharded_report()
    assert r.total().macs == 32 and r.logical_total(module="fc").macs == 128
    assert r.communication_total(module="").bus_bytes == 96
    data = r.to_dict()
    # the distributed keys come last, in this order, only because rank/communication/logical are set
    assert list(data)[-4:] == ["rank", "world_size", "communication", "logical"]
    assert data["communication"]["kinds"] == {"all_reduce": {"calls": 1, "payload_bytes": 64,
                                                             "bus_bytes": 96}}
    assert "decomposed" not in data["logical"]["records"][0]
    assert Report.from_json(r.to_json()) == r


def test_sharded_views_check_phase_and_module_when_called() -> None:
    # These once validated through a generator that was never iterated: a wrong module path
    # gave an empty answer instead of an error.
    r = _sharded_report()
    with pytest.raises(flopscope.UsageError, match=r"no module 'fc2'; did you mean 'fc'"):
        r.communication_by_kind(module="fc2")
    with pytest.raises(flopscope.UsageError, match=r"no module 'fc2'"):
        r.logical_total(module="fc2")
    with pytest.raises(flopscope.UsageError, match=r"unknown phase 'sideways'"):
        r.replicated_total("sideways")


def test_malformed_report_data_names_what_is_wrong() -> None:
    data = _sharded_report().to_dict()
    del data["records"][0]["flops"]
    with pytest.raises(flopscope.UsageError, match=r"malformed flopscope report \(KeyError: 'flops'\)"):
        Report.from_dict(data)
    with pytest.raises(flopscope.UsageError, match=r"expected schema 'flopscope.report/1', found 'x/9'"):
        Report.from_dict({**data, "schema": "x/9"})


def test_table_rows_per_module_and_per_op() -> None:
    r = _sharded_report()
    rows = r.table_rows("module")
    assert [(row["module"], row["depth"], row["macs"], row["self_macs"]) for row in rows] == [
        ("", 0, 32, 0), ("fc", 1, 32, 32)]
    assert r.table_rows("op") == [{"op": "aten.mm.default", "calls": 1, "macs": 32, "flops": 64,
                                   "bytes_read": 192, "bytes_written": 32, "counted": True}]
    with pytest.raises(flopscope.UsageError, match=r"unknown breakdown 'layer'"):
        r.table_rows("layer")


def test_op_record_is_a_frozen_op_record() -> None:
    """``op_record`` (what a report's records are made with: a twin class filled, then turned
    into an OpRecord) makes records indistinguishable from ``OpRecord(...)``: the same class,
    equal and hashed alike, frozen, pickled and copied back to equal records."""
    import copy
    import pickle

    from flopscope.report.records import op_record

    cost = Cost(32, 64, 192, 32)
    made = op_record("fc", "aten.mm.default", Phase.FORWARD, 2, cost, True, False)
    built = OpRecord("fc", "aten.mm.default", Phase.FORWARD, 2, cost)
    assert type(made) is OpRecord
    assert made == built and hash(made) == hash(built)
    assert (made.module, made.op, made.phase, made.calls, made.cost, made.counted,
            made.decomposed) == ("fc", "aten.mm.default", Phase.FORWARD, 2, cost, True, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.calls = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(made)) == built
    assert copy.deepcopy(made) == built and dataclasses.replace(made, calls=3).calls == 3
    assert not hasattr(made, "__dict__")
    # a real report's records are such records
    report = flopscope.count(nn.Linear(4, 8), torch.randn(2, 4), warn=False)
    assert all(type(r) is OpRecord for r in report.records)
