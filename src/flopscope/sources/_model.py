"""What every loader returns (:class:`LoadedModel`) and how a library model is built
(on ``meta`` when counting shapes only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopscope._text import one_line
from flopscope.errors import SourceError
from flopscope.execution.inputs import Inputs
from flopscope.report.source import SourceInfo
from flopscope.sources._inputs import check_memory

__all__ = ["LoadedModel", "build"]


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to count.

    Attributes:
        model: the model.
        args: positional arguments of one forward call.
        kwargs: keyword arguments of one forward call.
        name: a short human name (``resnet50``, ``LlamaForCausalLM``).
        source: the SOURCE string it came from.
        meta: facts about the source (inputs, published reference numbers), the same type as
            :attr:`flopscope.Report.meta`.
    """

    model: nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    source: str = ""
    meta: SourceInfo = field(default_factory=SourceInfo)

    @property
    def inputs(self) -> Inputs:
        """The forward arguments as one :class:`flopscope.Inputs`, ready for ``count()``."""
        return Inputs(*self.args, **self.kwargs)


def build(fn: Callable[[], nn.Module], shape_only: bool, what: str, *,
          sized: bool = False) -> nn.Module:
    """Call a model constructor: on the ``meta`` device when counting shapes only (no memory for
    weights), falling back to a real build when the constructor needs real tensors.

    Args:
        fn: the constructor.
        shape_only: try the ``meta`` device first.
        what: the source, for messages.
        sized: before a real build, build on ``meta`` and refuse weights larger than this
            machine's memory (a source whose defaults are billions of parameters, ``hf:llama``,
            would otherwise need more memory than the machine has while it is built).

    Returns:
        The model.

    Raises:
        SourceError: the constructor raised, or (``sized``) the weights cannot fit.
    """
    if shape_only or sized:
        try:
            with torch.device("meta"):
                model = fn()
        except Exception:  # noqa: BLE001  (some constructors need real tensors; build them for real)
            model = None
        if model is not None and shape_only:
            return model
        if model is not None:
            nbytes = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
            params = sum(p.numel() for p in model.parameters())
            check_memory(nbytes, f"{what} (its weights: {params:,} parameters)")
    try:
        return fn()
    except Exception as e:
        raise SourceError(f"building {what} failed: {type(e).__name__}: {one_line(e, 200)}") from e
