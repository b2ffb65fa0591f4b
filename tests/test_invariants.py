"""Invariants of every count, checked with hypothesis on small random models.

- inclusive == self + the inclusive costs of the direct children, for every module;
- batch 2 == 2 x batch 1 for batch-linear models (eval mode);
- two calls inside one Counter == 2 x one call;
- shape-only and meta counts == a real run.
"""

from __future__ import annotations

import copy

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import flopscope
from flopscope import Cost, Report

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mlps(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    sizes = draw(st.lists(st.integers(1, 24), min_size=2, max_size=5))
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers.append(nn.Linear(a, b, bias=draw(st.booleans())))
        layers.append(draw(st.sampled_from([nn.ReLU, nn.GELU, nn.Tanh, nn.Identity]))())
    if draw(st.booleans()):
        layers.append(nn.LayerNorm(sizes[-1]))
    return nn.Sequential(*layers).eval(), torch.randn(1, sizes[0])


@st.composite
def cnns(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor]:
    channels = draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    size = draw(st.integers(8, 16))
    layers: list[nn.Module] = []
    for a, b in zip(channels[:-1], channels[1:], strict=True):
        k = draw(st.sampled_from([1, 3]))
        layers += [nn.Conv2d(a, b, k, padding=k // 2), nn.BatchNorm2d(b), nn.ReLU()]
    if draw(st.booleans()):
        layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels[-1], 3)]
    return nn.Sequential(*layers).eval(), torch.randn(1, channels[0], size, size)


models = st.one_of(mlps(), cnns())


def _arith(c: Cost) -> tuple[int, int]:
    return c.macs, c.flops


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


@SETTINGS
@given(models, st.booleans())
def test_inclusive_is_self_plus_children(case: tuple[nn.Module, torch.Tensor], backward: bool) -> None:
    model, x = case
    report = flopscope.count(model, x, backward=backward, train=backward)
    stats = report.by_module()
    for path, module in stats.items():
        children = [s.inclusive for p, s in stats.items() if p and _parent(p) == path]
        total = module.self_cost
        for c in children:
            total = total + c
        assert total == module.inclusive, path
    assert stats[""].inclusive == report.total()


@SETTINGS
@given(models)
def test_batch_two_is_twice_batch_one(case: tuple[nn.Module, torch.Tensor]) -> None:
    model, x = case
    one = flopscope.count(model, x)
    two = flopscope.count(model, torch.cat([x, x]))
    assert _arith(two.total()) == (2 * one.macs, 2 * one.flops)


def _counter_report(model: nn.Module, x: torch.Tensor, calls: int) -> Report:
    with flopscope.Counter(model, warn=False) as counter:
        for _ in range(calls):
            model(x)
    return counter.report


@SETTINGS
@given(models)
def test_two_calls_in_one_counter_are_twice_one_call(case: tuple[nn.Module, torch.Tensor]) -> None:
    model, x = case
    one, two = _counter_report(model, x, 1), _counter_report(model, x, 2)
    assert two.total() == one.total() * 2
    for path, stats in one.by_module().items():
        assert two.by_module()[path].calls == 2 * stats.calls


@SETTINGS
@given(models, st.booleans())
def test_shape_only_and_meta_equal_real(case: tuple[nn.Module, torch.Tensor], backward: bool) -> None:
    model, x = case
    real = flopscope.count(model, x, backward=backward)
    fake = flopscope.count(model, x, backward=backward, shape_only=True)
    meta_model = copy.deepcopy(model).to("meta")
    meta = flopscope.count(meta_model, x, backward=backward)
    assert real.total() == fake.total() == meta.total()
    assert real.uncounted == fake.uncounted == meta.uncounted == {}
