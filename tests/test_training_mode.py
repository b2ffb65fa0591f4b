"""A model counted in training mode outside a training step: flopscope counts the mode the model is
in and warns once, naming the layers whose cost depends on it (flopscope.core.training_mode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope


def _net(**dropout: float) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4),
        nn.Flatten(), nn.Dropout(dropout.get("p", 0.5)), nn.Linear(4 * 4 * 4, 2),
    )


def _mode_warnings(record: list[pytest.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record
            if issubclass(w.category, flopscope.FlopscopeWarning) and "training mode" in str(w.message)]


X = torch.randn(2, 3, 4, 4)


@pytest.mark.parametrize("shape_only", [False, True])
def test_count_in_training_mode_warns_once_naming_the_layers(shape_only: bool) -> None:
    model = _net()  # a fresh module is in training mode
    with pytest.warns(flopscope.FlopscopeWarning) as record:
        report = flopscope.count(model, X, shape_only=shape_only)
    found = _mode_warnings(record.list)
    assert len(found) == 1
    assert "BatchNorm2d x2, Dropout x1" in found[0] and "model.eval()" in found[0]
    # what was counted is the training-mode forward, the model's mode, left as it was
    assert model.training
    assert report.flops == flopscope.count(model, X, shape_only=shape_only, train=True).flops
    assert report.flops > flopscope.count(model, X, shape_only=shape_only, train=False).flops


@pytest.mark.parametrize(("make", "options"), [
    (lambda: _net().eval(), {}),  # eval mode
    (_net, {"train": True}),  # the caller chose training mode
    (_net, {"train": False}),
    (_net, {"backward": True}),  # a training step
    (_net, {"warn": False}),
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), {}),  # p = 0 changes nothing
    # without running statistics, eval mode uses the batch's statistics too
    (lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False)), {}),
])
def test_no_warning_where_the_mode_changes_nothing_or_was_chosen(
        make: object, options: dict[str, bool], recwarn: pytest.WarningsRecorder) -> None:
    model = make()  # type: ignore[operator]
    x = torch.randn(2, 4) if isinstance(model[0], nn.Linear) else X
    flopscope.count(model, x, **options)
    assert not _mode_warnings(recwarn.list)


def test_counter_warns_without_backward_only(recwarn: pytest.WarningsRecorder) -> None:
    model = _net()
    with flopscope.Counter(model):
        model(X)
    assert len(_mode_warnings(recwarn.list)) == 1
    recwarn.clear()
    with flopscope.Counter(model):  # a training step: training mode is what it runs
        model(X).sum().backward()
    assert not _mode_warnings(recwarn.list)


def test_counter_names_only_the_layers_that_ran(recwarn: pytest.WarningsRecorder) -> None:
    model = nn.ModuleDict({"used": nn.Linear(4, 4), "unused": nn.Dropout(0.5)})
    with flopscope.Counter(model):
        model["used"](torch.randn(2, 4))
    assert not _mode_warnings(recwarn.list)


def test_readme_tour_model_warns() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50()  # README's tour, before .eval(): training mode
    with pytest.warns(flopscope.FlopscopeWarning) as record:
        report = flopscope.count(model, torch.randn(1, 3, 224, 224), shape_only=True)
    (message,) = _mode_warnings(record.list)
    assert "BatchNorm2d x53." in message
    # training-mode batch norm: 8,262,090,216 FLOPs against the eval forward's 8,217,634,280
    assert report.flops == 8_262_090_216
