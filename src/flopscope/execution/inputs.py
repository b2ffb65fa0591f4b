"""The model's own arguments of a count (:class:`Inputs`), apart from the count's options: what
a factory may return beside its model (:mod:`flopscope.sources`) and what every entry point that
runs a model unwraps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Inputs", "model_arguments", "token_ids"]


class Inputs:
    """The model's own arguments, passed verbatim to the model by :func:`flopscope.count`.

    Use it when a model keyword has the same name as one of :func:`flopscope.count`'s options::

        flopscope.count(model, flopscope.Inputs(x, strict=True), strict=False)
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


def model_arguments(args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's arguments of a call given ``(*args, **kwargs)``: one :class:`Inputs`
    unwrapped (its keywords, then the call's), anything else as given."""
    if len(args) == 1 and isinstance(args[0], Inputs):
        return args[0].args, {**args[0].kwargs, **kwargs}
    return args, dict(kwargs)


def token_ids(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A language model's token ids among its arguments: the ``input_ids`` keyword (as
    :mod:`flopscope.sources` passes them), else the first positional argument; ``None`` when
    neither is a (batch, sequence) integer tensor (an image model, embeddings given instead)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
        return ids
    return None
