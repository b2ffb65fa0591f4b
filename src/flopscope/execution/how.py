"""How a model is run for a count, and the one fallback ladder.

- ``REAL``: on the model's own tensors and the caller's inputs (values, arithmetic).
- ``META``: on ``meta`` tensors (a model built on ``meta``, or meta copies of a real model's
  parameters for a shape-only count): PyTorch's meta kernels compute shapes only; the cheapest.
- ``FAKE``: on fake CPU tensors (``FakeTensorMode``): shapes only, but the CPU's code paths: a
  module that picks its path by device (``nn.MultiheadAttention``'s fused fast path), a value read
  from a constant, a forward that mixes a few CPU tensors into a ``meta`` model.

:func:`ladder` says in which order to try them; every driver (a forward count, a training step,
a monitor's shadow count) walks the same ladder, falling to the next rung when the model cannot
run on one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from functools import partial
from operator import attrgetter, is_not
from typing import Any

from torch import nn
from torch.utils._pytree import tree_iter

from flopscope.core.model_index import ModelTensors
from flopscope.execution.meta import needs_fake_cpu

__all__ = ["How", "given_fake_mode", "ladder", "on_meta"]

_is_meta = attrgetter("is_meta")
_not_none = partial(is_not, None)


class How(str, enum.Enum):
    """How a model is run (see the module docstring)."""

    REAL = "real"
    META = "meta"
    FAKE = "fake"


def on_meta(modules: Iterable[nn.Module] | ModelTensors) -> bool:
    """Whether a parameter or buffer of these modules is on ``meta``: such a model cannot run on
    real tensors and is counted shape-only, with the tensors it holds on the CPU (made by code
    that ignores the default device: ``torch.Tensor(n)``, ``device="cpu"``) converted with it.

    Args:
        modules: the model's modules (``model.modules()``), or their tables as a Counter read
            them (:attr:`~flopscope.Counter.model_tensors`: one pass in C over the tensors).

    Returns:
        As above.
    """
    if isinstance(modules, ModelTensors):
        return modules.on_meta()
    for m in modules:  # (tensors tested in C: this runs at every count)
        for table in (m._parameters, m._buffers):
            if table and any(map(_is_meta, filter(_not_none, table.values()))):
                return True
    return False


def given_fake_mode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fake mode of the first fake tensor among a model's arguments, or ``None``: inputs
    made by :func:`flopscope.count_symbolic` (fake tensors with symbolic sizes) are counted in
    their own mode, whose shape environment holds their symbols.

    Args:
        args: the model's positional arguments.
        kwargs: its keyword arguments.

    Returns:
        The mode, or ``None``.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    for t in tree_iter((args, kwargs)):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return None


def ladder(modules: list[nn.Module], *, shape_only: bool, meta: bool,
           fake_inputs: bool = False) -> list[How]:
    """The ways to try, in order.

    Args:
        modules: the model's modules.
        shape_only: the caller asked for no arithmetic.
        meta: the model is on ``meta`` (:func:`on_meta`).
        fake_inputs: the inputs are fake tensors already (a symbolic count's).

    Returns:
        ``[FAKE]`` for fake inputs; ``[META, FAKE]`` for a shape-only count that meta kernels
        can run (fake CPU tensors when it turns out they cannot); ``[FAKE]`` for a shape-only
        count of a model with device-chosen paths; ``[REAL]`` otherwise.
    """
    if fake_inputs:
        return [How.FAKE]
    if meta or shape_only:
        return [How.FAKE] if needs_fake_cpu(modules) else [How.META, How.FAKE]
    return [How.REAL]
