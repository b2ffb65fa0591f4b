"""The parallelism frameworks' host time (issue 29, host time; issue 31, the planner's step):
DTensor's per operator (and per point-wise operator) and FSDP2's per collective, measured by a calibration on a fake process
group and kept in the profile file."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from flopscope.errors import UsageError
from flopscope.estimate.calibration import Calibration
from flopscope.estimate.framework import framework_costs


def test_framework_costs_are_measured_and_leave_no_process_group() -> None:
    torch.set_num_threads(1)
    dtensor_s, pointwise_s, fsdp_s = framework_costs(time.thread_time, samples=3)
    # DTensor's dispatch and FSDP2's hooks are Python: microseconds to milliseconds each
    assert 1e-6 < dtensor_s < 1e-2 and 1e-6 < pointwise_s < 1e-2 and 1e-6 < fsdp_s < 1e-1
    # like-sharded point-wise operators skip what a TP block's operators pay (sharding
    # propagated anew for their placements, redistributions): here 11-14 us against 65-75 us
    assert pointwise_s < dtensor_s
    assert not dist.is_initialized()


def test_inside_a_process_group_nothing_is_measured() -> None:
    from flopscope.distributed.world import fake_world

    with fake_world(2, 0):  # a fake group would replace the user's
        assert framework_costs(time.thread_time, samples=1) == (0.0, 0.0, 0.0)


def test_the_costs_round_trip_and_bad_ones_are_clear_errors() -> None:
    cal = Calibration("d", "cpu", 1, dtensor_call_s=7e-5, dtensor_pointwise_s=1.2e-5,
                      fsdp_collective_s=3e-4)
    again = Calibration.from_dict(cal.to_dict())
    assert (again.dtensor_call_s, again.dtensor_pointwise_s, again.fsdp_collective_s) == \
        (7e-5, 1.2e-5, 3e-4)
    old = cal.to_dict()
    del old["dtensor_call_s"], old["dtensor_pointwise_s"], old["fsdp_collective_s"]
    assert Calibration.from_dict(old).dtensor_call_s == 0.0  # files before: not modelled
    assert Calibration.from_dict(old).dtensor_pointwise_s == 0.0
    with pytest.raises(UsageError, match="cpu.json: calibration: fsdp_collective_s must not be negative"):
        Calibration.from_dict({**cal.to_dict(), "fsdp_collective_s": -1}, where="cpu.json")
    with pytest.raises(UsageError, match="dtensor_call_s must be a number of seconds, not 'x'"):
        Calibration.from_dict({**cal.to_dict(), "dtensor_call_s": "x"}, where="cpu.json")


def test_observers_see_each_outermost_dtensor_operator() -> None:
    import warnings

    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    import flopscope
    from flopscope.distributed.world import fake_world

    class Seen:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, str, bool]] = []

        def on_call(self, *_: object) -> None:
            pass

        def on_dtensor_call(self, path: str, phase: object, op: str, pointwise: bool) -> None:
            self.calls.append((path, getattr(phase, "value", ""), op, pointwise))

    with fake_world(2, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        parallelize_module(model, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel(
            use_local_output=False)})
        seen = Seen()
        flopscope.count(model, torch.randn(4, 8), observers=[seen], backward=True)
    # forward: linear is t(weight) and addmm on DTensors, then the ReLU on its sharded output
    # (point-wise), which autograd saves (detach), and the backward's seed (ones_like);
    # backward (the input needs no gradient): the saved output again and the ReLU's gradient
    # (point-wise), the weight's gradient mm between two transposes, the bias's sum and its view
    assert seen.calls == [
        ("0", "forward", "aten.t.default", False), ("0", "forward", "aten.addmm.default", False),
        ("1", "forward", "aten.relu.default", True), ("1", "forward", "aten.detach.default", False),
        ("", "forward", "aten.ones_like.default", False),
        ("1", "backward", "aten.detach.default", False),
        ("1", "backward", "aten.threshold_backward.default", True),
        ("0", "backward", "aten.t.default", False), ("0", "backward", "aten.mm.default", False),
        ("0", "backward", "aten.t.default", False),
        ("0", "backward", "aten.sum.dim_IntList", False),
        ("0", "backward", "aten.view.default", False), ("0", "backward", "aten.t.default", False)]


def test_a_point_wise_dtensor_call_takes_its_figure_or_else_the_general_one() -> None:
    from flopscope.estimate.calibration import DTENSOR_DISPATCH, DTENSOR_POINTWISE
    from flopscope.estimate.call_record import CallRecord
    from flopscope.estimate.predict import Predictor

    both = Calibration("d", "cpu", 1, dtensor_call_s=7e-5, dtensor_pointwise_s=1.2e-5)
    older = Calibration("d", "cpu", 1, dtensor_call_s=7e-5)  # no point-wise figure measured
    for op, cal, seconds in ((DTENSOR_DISPATCH, both, 7e-5), (DTENSOR_POINTWISE, both, 1.2e-5),
                             (DTENSOR_POINTWISE, older, 7e-5)):
        got = Predictor(cal).call(CallRecord("0", "optimizer", op, 0, 0, 0, None), 0.0)
        assert (got.family, got.host_s, got.device_s) == ("framework", seconds, 0.0), op
