"""A user's own dispatch mode around ``flopscope.count`` sees the operator calls of the model,
exactly those of a plain forward (and backward), and none of flopscope's bookkeeping: the aliases
and copies that put the model back, the meta copies of a shape-only run, a rule's own work."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import flopscope


class _Log(TorchDispatchMode):
    """Every operator call that reaches this mode, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _seen(fn: Any) -> list[str]:
    with _Log() as log:
        fn()
    return log.calls


def test_a_users_mode_sees_the_forward_and_nothing_else() -> None:
    model, x = _model(), torch.randn(3, 4)
    for train in (False, True):  # training: batch norm updates buffers, which count puts back
        model.train(train)
        plain = _seen(lambda: model(x))
        assert len(plain) >= 6
        assert _seen(lambda: flopscope.count(model, x)) == plain
        assert _seen(lambda: flopscope.count(model, x, shape_only=True)) == plain


def test_a_users_mode_sees_the_backward_and_nothing_else() -> None:
    model, x = _model().eval(), torch.randn(3, 4)
    params = [p for p in model.parameters() if p.requires_grad]

    def plain_step() -> None:
        out = model(x)
        torch.autograd.grad([out], params, grad_outputs=[torch.ones_like(out)], allow_unused=True)

    plain = _seen(plain_step)
    assert any("mm" in call for call in plain[6:])  # the backward's products are there
    assert _seen(lambda: flopscope.count(model, x, backward=True)) == plain


def test_a_rules_own_work_is_not_seen() -> None:
    # the rule of a dynamically quantized linear layer unpacks its packed weight
    model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(4, 8)), {nn.Linear})
    x = torch.randn(3, 4)
    plain = _seen(lambda: model(x))
    assert plain == ["quantized.linear_dynamic.default"]
    assert _seen(lambda: flopscope.count(model, x)) == plain
