"""Parameter counts: exact values on small models, and the linear-time table against the definition.

The definition (``_reference``) is the straightforward quadratic one: for every module, the distinct
parameters of ``module.parameters()`` and buffers of ``module.buffers()``; ``own`` counts the
parameters registered directly on the module that no earlier module (in ``named_modules()`` order)
registered first.
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from flopscope.params import ParamStats, count_params, param_table


def _reference(model: nn.Module) -> dict[str, ParamStats]:
    owner: dict[int, str] = {}
    for path, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), path)
    stats = {}
    for path, module in model.named_modules():
        params = {id(p): p for p in module.parameters()}
        trainable = sum(p.numel() for p in params.values() if p.requires_grad)
        frozen = sum(p.numel() for p in params.values() if not p.requires_grad)
        stats[path] = ParamStats(
            own=sum(p.numel() for p in module.parameters(recurse=False) if owner[id(p)] == path),
            inclusive=trainable + frozen, trainable=trainable, frozen=frozen,
            buffers=sum(b.numel() for b in {id(b): b for b in module.buffers()}.values()),
        )
    return stats


class _Tied(nn.Module):
    """An embedding whose weight the output head shares (as GPT-2 and many LMs do)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


class _SharedModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        self.a = shared
        self.b = nn.Sequential(shared, nn.Linear(3, 2))


class _SharedBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Linear(2, 2)
        self.y = nn.Linear(2, 2)
        table = torch.zeros(5)
        self.x.register_buffer("table", table)
        self.y.register_buffer("table", table)


def _frozen() -> nn.Module:
    m = nn.Sequential(nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    m[0].requires_grad_(False)
    return m


@pytest.mark.parametrize(
    "build",
    [_Tied, _SharedModule, _SharedBuffer, _frozen, torchvision.models.resnet18,
     torchvision.models.mobilenet_v3_small],
)
def test_table_matches_definition(build: type[nn.Module]) -> None:
    model = build()
    assert count_params(model) == _reference(model)


def test_tied_weight_owned_once() -> None:
    model = _Tied()
    stats, owners = param_table(model)
    # embed 10*4 = 40 (also the head's weight), body 4*4+4 + 4+4 = 28
    assert stats[""].inclusive == 40 + 28
    assert stats["embed"].own == 40 and stats["head"].own == 0 and stats["head"].inclusive == 40
    assert owners[id(model.head.weight)] == "embed"


def test_shared_module_counted_once_in_each_subtree() -> None:
    stats = count_params(_SharedModule())
    # shared: Linear(3,3) 12 + BatchNorm1d 6 params (+ 3 + 3 + 1 buffers); Linear(3,2) 8
    assert stats[""].inclusive == 12 + 6 + 8
    assert stats["b"].inclusive == 12 + 6 + 8
    assert stats["a"].inclusive == 18 and stats[""].buffers == 7


def test_frozen_and_trainable_split() -> None:
    stats = count_params(_frozen())
    # frozen Linear(4,3): 15; trainable Linear(3,3) 12 + BatchNorm1d 6
    assert (stats[""].frozen, stats[""].trainable) == (15, 18)
