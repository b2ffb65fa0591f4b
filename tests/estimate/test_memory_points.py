"""MemoryTracker.call_points(): the live bytes at every operator call, by category."""

from __future__ import annotations

import torch
from torch import nn

import flopscope
from flopscope.estimate import MemoryTracker


def test_call_points_are_the_live_bytes_at_each_call() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    x = torch.randn(4, 256)
    tracker = MemoryTracker()
    tracker.register(model.parameters(), "parameters")
    tracker.register([x], "inputs")
    with torch.no_grad(), flopscope.Counter(model, warn=False, observers=[tracker]):
        model(x)
    profile = tracker.profile()
    points = tracker.call_points()
    # parameters 2 x (256*256 + 256) x 4 B = 526,336; input 4 x 256 x 4 = 4,096; each
    # activation 4,096: linear 0 (its output), relu (its input and output), linear 2 (relu's
    # output and its own; linear 0's was freed)
    base = {"parameters": 526_336, "inputs": 4_096}
    totals = [sum(p.live.values()) for p in points]
    assert [(p.module, p.phase) for p in points if p.op == "aten.relu.default"] == [
        ("1", "forward")]
    relu = next(p for p in points if p.op == "aten.relu.default")
    assert {c: v for c, v in relu.live.items() if v} == {**base, "activations": 8_192}
    # the tracker's peak is the first call at the most live bytes
    first = totals.index(max(totals))
    assert max(totals) == profile.peak_bytes == 538_624
    assert (points[first].module, points[first].phase, points[first].op) == (
        profile.peak_module, profile.peak_phase, profile.peak_op)
    assert {c: v for c, v in points[first].live.items() if v} == profile.at_peak


def test_a_storage_regrown_outside_operators_is_a_point_of_its_own() -> None:
    # FSDP2 gathers a layer's parameters again for backward with storage.resize_(size), outside
    # any operator: the tracker's peak can be reached there (op "resize_"), so the call points
    # have that moment too, after the call before it and before the call after it
    tracker = MemoryTracker()
    with flopscope.Counter(warn=False, observers=[tracker]):
        a = torch.zeros(1000)  # 4,000 B
        b = a + 1  # 4,000 B: 8,000 live
        a.untyped_storage().resize_(0)  # freed: 4,000 live
        c = b * 2  # 4,000 B: 8,000 live
        a.untyped_storage().resize_(4000 * 3)  # allocated again, 12,000 B: 20,000 live
        b.add_(1)  # in place: 20,000 live
    profile = tracker.profile()
    points = tracker.call_points()
    assert [(p.op, sum(p.live.values())) for p in points] == [
        ("aten.zeros.default", 4_000), ("aten.add.Tensor", 8_000), ("aten.mul.Tensor", 8_000),
        ("resize_", 20_000), ("aten.add_.Tensor", 20_000)]
    # the peak is the regrowth, as the tracker's own; the first point at the most live bytes
    assert (profile.peak_bytes, profile.peak_op) == (20_000, "resize_")
    del a, b, c
