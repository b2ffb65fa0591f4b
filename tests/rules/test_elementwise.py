"""Element-wise arithmetic and activations: FLOPs per output element."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rules._util import count, leaf, op

X = torch.randn(3, 4)  # 12 elements


def test_add_broadcasts_and_alpha() -> None:
    cost = op(count(lambda: X + torch.randn(4)), "aten.add.Tensor")
    assert cost.flops == 12  # one add per output element
    assert (cost.bytes_read, cost.bytes_written) == ((12 + 4) * 4, 12 * 4)
    assert op(count(lambda: torch.add(X, X, alpha=2)), "aten.add.Tensor").flops == 2 * 12


@pytest.mark.parametrize(
    ("fn", "name", "per_element"),
    [
        (lambda x: x * x, "aten.mul.Tensor", 1),
        (torch.relu, "aten.relu.default", 1),
        (torch.exp, "aten.exp.default", 1),
        (torch.sigmoid, "aten.sigmoid.default", 4),  # neg, exp, add, divide
        (F.silu, "aten.silu.default", 5),  # sigmoid 4 + multiply
        (F.gelu, "aten.gelu.default", 5),  # erf form
        (lambda x: F.gelu(x, approximate="tanh"), "aten.gelu.default", 9),
        (F.leaky_relu, "aten.leaky_relu.default", 2),
        (lambda x: x.clamp(-1, 1), "aten.clamp.default", 2),  # one compare per bound
        (lambda x: x.clamp(min=0), "aten.clamp.default", 1),
    ],
)
def test_per_element(fn: object, name: str, per_element: int) -> None:
    assert op(count(lambda: fn(X)), name).flops == per_element * 12  # type: ignore[operator]


def test_where_is_zero_flops_but_moves_bytes() -> None:
    cost = op(count(lambda: torch.where(X > 0, X, 0.0)), "aten.where.self")
    assert cost.flops == 0
    assert cost.bytes_written == 12 * 4


def test_activation_backward() -> None:
    x = leaf(3, 4)
    report = count(lambda: torch.sigmoid(x), backward=True)
    assert op(report, "aten.sigmoid_backward.default", "backward").flops == 3 * 12  # g*y*(1-y)
    report = count(lambda: F.gelu(x), backward=True)
    assert op(report, "aten.gelu_backward.default", "backward").flops == 9 * 12


def test_dropout_train_and_eval() -> None:
    x = torch.randn(3, 4)
    # without autograd the CPU decomposes dropout: bernoulli_ (0), mask / (1 - p), x * mask
    assert count(lambda: F.dropout(x, 0.5, training=True)).flops == 2 * 12
    report = count(lambda: F.dropout(leaf(3, 4), 0.5, training=True))
    assert report.flops == 2 * 12  # native_dropout (with autograd): the same 2 per element
    assert count(lambda: F.dropout(x, 0.5, training=False)).flops == 0


def test_silu_and_mish_backward() -> None:
    x = leaf(3, 4)  # 12 elements
    report = count(lambda: F.silu(x), backward=True)
    # g * s * (1 + x*(1-s)), s = sigmoid(x): sigmoid 4 (neg, exp, add, divide)
    # + 1-s, x*(1-s), 1+..., s*(...), g*(...) 5 = 9 per element: 9 * 12 = 108
    assert op(report, "aten.silu_backward.default", "backward").flops == 108
    report = count(lambda: F.mish(x), backward=True)
    # g * (t + x*s*(1 - t*t)), s = sigmoid(x) (4), t = tanh(softplus(x)) (3 + 1)
    # + t*t, 1-..., x*s, *(...), t+..., g*(...) 6 = 14 per element: 14 * 12 = 168
    assert op(report, "aten.mish_backward.default", "backward").flops == 168


def test_gcd_lcm_are_integer_work() -> None:
    a, b = torch.tensor([12, 18, 7]), torch.tensor([8, 27, 5])
    report = count(lambda: (torch.gcd(a, b), torch.lcm(a, b)))
    # counted by their own rules (not by a decomposition into prims with no rule), integer: 0
    assert report.uncounted == {} and report.decomposed == {}
    for name in ("aten.gcd.default", "aten.lcm.default"):
        assert op(report, name).flops == 0
        assert op(report, name).bytes_written == 3 * 8


def test_an_operator_that_returns_nothing_writes_its_written_arguments() -> None:
    """``_foreach_mul_`` returns nothing: its writes are the list it updates (they counted 0),
    as ``mul_``'s are the tensor it returns."""
    a, b = torch.ones(10), torch.ones(6)
    # read a and b (16 float32: 64 bytes), written the same 64; 1 FLOP per element
    c = op(count(lambda: torch._foreach_mul_([a, b], 2.0)), "aten._foreach_mul_.Scalar")
    assert (c.flops, c.bytes_read, c.bytes_written) == (16, 64, 64)
    # the for-loop's equivalent, for comparison: the same bytes in two calls
    c = op(count(lambda: [t.mul_(2.0) for t in (a, b)]), "aten.mul_.Tensor")
    assert (c.flops, c.bytes_read, c.bytes_written) == (16, 64, 64)
    # an operator that returns its result writes its output, not its argument
    c = op(count(lambda: torch._foreach_mul([a, b], 2.0)), "aten._foreach_mul.Scalar")
    assert (c.bytes_read, c.bytes_written) == (64, 64)
