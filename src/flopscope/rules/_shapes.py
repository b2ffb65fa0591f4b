"""Small helpers shared by the rule modules (shapes and schema arguments)."""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from flopscope.cost import OpCall

_ARG_INDEX: dict[tuple[torch._ops.OpOverload, str], int | None] = {}


def named_arg(call: OpCall, name: str, default: Any = None) -> Any:
    """An argument of ``call`` by its schema name, positional or keyword."""
    if name in call.kwargs:
        return call.kwargs[name]
    key = (call.op, name)
    try:
        index = _ARG_INDEX[key]
    except KeyError:
        index = next(
            (i for i, a in enumerate(call.op._schema.arguments) if a.name == name and not a.kwarg_only),
            None,
        )
        _ARG_INDEX[key] = index
    if index is not None and index < len(call.args):
        return call.args[index]
    return default


def numel(shape: Any) -> int:
    """Elements of a shape (``torch.Size`` or sequence of ints)."""
    return int(prod(shape))
