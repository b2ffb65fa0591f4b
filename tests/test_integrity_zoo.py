"""A real count in training mode leaves every parameter and buffer bitwise as it was, across the
module types of every torchvision classifier family and of three transformers architectures
(BERT, GPT-2, Llama: dropout, batch norm, running statistics, batch counters, position buffers).

The check does not look at operator schemas nor at which tensors flopscope chose to copy: each
model's parameters and buffers are copied before the count and compared byte for byte after it,
so a write that copy on write (:mod:`flopscope.core.integrity`) does not see shows up here. A
plain forward of a copy of each model with batch norm shows that its buffers would have changed.
A few families run in the fast tier; the whole sweep, forward and forward + backward, is the
slow tier (``FLOPSCOPE_SLOW=1``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

import pytest
import torch
import torchvision
from torch import nn
from torchvision import models as tv

from flopscope import count

Build = Callable[[], nn.Module]


def _maxvit() -> nn.Module:
    # maxvit_t's blocks at a 64 x 64 input: 64 / 32 = 2, so windows and grids of 2 (maxvit_t
    # fixes 7 for 224 x 224)
    from torchvision.models.maxvit import MaxVit

    return MaxVit(input_size=(64, 64), stem_channels=64, partition_size=2,
                  block_channels=[64, 128, 256, 512], block_layers=[2, 2, 5, 2], head_dim=32,
                  stochastic_depth_prob=0.2, num_classes=10)


# family (a prefix of torchvision's model names) -> (builder, image side)
TORCHVISION: dict[str, tuple[Build, int]] = {
    "alexnet": (lambda: tv.alexnet(num_classes=10), 64),
    "convnext": (lambda: tv.convnext_tiny(num_classes=10), 32),
    "densenet": (lambda: tv.densenet121(num_classes=10), 32),
    "efficientnet_b": (lambda: tv.efficientnet_b0(num_classes=10), 32),
    "efficientnet_v2": (lambda: tv.efficientnet_v2_s(num_classes=10), 32),
    "googlenet": (lambda: tv.googlenet(num_classes=10, aux_logits=True, init_weights=True), 64),
    "inception": (lambda: tv.inception_v3(num_classes=10, aux_logits=False, init_weights=True), 80),
    "maxvit": (_maxvit, 64),
    "mnasnet": (lambda: tv.mnasnet0_5(num_classes=10), 32),
    "mobilenet_v2": (lambda: tv.mobilenet_v2(num_classes=10), 32),
    "mobilenet_v3": (lambda: tv.mobilenet_v3_small(num_classes=10), 32),
    "regnet_x": (lambda: tv.regnet_x_400mf(num_classes=10), 32),
    "regnet_y": (lambda: tv.regnet_y_400mf(num_classes=10), 32),
    "resnet": (lambda: tv.resnet18(num_classes=10), 32),
    "resnext": (lambda: tv.resnext50_32x4d(num_classes=10), 32),
    "shufflenet": (lambda: tv.shufflenet_v2_x0_5(num_classes=10), 32),
    "squeezenet": (lambda: tv.squeezenet1_1(num_classes=10), 64),
    "swin_v2": (lambda: tv.swin_v2_t(num_classes=10), 32),
    "swin_": (lambda: tv.swin_t(num_classes=10), 32),
    "vgg": (lambda: tv.vgg11_bn(num_classes=10), 32),
    "vit": (lambda: tv.vit_b_32(num_classes=10, image_size=32), 32),
    "wide_resnet": (lambda: tv.wide_resnet50_2(num_classes=10), 32),
}


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=37,
                                      max_position_embeddings=64))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=64))


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, attention_dropout=0.1,
                                        max_position_embeddings=64))


TRANSFORMERS: dict[str, Build] = {"bert": _bert, "gpt2": _gpt2, "llama": _llama}

FAST = ("resnet", "mobilenet_v3", "bert")  # the fast tier's part of the sweep


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, by every name it has (tied ones under each)."""
    return {**dict(model.named_parameters(remove_duplicate=False)),
            **{n: b for n, b in model.named_buffers(remove_duplicate=False) if b is not None}}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _changed(before: dict[str, torch.Tensor], model: nn.Module) -> list[str]:
    """Names whose object, dtype, shape or bytes differ from ``before`` (the saved copies)."""
    after = _tensors(model)
    assert set(after) == set(before)
    return [n for n, t in after.items()
            if t.dtype != before[n].dtype or t.shape != before[n].shape
            or not torch.equal(_bytes(t), _bytes(before[n]))]


def _check(model: nn.Module, inputs: tuple[torch.Tensor, ...], backward: bool) -> None:
    model.train()
    torch.manual_seed(0)
    before = {n: t.detach().clone() for n, t in _tensors(model).items()}
    objects = {n: id(t) for n, t in _tensors(model).items()}
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        other = copy.deepcopy(model)  # the plain forward writes its running statistics
        with torch.no_grad():
            other(*inputs)
        assert _changed(before, other), "a training-mode forward should update batch norm"
    count(model, *inputs, train=True, backward=backward, warn=False)
    assert _changed(before, model) == []
    assert {n: id(t) for n, t in _tensors(model).items()} == objects
    assert model.training


def _image(side: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, side, side),)  # 2 images: batch norm trains on one value per
    # channel at the last stages' 1 x 1 maps otherwise


def _ids() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 100, (2, 16)),)


def test_every_torchvision_classifier_family_is_in_the_sweep() -> None:
    names = tv.list_models(module=torchvision.models)
    assert names, "torchvision lists its classification models"
    assert [n for n in names if not any(n.startswith(f) for f in TORCHVISION)] == []


_ALL = [*TORCHVISION, *TRANSFORMERS]


def _run(family: str, backward: bool) -> None:
    if family in TRANSFORMERS:
        _check(TRANSFORMERS[family](), _ids(), backward)
    else:
        build, side = TORCHVISION[family]
        _check(build(), _image(side), backward)


@pytest.mark.parametrize("family", [f for f in _ALL if f in FAST])
def test_a_training_count_leaves_the_model_bitwise(family: str) -> None:
    _run(family, backward=False)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"), reason="slow tier: set FLOPSCOPE_SLOW=1")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("family", _ALL)
def test_every_family_in_training_leaves_the_model_bitwise(family: str, backward: bool) -> None:
    _run(family, backward)
