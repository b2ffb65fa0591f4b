"""Small helpers shared by the rule modules (shapes and schema arguments)."""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from flopscope.core.facts import facts
from flopscope.cost import OpCall, note_value_read


def named_arg(call: OpCall, name: str, default: Any = None) -> Any:
    """An argument of ``call`` by its schema name, positional or keyword."""
    if name in call.kwargs:
        return call.kwargs[name]
    index = facts(call.op).arg_index.get(name)
    if index is not None and index < len(call.args):
        return call.args[index]
    return default


def numel(shape: Any) -> int:
    """Elements of a shape (``torch.Size`` or sequence of ints); a ``SymInt`` when a size is
    symbolic (``int()`` would fix the symbol to its traced value; a SymInt behaves as an int)."""
    n = prod(shape)
    return n if type(n) is int or isinstance(n, torch.SymInt) else int(n)  # type: ignore[return-value]


def has_values(t: Any) -> bool:
    """Whether ``t`` is a real tensor whose values a rule can read (not fake or meta); when it is,
    the read is noted (:func:`flopscope.cost.note_value_read`): the call's cost depends on them."""
    if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor or t.device.type == "meta":
        return False
    note_value_read()
    return True


def tensor_values(t: Any) -> list[int] | None:
    """The integer values of a small real tensor, or ``None`` on fake/meta tensors (no values)."""
    if not has_values(t):
        return None
    try:
        return [int(v) for v in t.reshape(-1).tolist()]
    except (RuntimeError, NotImplementedError, ValueError):
        return None


def per(numel: Any, size: Any) -> Any:
    """``numel // size``: how many times a block of ``size`` elements fits (batch elements of a
    transform or a solve); 0 for an empty block of concrete size. With a symbolic size (at least
    1 by construction) no guard is taken."""
    if isinstance(size, torch.SymInt):
        return numel // size
    return numel // size if size else 0


def broadcast_size(sizes: Any) -> Any:
    """The size of a broadcast dimension: the one size that is not a literal 1 (sizes of a
    broadcast are equal or 1), without comparing symbolic sizes (a comparison is a guard)."""
    return next((s for s in sizes if not (type(s) is int and s == 1)), 1)
