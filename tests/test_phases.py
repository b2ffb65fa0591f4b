"""The phases of a training step: forward, backward and optimizer (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope import Counter, Phase


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 3)  # 33 parameter elements in 2 tensors
        self.fc2 = nn.Linear(3, 2)  # 8 parameter elements in 2 tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).relu())


X = torch.randn(4, 10)
Y = torch.tensor([0, 1, 1, 0])
ELEMENTS, TENSORS = 33 + 8, 4

# AdamW per parameter element (torch.optim's for-loop and foreach implementations run the same
# operators): param.mul_(1 - lr*wd) 1; exp_avg.lerp_(grad, 1 - beta1) 3 (sub, mul, add);
# exp_avg_sq.mul_(beta2) 1; .addcmul_(grad, grad, value=1 - beta2) 3 (mul, scale, add);
# .sqrt() 1; / sqrt(bias_correction2) 1; .add_(eps) 1; param.addcdiv_(exp_avg, denom, -step) 3
# (divide, scale, add) = 14; plus 1 per parameter tensor for its step counter (step += 1).
ADAMW_PER_ELEMENT = 1 + 3 + 1 + 3 + 1 + 1 + 1 + 3
# SGD without momentum: param.add_(grad, alpha=-lr) = 2 per element (scale, add)
SGD_PER_ELEMENT = 2


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> flopscope.Report:
    with Counter(model) as c:
        loss = nn.functional.cross_entropy(model(X), Y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return c.report


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_step_is_the_optimizer_phase_with_the_hand_count(foreach: bool) -> None:
    model = TwoLayer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=foreach)
    r = _step(model, opt)
    assert r.phases == (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
    assert r.total("optimizer").flops == ADAMW_PER_ELEMENT * ELEMENTS + TENSORS == 578
    assert r.total("optimizer").macs == 0
    # all of it is the root's own work; nothing of the optimizer leaks into forward
    assert set(r.by_module("optimizer")) == {""} or all(
        s.self_cost.flops == 0 for p, s in r.by_module("optimizer").items() if p)
    fwd = r.by_module("forward")
    assert fwd["fc1"].self_cost.macs == 4 * 10 * 3 and fwd["fc2"].self_cost.macs == 4 * 3 * 2
    # root forward: the functional loss only (log_softmax 4*2*... counted by its rules)
    assert "aten.addcdiv_.Scalar" not in {k for k in r.by_op("forward")}
    assert not any("addcdiv" in k or "lerp" in k for k in r.by_op("forward"))


def test_adamw_second_step_costs_the_same() -> None:
    model = TwoLayer()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    _step(model, opt)  # first step creates the state (zeros_like: no FLOPs either way)
    assert _step(model, opt).total("optimizer").flops == 14 * ELEMENTS + TENSORS


def test_sgd_step_and_optimizer_total() -> None:
    model = TwoLayer()
    r = _step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert r.total(Phase.OPTIMIZER).flops == SGD_PER_ELEMENT * ELEMENTS


def test_optimizer_step_outside_a_counter_and_hooks_removed() -> None:
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(X).sum().backward()
    with Counter(model) as c:
        assert len(_global_optimizer_pre_hooks) == 1 and len(_global_optimizer_post_hooks) == 1
    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks
    opt.step()  # not counted, nothing left behind
    assert c.report.total() == flopscope.Cost()


def test_a_failing_step_leaves_no_optimizer_frame() -> None:
    class Broken(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[no-untyped-def, override]
            raise RuntimeError("boom")

    model = TwoLayer()
    opt = Broken(model.parameters(), lr=0.1)
    with Counter(model) as c:
        with pytest.raises(RuntimeError, match="boom"):
            opt.step()
        model(X)  # forward again: must not be taken for optimizer work
    assert c.report.total("optimizer").flops == 0
    assert c.report.by_module("forward")["fc1"].self_cost.macs == 4 * 10 * 3
    assert c.running is None


def test_loss_module_outside_the_model_is_a_top_level_row() -> None:
    # a loss *module* that is not part of the model gets its own row named after its class;
    # a functional loss is the root's own work
    model = TwoLayer()
    loss_fn = nn.CrossEntropyLoss()
    with Counter(model) as c:
        loss_fn(model(X), Y).backward()
    by_f, by_b = c.report.by_module("forward"), c.report.by_module("backward")
    assert by_f["CrossEntropyLoss"].calls == 1
    assert by_f["CrossEntropyLoss"].self_cost.flops > 0
    assert by_f[""].self_cost.flops == 4 * 3  # the root's own relu; nothing of the loss
    assert by_b["CrossEntropyLoss"].self_cost.flops > 0  # its backward too
    with Counter(model) as f:
        nn.functional.cross_entropy(model(X), Y)
    assert (f.report.by_module("forward")[""].self_cost.flops
            == 4 * 3 + by_f["CrossEntropyLoss"].self_cost.flops)


def test_unknown_phase_is_still_a_usage_error() -> None:
    r = flopscope.count(TwoLayer(), X)
    with pytest.raises(flopscope.UsageError, match="unknown phase 'optimiser'"):
        r.total("optimiser")
    assert r.total("optimizer") == flopscope.Cost()


@pytest.mark.parametrize(
    ("make", "per_element"),
    [
        (lambda ps: torch.optim.AdamW(ps, weight_decay=0.01, fused=True), 14),
        (lambda ps: torch.optim.AdamW(ps, weight_decay=0.0, fused=True), 13),
        (lambda ps: torch.optim.Adam(ps, weight_decay=0.1, fused=True), 15),  # grad + wd*param: 2
        (lambda ps: torch.optim.Adam(ps, amsgrad=True, fused=True), 14),  # + maximum
    ],
)
def test_fused_adam_kernels_cost_what_the_for_loop_does(make: Any, per_element: int) -> None:
    model = TwoLayer()
    r = _step(model, make(model.parameters()))
    assert r.uncounted == {}
    # the fused kernel's per-element figure, plus the step counters (a separate _foreach_add_)
    assert r.total("optimizer").flops == per_element * ELEMENTS + TENSORS


@pytest.mark.parametrize("kwargs", [{"weight_decay": 0.0}, {"weight_decay": 0.1},
                                    {"amsgrad": True}, {"maximize": True}])
def test_fused_adam_equals_the_for_loop(kwargs: dict[str, Any]) -> None:
    def total(**extra: Any) -> int:
        model = TwoLayer()
        return _step(model, torch.optim.Adam(model.parameters(), **kwargs, **extra)).total(
            "optimizer").flops

    assert total(fused=True) == total(foreach=False) == total(foreach=True)
