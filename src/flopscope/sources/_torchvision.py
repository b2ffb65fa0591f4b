"""``torchvision:NAME``: ``torchvision.models.get_model(NAME, weights=None)`` with one image at the
crop size of the default weights' transforms (video clips and image pairs where the weights say so).
"""

from __future__ import annotations

from typing import Any

from flopscope._text import did_you_mean
from flopscope.errors import SourceError
from flopscope.report.source import SourceInfo
from flopscope.sources._inputs import example_tensor
from flopscope.sources._model import LoadedModel, build

__all__ = ["check_torchvision_name", "load_torchvision"]


def check_torchvision_name(name: str) -> Any:
    """Check that torchvision has a model ``name``, without building it.

    Args:
        name: a name of ``torchvision.models.list_models()``.

    Returns:
        The ``torchvision.models`` module.

    Raises:
        SourceError: torchvision is missing, or the name is unknown (close names suggested).
    """
    try:
        import torchvision.models as tvm  # type: ignore[import-untyped]
    except ImportError:
        raise SourceError(
            "torchvision: sources need torchvision: pip install 'flopscope[vision]'"
        ) from None
    names = tvm.list_models()
    if name not in names:
        raise SourceError(
            f"unknown torchvision model {name!r}{did_you_mean(name, names)} "
            "(torchvision.models.list_models() lists them all)"
        )
    return tvm


def load_torchvision(name: str, *, shape_only: bool = False) -> LoadedModel:
    """A torchvision model (random weights, eval mode) and its default input.

    Args:
        name: a name of ``torchvision.models.list_models()``.
        shape_only: build on the ``meta`` device where possible; the input is a ``meta`` tensor.

    Returns:
        The model; ``meta.reference_gmacs`` is torchvision's published GFLOPS figure (MACs) when
        the weights publish one for this input size.

    Raises:
        SourceError: torchvision is missing, or the name is unknown (close names suggested).
    """
    tvm = check_torchvision_name(name)
    model = build(lambda: tvm.get_model(name, weights=None), shape_only, f"torchvision:{name}")
    model.eval()
    reference: float | None = None
    size: list[int] = [224, 224]
    kind = "image"
    try:
        weights = tvm.get_model_weights(name).DEFAULT
        transforms = weights.transforms()
        kind = type(transforms).__name__
        crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
        if crop:
            size = list(crop) if len(crop) == 2 else [crop[0], crop[0]]
        if "_ops" in weights.meta:
            reference = float(weights.meta["_ops"])
    except Exception:  # noqa: BLE001  (no weights registered: keep the ImageNet default)
        pass
    built_for = getattr(model, "image_size", None)  # e.g. ViT built without weights: 224
    if isinstance(built_for, int) and [built_for, built_for] != size:
        size = [built_for, built_for]
        reference = None  # published for the weights' input size
    h, w = size
    args: tuple[Any, ...]
    if kind == "VideoClassification":
        args = (example_tensor((1, 3, 16, h, w), shape_only=shape_only),)
    elif kind == "OpticalFlow":
        args = tuple(example_tensor((1, 3, 224, 224), shape_only=shape_only) for _ in range(2))
    else:
        args = (example_tensor((1, 3, h, w), shape_only=shape_only),)
    return LoadedModel(model, args, name=name, meta=SourceInfo(reference_gmacs=reference))
