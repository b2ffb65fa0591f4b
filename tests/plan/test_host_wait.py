"""plan.timing: a training step on a GPU's prediction runs its communication in the time the
device waits for the host, by the serving step's rule (``host_overlap``): a host-bound step
gets shorter, a device-bound one is the sum it was, to the bit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from flopscope.cost import Phase
from flopscope.estimate import PROFILES, get_hardware
from flopscope.estimate.bound import Row
from flopscope.estimate.comm_time import Links
from flopscope.estimate.overlap import host_overlap
from flopscope.plan.serve_time import serve_step_time
from flopscope.plan.space import Choice
from flopscope.plan.timing import step_time
from flopscope.report.records import CommRecord

# 1 GB/s inside a node and no latency: a collective of N bus bytes takes N ns
LINKS = Links(1e9, 0.0, None, 0.0, 8)
MS = 1e-3


def _row(device: float, host: float) -> Row:
    # a phase on a GPU's prediction: predicted_s is the host's time plus the device's
    return Row(calls=1, time_s=device / 10, predicted_s=device + host, host_s=host)


def _run(phases: dict[str, tuple[float, float]], comm: list[CommRecord], hardware: Any,
         microbatches: int = 1) -> Any:
    estimate = SimpleNamespace(by_phase={k: _row(*v) for k, v in phases.items()},
                               hardware=hardware, calibrated=True)
    return SimpleNamespace(estimate=estimate, report=SimpleNamespace(communication=comm),
                           microbatches=microbatches, key=None)


def _ar(phase: Phase, bus: int) -> CommRecord:
    return CommRecord("m", phase, "all_reduce", 2, 1, bus, bus, "tp")


def test_the_rule() -> None:
    # max(host, device + comm), and comm exposed beyond the device's wait max(0, host - device)
    assert host_overlap(10.0, 4.0, 3.0) == (10.0, 0.0)  # waits 6: the 3 hide
    assert host_overlap(10.0, 8.0, 3.0) == (11.0, 1.0)  # waits 2: 1 of the 3 exposed
    assert host_overlap(1.0, 8.0, 3.0) == (11.0, 3.0)  # device-bound: all 3 exposed
    assert host_overlap(0.0, 8.0) == (8.0, 0.0)  # a CPU's or the bound's: one timeline


def test_tensor_parallel_all_reduces_hide_in_a_host_bound_phase() -> None:
    hw = get_hardware("h100-sxm")
    assert hw.calibration is not None and hw.calibration.device.startswith("cuda")
    choice = Choice(2, 1, 1, 1, 1, "none")
    # forward: 4 ms of device work, 10 ms of host; backward 8 ms and 10 ms; an all-reduce of
    # 3 MB (3 ms) in each
    comm = [_ar(Phase.FORWARD, 3_000_000), _ar(Phase.BACKWARD, 3_000_000)]
    host_bound = _run({"forward": (4 * MS, 10 * MS), "backward": (8 * MS, 10 * MS)}, comm, hw)
    t = step_time([host_bound], choice, LINKS)
    # forward max(10, 4 + 3) = 10 (the 3 ms run in its 6 ms wait), backward max(10, 8 + 3) =
    # 11 (1 ms beyond its 2 ms wait): 21 ms, where adding the all-reduces on top gave
    # 10 + 10 + 6 = 26 ms
    assert t.total == pytest.approx(21 * MS, rel=1e-12)
    assert (t.forward, t.backward) == (10 * MS, 10 * MS)  # the longer of host and device
    assert t.tp_comm == pytest.approx(1 * MS, rel=1e-9)  # what is exposed
    assert t.total == pytest.approx(sum(t.parts().values()), rel=1e-12)
    # each phase is the serving step's rule: max(host, device + its all-reduces)
    fwd = serve_step_time(4 * MS, [_ar(Phase.FORWARD, 3_000_000)], 0, 2, 1, LINKS,
                          "prediction", host=10 * MS)
    bwd = serve_step_time(8 * MS, [_ar(Phase.FORWARD, 3_000_000)], 0, 2, 1, LINKS,
                          "prediction", host=10 * MS)
    assert t.total == pytest.approx(fwd.total + bwd.total, rel=1e-12)
    # device-bound (1 ms of host a phase): nothing to hide behind, the sum 4 + 8 + 3 + 3
    device_bound = _run({"forward": (4 * MS, 1 * MS), "backward": (8 * MS, 1 * MS)}, comm, hw)
    t = step_time([device_bound], choice, LINKS)
    assert t.total == 4 * MS + 8 * MS + (0.003 + 0.003)
    assert t.tp_comm == 0.003 + 0.003
    # the bound (no host): the same sum of its own compute (a tenth of the device's)
    b = step_time([host_bound], choice, LINKS, bound=True)
    assert b.total == 0.4 * MS + 0.8 * MS + (0.003 + 0.003)


def test_fsdp_first_gather_and_pipeline_sends_hide_in_the_waits_left() -> None:
    hw = get_hardware("h100-sxm")
    # FSDP 2: two forward all-gathers of 1 MB (the first 1 ms exposed where nothing hides it),
    # one backward reduce-scatter of 2 MB
    gathers = [CommRecord("m", Phase.FORWARD, "all_gather", 2, 2, 2_000_000, 2_000_000, "dp"),
               CommRecord("m", Phase.BACKWARD, "reduce_scatter", 2, 1, 2_000_000, 2_000_000,
                          "dp")]
    choice = Choice(1, 1, 2, 1, 1, "none")
    t = step_time([_run({"forward": (4 * MS, 10 * MS), "backward": (8 * MS, 10 * MS)},
                        gathers, hw)], choice, LINKS)
    # phases 10 + 10 ms (the device waits 6 + 2 ms); the first gather (1 ms) runs in that
    # wait; the rest (1 + 2 ms) beside the 20 ms: nothing exposed (was 1 ms: 21 ms)
    assert (t.total, t.fsdp_comm) == (20 * MS, 0.0)
    assert t.fsdp_hidden == pytest.approx(4 * MS, rel=1e-9)
    t = step_time([_run({"forward": (4 * MS, 1 * MS), "backward": (8 * MS, 1 * MS)},
                        gathers, hw)], choice, LINKS)
    assert (t.total, t.fsdp_comm) == (12 * MS + 0.001, 0.001)  # device-bound: as before
    # FSDP2's stream longer than the step: a 28 MB reduce-scatter (28 ms). The stream holds
    # the first gather (1 ms, hidden in the forward's wait), the second (1 ms) and the 28 ms:
    # 30 ms, which no overlap shortens; the rest overlap the 20 ms of phases but the 1 ms the
    # first gather held: 29 - 19 = 10 ms exposed, the step 30 ms (was 28: under the stream)
    big = [gathers[0], CommRecord("m", Phase.BACKWARD, "reduce_scatter", 2, 1, 28_000_000,
                                  28_000_000, "dp")]
    host_bound = _run({"forward": (4 * MS, 10 * MS), "backward": (8 * MS, 10 * MS)}, big, hw)
    t = step_time([host_bound], choice, LINKS)
    assert t.total == pytest.approx(30 * MS, rel=1e-9)
    # the bound: 12 ms of device, the first gather exposed (1 ms), the rest beside the 12 ms:
    # 1 + 12 + 17 = 30 ms, the same stream; the prediction is never under it
    b = step_time([host_bound], choice, LINKS, bound=True)
    assert b.total == pytest.approx(30 * MS, rel=1e-9) and t.total >= b.total * (1 - 1e-12)
    # two stages of the same work, 2 microbatches, a 5 MB send (5 ms) per stage: each phase
    # 10 ms (5 a microbatch), the 1F1B makespan 30 ms for 20 busy (stage 0: F0 F1 at 0-10,
    # B0 at 15-20 after stage 1's F0 B0 at 5-15, B1 at 25-30); the send hides in the 8 ms the
    # device waits (was 35 ms)
    send = [CommRecord("m", Phase.FORWARD, "send", 2, 1, 5_000_000, 5_000_000, "pp")]
    stage = _run({"forward": (4 * MS, 10 * MS), "backward": (8 * MS, 10 * MS)}, send, hw, 2)
    t = step_time([stage, stage], Choice(1, 2, 1, 1, 2, "none"), LINKS)
    assert (t.p2p, t.bubble) == (0.0, pytest.approx(10 * MS, rel=1e-12))
    assert t.total == pytest.approx(30 * MS, rel=1e-12)
    # device-bound (host 1 ms): the send exposed, 5 ms on top of the makespan of 12 ms phases
    # (F 2, B 4 a microbatch: stage 0 F0 0-2, F1 2-4, B0 8-12 after stage 1's F0 2-4 B0 4-8,
    # F1 8-10, B1 10-14; stage 0's B1 14-18: 18 ms)
    stage = _run({"forward": (4 * MS, 1 * MS), "backward": (8 * MS, 1 * MS)}, send, hw, 2)
    t = step_time([stage, stage], Choice(1, 2, 1, 1, 2, "none"), LINKS)
    assert t.p2p == 0.005
    assert t.total == pytest.approx(18 * MS + 0.005, rel=1e-12)
    # a CPU's prediction (one timeline, host 0): the datasheet profile's bound is the same sum
    b = step_time([stage, stage], Choice(1, 2, 1, 1, 2, "none"), LINKS, bound=True)
    assert b.p2p == 0.005
    assert PROFILES["h100-sxm"].calibration is None
