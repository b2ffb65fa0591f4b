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


def _profiler_peak_above_start(fn: object) -> int:
    """The most bytes allocated and not yet freed at once while ``fn()`` runs, from
    torch.profiler's allocation events in time order (every CPU allocation, kernel scratch
    included): an independent measurement of the same run."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    assert callable(fn)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas: list[tuple[int, int]] = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.tag == _EventType.Allocation:
            deltas.append((node.start_time_ns, node.extra_fields.alloc_size))
        todo.extend(node.children)
    current = peak = 0
    for _, delta in sorted(deltas):
        current += delta
        peak = max(peak, current)
    return peak


def test_matrix_product_layout_copy_is_workspace() -> None:
    """The gradient of ``out.sum()`` is an expanded tensor (strides (0, 0)); the backward of
    ``mm`` hands it to BLAS, which takes only row- or column-major matrices, so ATen copies it
    to a dense (64, 4096) matrix while the call runs (``addmm_impl_cpu_``)."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4096, bias=False)
    x = torch.randn(64, 16)
    _, mem = peak_memory(model, x, train=True, optimizer=None)
    # weight 4096*16*4 = 262,144; input 64*16*4 = 4,096; in the backward mm: the weight's
    # gradient (262,144) and the copy of the expanded output gradient 64*4096*4 = 1,048,576;
    # the loss and its seed gradient, 4 B each. The forward holds only 1,048,576 of output.
    assert mem.at_peak == {"parameters": 262_144, "inputs": 4_096, "gradients": 262_144,
                           "activations": 8, "workspace": 1_048_576}
    assert mem.peak_bytes == 1_576_968
    assert (mem.peak_phase, mem.peak_op) == ("backward", "aten.mm.default")
    _, meta = peak_memory(model, x, train=True, optimizer=None, shape_only=True)
    assert meta.at_peak == mem.at_peak

    def step() -> None:
        model(x).sum().backward()

    measured = _profiler_peak_above_start(step)
    model.weight.grad = None
    assert 262_144 + 4_096 + measured == mem.peak_bytes


def test_blas_ready_operands_are_not_copied() -> None:
    from flopscope.cost import OpCall, Phase
    from flopscope.estimate.memory import layout_copy_bytes

    a = torch.randn(8, 4)
    b = torch.randn(6, 4).t()  # column-major (strides (1, 4)): BLAS takes it transposed
    mm = torch.ops.aten.mm.default

    def copied(x: torch.Tensor, y: torch.Tensor) -> int:
        return layout_copy_bytes(OpCall(mm, (x, y), {}, mm(x, y), Phase.FORWARD, False))

    assert copied(a, b) == 0
    assert copied(a[:, ::2], b[::2]) == 8 * 2 * 4 + 2 * 6 * 4  # steps of 2: both copied
    assert copied(a, torch.ones(4, 1).expand(4, 6)) == 4 * 6 * 4  # stride 0
    add = torch.ops.aten.add.Tensor
    assert layout_copy_bytes(OpCall(add, (a, a), {}, a + a, Phase.FORWARD, False)) == 0
