"""Communication time (issue 29): alpha-beta per collective, the link calibration block, and the
overlap rules of a step (flopscope.estimate.comm_time)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flopscope.cost import Phase
from flopscope.errors import UsageError
from flopscope.estimate import get_hardware
from flopscope.estimate.comm_time import Links, comm_time
from flopscope.estimate.link_calibration import (
    LinkCalibration,
    LinkFit,
    LinkPoint,
    fit_alpha_beta,
)
from flopscope.estimate.profile import Hardware
from flopscope.report.records import CommRecord

# intra-node: 1 GB/s, 10 us per call; inter-node: 0.1 GB/s, 100 us
HW = Hardware("links", 1e10, vector={"fp32": 1e11}, intra_node_bandwidth=1e9,
              intra_node_latency=1e-5, inter_node_bandwidth=1e8, inter_node_latency=1e-4)


def _points(latency: float, bandwidth: float, kind: str = "all_reduce",
            ranks: int = 4) -> list[LinkPoint]:
    return [LinkPoint(kind, ranks, 4**p, 4**p * 3 // 2, latency + (4**p * 3 // 2) / bandwidth)
            for p in range(4, 13)]


def test_fit_recovers_latency_and_bandwidth_exactly() -> None:
    # t = 50 us + bus / 2 GB/s at every point: the relative least squares are 0 at the truth
    fit = fit_alpha_beta(_points(5e-5, 2e9))
    assert fit.latency == pytest.approx(5e-5, rel=1e-9)
    assert fit.bandwidth == pytest.approx(2e9, rel=1e-9)
    assert fit.error == pytest.approx(0, abs=1e-9) and fit.points == 9


def test_fit_keeps_both_terms_non_negative() -> None:
    # times that fall with size: no positive bandwidth fits; latency alone (weighted mean)
    pts = [LinkPoint("send", 2, s, s, t) for s, t in ((1000, 2e-4), (100_000, 1e-4))]
    fit = fit_alpha_beta(pts)
    assert fit.latency > 0 and fit.bandwidth > 1e20
    # times proportional to size: no latency, bandwidth 1 GB/s
    pts = [LinkPoint("send", 2, s, s, s / 1e9) for s in (1000, 100_000)]
    assert fit_alpha_beta(pts).latency == 0
    assert fit_alpha_beta(pts).bandwidth == pytest.approx(1e9)
    with pytest.raises(UsageError, match="no points to fit"):
        fit_alpha_beta([])


def test_collective_time_is_latency_plus_bus_bytes_over_bandwidth() -> None:
    links = Links.of(HW, gpus_per_node=4)
    # inside a node: 2 calls, 1,000,000 bus bytes: 2 x 10 us + 1e6 / 1e9 = 1.02 ms
    assert links.call_seconds("all_reduce", 1_000_000, 2, span=4) == pytest.approx(1.02e-3)
    # a group spanning 8 ranks crosses nodes of 4: 2 x 100 us + 1e6 / 1e8 = 10.2 ms
    assert links.call_seconds("all_reduce", 1_000_000, 2, span=8) == pytest.approx(1.02e-2)


def _calibrated(hw: Hardware) -> Hardware:
    points = (_points(5e-5, 2e9) + _points(2e-5, 4e9, "all_gather")
              + _points(1e-4, 1e9, ranks=2))
    cal = LinkCalibration.of_points(points, date="2026-11-27T03:00:00+00:00", backend="gloo",
                                    ranks=4, link="intra", host="cpu (test)", threads=1,
                                    versions={"torch": "x"})
    return dataclasses.replace(hw, intra_node_bandwidth=cal.fit.bandwidth,
                               intra_node_latency=cal.fit.latency, link_calibration=cal)


def test_a_calibrated_link_uses_each_kinds_own_fit() -> None:
    links = Links.of(_calibrated(HW), gpus_per_node=4)
    # all_reduce over 4 ranks, its own fit: 50 us + 3e6 / 2e9 = 1.55 ms; over 2 ranks:
    # 100 us + 3e6 / 1e9 = 3.1 ms; all_gather's (4 ranks): 20 us + 3e6 / 4e9 = 0.77 ms
    assert links.call_seconds("all_reduce", 3_000_000, 1, 4, 4) == pytest.approx(1.55e-3)
    assert links.call_seconds("all_reduce", 3_000_000, 1, 2, 2) == pytest.approx(3.1e-3)
    assert links.call_seconds("all_gather", 3_000_000, 1, 4, 4) == pytest.approx(7.7e-4)
    # a group size the probe did not time: the kind's fit over every size
    cal = _calibrated(HW).link_calibration
    assert cal is not None
    assert links.call_seconds("all_reduce", 3_000_000, 1, 3, 3) == pytest.approx(
        cal.kinds["all_reduce"].seconds(3_000_000))
    # a kind the probe did not time: the link fields (the fit over every point)
    fit = links.call_seconds("broadcast", 3_000_000, 1, 4)
    assert fit == pytest.approx(cal.fit.seconds(3_000_000))
    assert links.source == "calibrated 2026-11-27 (gloo, 4 ranks, intra-node)"
    # across nodes: the profile's inter-node fields, the intra-node fits do not apply
    assert links.call_seconds("all_reduce", 1_000_000, 1, 8) == pytest.approx(1e-4 + 1e-2)


def test_the_block_round_trips_through_a_profile_file(tmp_path: Path) -> None:
    hw = _calibrated(HW)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(hw.to_dict()))
    back = get_hardware(str(path))
    assert back.link_calibration is not None
    assert back.link_calibration.points == hw.link_calibration.points  # type: ignore[union-attr]
    assert back.link_calibration.kinds["all_gather"].latency == pytest.approx(2e-5)
    assert back.link_calibration.groups["all_reduce"][2].latency == pytest.approx(1e-4)
    assert back.intra_node_bandwidth == pytest.approx(hw.intra_node_bandwidth)


@pytest.mark.parametrize(("change", "message"), [
    (lambda b: b.pop("fit"), "link_calibration needs 'fit'"),
    (lambda b: b.update(link="rack"), "link must be one of intra, inter, not 'rack'"),
    (lambda b: b["points"][0].pop("seconds"), "point 0 is malformed"),
    (lambda b: b["points"][0].update(seconds=0), "point 0: seconds must be positive"),
    (lambda b: b["fit"].update(bandwidth_gb_s=-1), "bandwidth must be positive"),
    (lambda b: b["groups"]["all_reduce"]["2"].pop("latency_us"),
     "groups: all_reduce: 2: a fit needs latency_us"),
])
def test_a_malformed_block_is_one_clear_error(change: object, message: str) -> None:
    data = _calibrated(HW).to_dict()
    change(data["link_calibration"])  # type: ignore[operator]
    with pytest.raises(UsageError, match=message):
        Hardware.from_dict(data, where="p.json")


def test_links_need_figures() -> None:
    cpu = Hardware("cpu", 1e10, vector={"fp32": 1e11})
    with pytest.raises(UsageError, match="has no link bandwidths.*calibrate --comm"):
        Links.of(cpu, 8)
    intra_only = dataclasses.replace(cpu, intra_node_bandwidth=1e9)
    assert Links.of(intra_only, 8, gpus=8).inter_bandwidth is None
    with pytest.raises(UsageError, match="no inter-node link figures and 16 devices"):
        Links.of(intra_only, 8, gpus=16)


def _rec(kind: str, phase: Phase, calls: int, bus: int, n: int = 2) -> CommRecord:
    return CommRecord("model", phase, kind, n, calls, bus, bus)


def test_overlap_rules() -> None:
    links = Links.of(HW, gpus_per_node=8)
    records = [
        _rec("all_gather", Phase.FORWARD, 4, 4_000_000),       # 4 x 10 us + 4 ms = 4.04 ms
        _rec("all_reduce", Phase.FORWARD, 2, 1_000_000),       # 20 us + 1 ms = 1.02 ms
        _rec("all_reduce", Phase.BACKWARD, 3, 2_000_000),      # 30 us + 2 ms = 2.03 ms
        _rec("all_gather", Phase.BACKWARD, 3, 3_000_000),      # 3.03 ms
        _rec("reduce_scatter", Phase.BACKWARD, 4, 4_000_000),  # 4.04 ms
        _rec("send", Phase.FORWARD, 1, 500_000),               # 0.51 ms
    ]
    t = comm_time(records, links, tp=2, dp=2, gpus=8)
    assert t.blocking_forward == pytest.approx(1.02e-3)
    assert t.blocking_backward == pytest.approx(2.03e-3)
    # the first all-gather: one call of the first forward record, 4.04 ms / 4 = 1.01 ms
    assert t.overlapped_first == pytest.approx(1.01e-3)
    assert t.overlapped_rest == pytest.approx(4.04e-3 + 3.03e-3 + 4.04e-3 - 1.01e-3)
    assert t.p2p == pytest.approx(0.51e-3)
    assert t.by_kind == pytest.approx({"all_gather": 7.07e-3, "all_reduce": 3.05e-3,
                                       "reduce_scatter": 4.04e-3, "send": 0.51e-3})
    # beside 20 ms of compute every FSDP2 collective but the first all-gather hides:
    # exposed = blocking 3.05 + p2p 0.51 + first 1.01 = 4.57 ms
    assert t.exposed(20e-3) == pytest.approx(4.57e-3)
    # beside 5 ms: busy = 5 + 3.05 = 8.05 ms; the rest (10.1 ms) shows 2.05 ms beyond it
    assert t.exposed(5e-3) == pytest.approx(4.57e-3 + 10.1e-3 - 8.05e-3)
    # two microbatches simulated as one: everything but the first all-gather doubles
    twice = comm_time(records, links, tp=2, dp=2, gpus=8, scale=2)
    assert twice.overlapped_first == pytest.approx(1.01e-3)
    assert twice.blocking == pytest.approx(2 * 3.05e-3)
    assert twice.overlapped_rest == pytest.approx(2 * 11.11e-3 - 1.01e-3)


def test_fit_to_dict_is_microseconds_and_gb_s() -> None:
    assert LinkFit(5e-5, 2e9, 0.1, 9).to_dict() == {
        "latency_us": pytest.approx(50), "bandwidth_gb_s": pytest.approx(2), "error": 0.1,
        "points": 9}


def test_a_collective_is_sorted_by_its_group() -> None:
    # TP 4 x FSDP 4 = 16 ranks on nodes of 4: a tensor-parallel group stays inside a node
    # (1 GB/s, 10 us), an FSDP group spans 16 ranks (0.1 GB/s, 100 us). Two all-gathers of the
    # same size and group size, one over each group: sequence parallelism's over "tp" is
    # blocking, 10 us + 1e6 / 1e9 = 1.01 ms, exposed in forward; FSDP2's over "dp" is
    # overlapped (the step's first all-gather: 100 us + 1e6 / 1e8 = 10.1 ms, exposed)
    links = Links.of(HW, gpus_per_node=4)
    sp = CommRecord("model.layers.0.self_attn", Phase.FORWARD, "all_gather", 4, 1, 1_000_000,
                    1_000_000, "tp")
    fsdp = dataclasses.replace(sp, module="model.layers.0", group="dp")
    comm = comm_time([sp, fsdp], links, tp=4, dp=4)
    assert comm.blocking_forward == pytest.approx(1.01e-3)
    assert comm.overlapped_first == pytest.approx(1.01e-2)
    assert comm.blocking_backward == comm.overlapped_rest == comm.p2p == 0
    assert comm.by_kind["all_gather"] == pytest.approx(1.01e-3 + 1.01e-2)
    # the same records without their groups (an older report): both taken as FSDP2's
    bare = comm_time([dataclasses.replace(r, group="") for r in (sp, fsdp)], links, tp=4, dp=4)
    assert bare.blocking_forward == 0
    assert bare.overlapped_first + bare.overlapped_rest == pytest.approx(2 * 1.01e-2)


def test_over_gloos_links_nothing_overlaps() -> None:
    # the records of test_overlap_rules over links a gloo calibration measured: gloo's
    # transfers run on the CPU cores the ranks compute on, so FSDP2's all-gathers and
    # reduce-scatters are exposed where they run, as the blocking all-reduces are
    records = [
        _rec("all_gather", Phase.FORWARD, 4, 4_000_000),       # 4.04 ms
        _rec("all_reduce", Phase.FORWARD, 2, 1_000_000),       # 1.02 ms
        _rec("all_reduce", Phase.BACKWARD, 3, 2_000_000),      # 2.03 ms
        _rec("all_gather", Phase.BACKWARD, 3, 3_000_000),      # 3.03 ms
        _rec("reduce_scatter", Phase.BACKWARD, 4, 4_000_000),  # 4.04 ms
    ]
    gloo = dataclasses.replace(Links.of(HW, gpus_per_node=8), overlap=False)
    t = comm_time(records, gloo, tp=2, dp=2, gpus=8)
    assert t.overlapped_first == t.overlapped_rest == 0.0
    assert t.blocking_forward == pytest.approx(4.04e-3 + 1.02e-3)
    assert t.blocking_backward == pytest.approx(2.03e-3 + 3.03e-3 + 4.04e-3)
    assert t.exposed(20e-3) == pytest.approx(14.16e-3)  # all of it, however long the compute
    # a profile whose link calibration was measured with gloo gets such links
    gloo_hw = _calibrated(HW)  # its link calibration was measured with gloo
    assert gloo_hw.link_calibration is not None and gloo_hw.link_calibration.backend == "gloo"
    assert not Links.of(gloo_hw, gpus_per_node=8).overlap
    nccl = dataclasses.replace(gloo_hw.link_calibration, backend="nccl")
    assert Links.of(dataclasses.replace(HW, link_calibration=nccl), gpus_per_node=8).overlap
    assert Links.of(HW, gpus_per_node=8).overlap  # the profile's link fields: a device's
