"""A real call's key found again from a template of an earlier call in the same module
(flopscope.core.call_guards): always the key cost_key makes, and found again when the call is
the same but for its tensors' values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

import flopscope
from flopscope.core import call_guards
from flopscope.core.call_guards import call_key
from flopscope.core.cost_memo import cost_key

aten = torch.ops.aten
pytestmark = pytest.mark.skipif(call_guards.TensorGuards is None,
                                reason="this torch has no C tensor guard")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    call_guards.forget_templates()
    yield
    call_guards.forget_templates()


def _key(func: Any, module: object, args: tuple[Any, ...], out: Any,
         kwargs: dict[str, Any] | None = None) -> list[Any] | None:
    """call_key's cell, checked against cost_key's key."""
    kwargs = kwargs or {}
    cell = call_key(func, module, args, kwargs, out)
    expected = cost_key(id(func), args, kwargs, out)
    assert (cell[0] if cell is not None else None) == expected
    return cell


def test_the_same_call_again_is_found_from_its_template() -> None:
    where = object()
    x, w = torch.randn(1, 4, 8, 8), nn.Parameter(torch.randn(4, 4, 3, 3))
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    first = _key(aten.convolution.default, where, args, aten.convolution.default(*args))
    x2 = torch.randn(1, 4, 8, 8)  # other values, same metadata
    args2 = (x2, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    again = _key(aten.convolution.default, where, args2, aten.convolution.default(*args2))
    assert again is first  # the template's cell
    elsewhere = _key(aten.convolution.default, object(), args2, aten.convolution.default(*args2))
    assert elsewhere is not first  # another module: its own template


def test_in_place_calls_and_tuples_returned_are_found_again() -> None:
    where = object()
    cells = [_key(aten.relu_.default, where, (x,), aten.relu_.default(x))
             for x in (torch.randn(3, 4), torch.randn(3, 4))]
    assert cells[0] is cells[1]
    bn = aten.native_batch_norm.default
    w, b = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))
    cells = []
    for _ in range(2):
        args = (torch.randn(2, 4, 3, 3), w, b, torch.zeros(4), torch.ones(4), False, 0.1, 1e-5)
        cells.append(_key(bn, where, args, bn(*args)))
    assert cells[0] is cells[1]


def _variants() -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    x = torch.randn(3, 4)
    y = torch.randn(3, 4)
    return [
        ("another tensor", aten.mul.Tensor, (torch.randn(3, 4), 2), {}),
        ("a float scalar", aten.mul.Tensor, (x, 2.0), {}),
        ("a bool scalar", aten.mul.Tensor, (x, True), {}),
        ("a tensor where a scalar was", aten.mul.Tensor, (x, torch.tensor(2)), {}),
        ("a one-element tensor", aten.mul.Tensor, (x, torch.tensor([2])), {}),
        ("a second tensor", aten.mul.Tensor, (x, y), {}),
        ("the same tensor twice", aten.mul.Tensor, (x, x), {}),
        ("strides", aten.mul.Tensor, (x.t().contiguous().t(), 2), {}),
        ("a transposed view", aten.mul.Tensor, (y.t(), 2), {}),
        ("dtype", aten.mul.Tensor, (x.double(), 2), {}),
        ("requires_grad", aten.mul.Tensor, (x.clone().requires_grad_(), 2), {}),
        ("a parameter", aten.mul.Tensor, (nn.Parameter(x.clone()), 2), {}),
        ("meta", aten.mul.Tensor, (x.to("meta"), 2), {}),
        ("sparse", aten.mul.Tensor, (x.to_sparse(), 2), {}),
        ("another shape", aten.mul.Tensor, (torch.randn(4, 3), 2), {}),
    ]


@pytest.mark.parametrize("name", [v[0] for v in _variants()])
def test_a_call_that_differs_gets_its_own_key(name: str) -> None:
    where = object()
    x = torch.randn(3, 4)
    first = _key(aten.mul.Tensor, where, (x, 2), x * 2)
    _, func, args, kwargs = next(v for v in _variants() if v[0] == name)
    with torch.no_grad():
        out = func(*args, **kwargs)
    cell = _key(func, where, args, out, kwargs)  # (equal to cost_key's, or None)
    if name == "another tensor":
        assert cell is first
    else:  # its own key, or the same key from its own template (requires_grad, a parameter)
        assert cell is not first
    # and the first call's template still answers for the first call's kind (unless the place
    # now keys every call directly: a tensor passed twice has no template)
    x3 = torch.randn(3, 4)
    again = _key(aten.mul.Tensor, where, (x3, 2), x3 * 2)
    assert (again is first) is (name != "the same tensor twice")


def test_lists_keywords_and_optional_tensors() -> None:
    where = object()
    x = torch.randn(6, 4)
    size = [4, 6]
    first = _key(aten.view.default, where, (x, size), x.view(size))
    size[0] = 2  # the caller changes its list: the template kept a copy
    size[1] = 12
    _key(aten.view.default, where, (x, size), x.view(size))
    assert _key(aten.view.default, where, (x, [4, 6]), x.view(4, 6)) is first
    empty = aten.empty.memory_format
    for dtype in (torch.uint8, torch.float32, torch.uint8):
        kw = {"dtype": dtype, "layout": torch.strided, "device": torch.device("cpu")}
        _key(empty, where, ([0],), empty([0], **kw), kw)
    conv = aten.convolution.default
    w, b = torch.randn(4, 4, 1, 1), torch.randn(4)
    x = torch.randn(1, 4, 2, 2)
    for bias in (None, b, None, b):  # a module that calls it with and without a bias
        args = (x, w, bias, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        _key(conv, where, args, conv(*args))


def test_a_place_with_more_call_shapes_than_kept_keys_every_call() -> None:
    where = object()
    for n in [*range(1, 8), *range(1, 8)]:
        x = torch.randn(n, 2)
        _key(aten.relu.default, where, (x,), x.relu())


def test_counts_with_templates_equal_counts_without(monkeypatch: pytest.MonkeyPatch) -> None:
    from flopscope.core import recorder

    model = torchvision.models.get_model("mobilenet_v3_small", weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    with monkeypatch.context() as m:
        m.setattr(recorder, "call_key", lambda *args: None)  # every call costed by its rule
        plain = flopscope.count(model, x, warn=False).to_dict()
    found = []
    original = call_guards._template

    def spy(*args: Any) -> Any:
        found.append(1)
        return original(*args)

    monkeypatch.setattr(call_guards, "_template", spy)
    reports = [flopscope.count(model, x, warn=False).to_dict() for _ in range(3)]
    assert all(r == plain for r in reports)
    assert found and len(found) < 3 * len(plain["records"])  # templates were made, then used


def test_a_guard_that_cannot_be_built_keys_the_call_directly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a torch whose guard takes other arguments raises when it is built: the call is keyed by
    # cost_key every time (a fresh cell, never a template's), never an error from the count
    def refuses(*tensors: Any, **kwargs: Any) -> Any:
        raise TypeError("TensorGuards() got an unexpected keyword argument")

    monkeypatch.setattr(call_guards, "TensorGuards", refuses)
    where, x = object(), torch.randn(3, 4)
    cells = [_key(aten.relu.default, where, (x,), aten.relu.default(x)) for _ in range(2)]
    assert cells[0] is not None and cells[1] is not None and cells[0] is not cells[1]
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    report = flopscope.count(model, torch.randn(2, 4))
    assert report.macs == 2 * 4 * 3  # (batch 2 x in 4 x out 3)
