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

from flopscope.core.params import ParamStats, count_params, param_table


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


def _lazy_model() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("shape_only", [False, True])
def test_lazy_modules_counted_as_after_their_first_forward_and_left_lazy(shape_only: bool) -> None:
    import flopscope

    model = _lazy_model()
    report = flopscope.count(model, torch.randn(3, 5), shape_only=shape_only, warn=False)
    # LazyLinear infers in_features = 5: 3 rows x 5 x 8 + 3 x 8 x 2 = 120 + 48 MACs;
    # parameters (5 x 8 + 8) + (8 x 2 + 2) = 48 + 18
    assert report.macs == 168
    assert report.module_params[""].inclusive == 66
    assert report.module_params["0"].own == 48
    # the model is left as it was: still lazy, its parameter uninitialised
    assert type(model[0]) is nn.LazyLinear
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


def test_lazy_modules_under_a_counter_get_their_parameters_once_initialised() -> None:
    import flopscope

    model = _lazy_model()
    assert count_params(model)[""].inclusive == 18  # only the plain Linear has a size yet
    with flopscope.Counter(model, warn=False) as counter:
        model(torch.randn(3, 5))  # the user's own forward initialises the lazy layer
    assert counter.report.macs == 168
    assert counter.report.module_params[""].inclusive == 66


def test_a_lazy_model_whose_initialising_forward_fails_says_so() -> None:
    import flopscope
    from flopscope.errors import ForwardError

    with pytest.raises(ForwardError, match=r"lazy modules that are not initialised yet \('0'\)"):
        flopscope.count(_lazy_model(), torch.randn(3, 5, 7), torch.randn(1), warn=False)


def test_quantized_recurrent_layers_count_their_packed_weights() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.ao.quantization import quantize_dynamic

        lstm = nn.LSTM(16, 32, num_layers=2)
        q = quantize_dynamic(nn.Sequential(lstm), {nn.LSTM}, dtype=torch.qint8)
    # per layer 4 gates x 32 x (input + 32) weights + 2 x 4 x 32 biases:
    # 4·32·48 + 256 = 6,400 and 4·32·64 + 256 = 8,448; the float model's 14,848
    assert count_params(nn.Sequential(lstm))[""].inclusive == 14_848
    stats = count_params(q)
    assert stats[""].inclusive == stats[""].frozen == 14_848
    assert stats["0._all_weight_values.0"].own == 6_400
