"""``timm:NAME``: ``timm.create_model(NAME, pretrained=False)`` with one image of the model's
``pretrained_cfg["input_size"]``."""

from __future__ import annotations

from typing import Any

from flopscope._text import did_you_mean
from flopscope.errors import SourceError
from flopscope.sources._inputs import example_tensor
from flopscope.sources._model import LoadedModel, build

__all__ = ["check_timm_name", "load_timm"]


def check_timm_name(name: str) -> Any:
    """Check that timm has a model ``name``, without building it.

    Args:
        name: a name of ``timm.list_models()``.

    Returns:
        The ``timm`` module.

    Raises:
        SourceError: timm is missing, or the name is unknown (close names suggested).
    """
    try:
        import timm
    except ImportError:
        raise SourceError("timm: sources need timm: pip install 'flopscope[vision]'") from None
    if not timm.is_model(name):
        names = timm.list_models()
        raise SourceError(
            f"unknown timm model {name!r}{did_you_mean(name, names)} "
            "(timm.list_models() lists them all)"
        )
    return timm


def load_timm(name: str, *, shape_only: bool = False) -> LoadedModel:
    """A timm model (random weights, eval mode) and its default input.

    Args:
        name: a name of ``timm.list_models()``.
        shape_only: build on the ``meta`` device where possible; the input is a ``meta`` tensor.

    Returns:
        The model.

    Raises:
        SourceError: timm is missing, or the name is unknown (close names suggested).
    """
    timm = check_timm_name(name)
    model = build(lambda: timm.create_model(name, pretrained=False), shape_only, f"timm:{name}")
    model.eval()
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = tuple(int(d) for d in cfg.get("input_size", (3, 224, 224)))
    return LoadedModel(model, (example_tensor((1, *size), shape_only=shape_only),), name=name)
