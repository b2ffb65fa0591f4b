"""Peak memory from storage lifetimes: exact small cases, views, training, shape-only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import MemoryTracker, peak_memory


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


def test_inference_peak_is_exact() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, mem = peak_memory(model, x)
    # parameters 2 x (256*256 + 256) x 4 B = 526,336; input 4*256*4 = 4,096.
    # relu: its input (linear 0's output, 4,096) and its output (4,096) are both live;
    # linear 2: relu's output and its own output (linear 0's was freed): 2 x 4,096 either way.
    assert mem.at_peak == {"parameters": 526_336, "inputs": 4_096, "activations": 8_192}
    assert mem.peak_bytes == 526_336 + 4_096 + 8_192 == 538_624
    assert mem.peak_phase == "forward" and mem.peak_module == "1"
    assert mem.by_module["1"] == 538_624 and mem.by_module[""] == 538_624


def test_views_share_storage_and_inplace_allocates_nothing() -> None:
    tracker = MemoryTracker()
    x = torch.randn(1024)  # 4,096 B, registered as an input
    tracker.register([x], "inputs")
    with flopscope.Counter(warn=False, observers=[tracker]):
        y = x.view(32, 32).t()  # views: no storage
        z = y + 1  # 4,096 B
        z.mul_(2)  # in place: nothing new
        del z  # freed
        w = x * 3  # 4,096 B
    mem = tracker.profile()
    assert mem.peak_bytes == 8_192
    assert mem.end_bytes == 8_192
    del w


def test_register_rejects_unknown_category() -> None:
    with pytest.raises(ValueError, match="unknown memory category 'weights'"):
        MemoryTracker().register([], "weights")


def test_training_step_categories() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    before = [p.detach().clone() for p in model.parameters()]
    _, mem = peak_memory(model, x, train=True, optimizer="sgd")
    # SGD with momentum: one buffer per parameter; gradients as large as the parameters
    assert mem.at_peak["parameters"] == 526_336
    assert mem.at_peak["gradients"] == 526_336
    assert mem.at_peak["optimizer_state"] == 526_336
    assert mem.train and "SGD" in mem.note
    # the model is left as it was
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert model.training


def test_shape_only_training_matches_real() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, real = peak_memory(model, x, train=True, optimizer="adamw")
    report, meta = peak_memory(model, x, train=True, optimizer="adamw", shape_only=True)
    assert meta.peak_bytes == real.peak_bytes
    assert meta.at_peak == real.at_peak
    assert report.shape_only
    assert next(model.parameters()).device.type == "cpu"


def test_shape_only_inference_matches_real() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, real = peak_memory(model, x)
    _, fake = peak_memory(model, x, shape_only=True)
    assert fake.peak_bytes == real.peak_bytes


def test_adamw_state_is_twice_the_parameters() -> None:
    _, mem = peak_memory(_mlp(), torch.randn(4, 256), train=True, optimizer="adamw")
    # exp_avg and exp_avg_sq per parameter (526,336 each) + one 4-byte step counter per
    # parameter tensor (4 tensors)
    assert mem.at_peak["optimizer_state"] == 2 * 526_336 + 4 * 4


def test_bad_optimizer() -> None:
    with pytest.raises(UsageError, match="unknown optimizer 'lion'"):
        peak_memory(_mlp(), torch.randn(1, 256), train=True, optimizer="lion")
