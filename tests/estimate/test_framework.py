"""The parallelism frameworks' host time (issue 29, host time; issue 31, the planner's step):
DTensor's per operator and FSDP2's per collective, measured by a calibration on a fake process
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
    dtensor_s, fsdp_s = framework_costs(time.thread_time, samples=3)
    # DTensor's dispatch and FSDP2's hooks are Python: microseconds to milliseconds each
    assert 1e-6 < dtensor_s < 1e-2 and 1e-6 < fsdp_s < 1e-1
    assert not dist.is_initialized()


def test_inside_a_process_group_nothing_is_measured() -> None:
    from flopscope.distributed.world import fake_world

    with fake_world(2, 0):  # a fake group would replace the user's
        assert framework_costs(time.thread_time, samples=1) == (0.0, 0.0)


def test_the_costs_round_trip_and_bad_ones_are_clear_errors() -> None:
    cal = Calibration("d", "cpu", 1, dtensor_call_s=7e-5, fsdp_collective_s=3e-4)
    again = Calibration.from_dict(cal.to_dict())
    assert (again.dtensor_call_s, again.fsdp_collective_s) == (7e-5, 3e-4)
    old = cal.to_dict()
    del old["dtensor_call_s"], old["fsdp_collective_s"]
    assert Calibration.from_dict(old).dtensor_call_s == 0.0  # files before: not modelled
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
            self.calls: list[tuple[str, str, str]] = []

        def on_call(self, *_: object) -> None:
            pass

        def on_dtensor_call(self, path: str, phase: object, op: str) -> None:
            self.calls.append((path, getattr(phase, "value", ""), op))

    with fake_world(2, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nn.Linear(8, 8))
        parallelize_module(model, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel()})
        seen = Seen()
        flopscope.count(model, torch.randn(4, 8), observers=[seen], backward=True)
    # forward: linear is t(weight) and addmm on DTensors; backward (the input needs no
    # gradient): the weight's gradient mm between two transposes, the bias's sum and its view
    assert seen.calls == [
        ("0", "forward", "aten.t.default"), ("0", "forward", "aten.addmm.default"),
        ("0", "backward", "aten.t.default"), ("0", "backward", "aten.mm.default"),
        ("0", "backward", "aten.t.default"), ("0", "backward", "aten.sum.dim_IntList"),
        ("0", "backward", "aten.view.default"), ("0", "backward", "aten.t.default")]
