"""Remembering what a default rule said about a call on real tensors, keyed by metadata.

A default rule costs a call from its arguments' metadata (shapes, strides, dtypes), its non-tensor
arguments and its outputs' metadata: the same key, the same cost. The few default rules that read
a tensor's *values* (variable-length attention offsets, grouped-matmul offsets, a loss's targets,
RoI boxes) read them through :func:`flopscope.cost.note_value_read`'s callers, and a call whose
rule read values is never remembered (:class:`~flopscope.core.costing.Costing`). So a model that
repeats a call shape (a ResNet's blocks, a transformer's layers) costs each shape once; every
later call looks its cost up under :func:`cost_key` instead of building an
:class:`~flopscope.cost.OpCall` and running the rule, its byte count and its integer/complex check.

Only plain strided tensors of ordinary dtypes are keyed (not subclasses, fake, meta, nested,
sparse, quantized or complex tensors), and non-tensor arguments only when they are a few
immutable scalar types or flat lists of them; anything else makes the call unkeyed (costed as
before). Outputs are part of the key, so an operator whose output size depends on its inputs'
values (``nonzero``, a boolean mask's ``index``) is costed for the size it produced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["KEY_LATER", "REAL_KEY", "REAL_LIMIT", "cost_key", "is_real_key"]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_STRIDED = torch.strided
# dtypes whose tensors carry nothing a rule reads beyond their metadata (quantized tensors carry
# scales, complex ones conjugate bits)
_PLAIN = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                    torch.float8_e4m3fn, torch.float8_e5m2})
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_INTS = frozenset({int})
_R = object()  # a real tensor's place in a key (never equal to a scalar argument)
REAL_KEY = _KEY = object()  # the second element of every key made here (is_real_key)
REAL_LIMIT = 20_000  # keys remembered per phase before the table starts over (a few MB)
#: what the dispatch mode passes as a call's memo key when the call is to be keyed by the recorder,
#: which knows its module (:func:`flopscope.core.call_guards.call_key`)
KEY_LATER: tuple[Any, ...] = (object(),)


def _add(key: list[Any], a: Any) -> bool:
    """Append an argument's (or output's) part of a key; ``False`` when it cannot be keyed."""
    ta = type(a)
    if ta is _Tensor or ta is _Parameter:
        if a.layout is not _STRIDED or a.is_meta:
            return False
        dtype = a.dtype
        if dtype not in _PLAIN:
            return False
        key += (_R, dtype, a.shape, a.stride())  # (a nested tensor raises: see cost_key)
        return True
    if ta in _SCALARS:
        key += (ta, a)  # 1, 1.0 and True are equal keys but may mean different things
        return True
    if ta is list or ta is tuple:
        key += (ta, len(a))
        for x in a:
            tx = type(x)
            if tx is int:
                key.append(x)
            elif tx in _SCALARS:
                key += (tx, x)
            elif not (tx is _Tensor or tx is _Parameter) or not _add(key, x):
                return False
        return True
    return False


def cost_key(func_id: int, args: tuple[Any, ...], kwargs: dict[str, Any],
             out: Any) -> tuple[Any, ...] | None:
    """The key under which a default rule's cost of a call on real tensors is remembered, or
    ``None`` when the call cannot be keyed (see the module docstring).

    Args:
        func_id: ``id`` of the operator overload.
        args: the positional arguments as the dispatcher passed them.
        kwargs: the keyword arguments.
        out: what the operator returned.

    Returns:
        A hashable key, or ``None``.
    """
    key: list[Any] = [func_id, _KEY]
    try:
        # the common arguments (plain tensors, scalars) inline: this runs on every operator call
        for a in args:
            ta = type(a)
            if ta is _Tensor or ta is _Parameter:
                if a.layout is not _STRIDED or a.is_meta or (dtype := a.dtype) not in _PLAIN:
                    return None
                key += (_R, dtype, a.shape, a.stride())
            elif ta in _SCALARS:
                key += (ta, a)
            elif ta is list and _INTS.issuperset(map(type, a)):  # sizes, strides, paddings
                key += (ta, len(a))
                key += a
            elif not _add(key, a):
                return None
        if kwargs:
            for name, a in kwargs.items():
                ta = type(a)
                if ta in _SCALARS:  # (dtype=, layout=, device=: inline, as above)
                    key += (name, ta, a)
                    continue
                key.append(name)
                if not _add(key, a):
                    return None
        key.append(_R)  # the outputs: a tensor, or a tuple of tensors (as _add keys them)
        if type(out) is tuple:
            key += (tuple, len(out))
            for o in out:
                to = type(o)
                if to is _Tensor:
                    if o.layout is not _STRIDED or o.is_meta or (dtype := o.dtype) not in _PLAIN:
                        return None
                    key += (_R, dtype, o.shape, o.stride())
                elif to is int:
                    key.append(o)
                elif to in _SCALARS:
                    key += (to, o)
                elif to is not _Parameter or not _add(key, o):
                    return None
        elif type(out) is _Tensor:
            if out.layout is not _STRIDED or out.is_meta or (dtype := out.dtype) not in _PLAIN:
                return None
            key += (_R, dtype, out.shape, out.stride())
        elif not _add(key, out):
            return None
    except RuntimeError:  # a strided nested tensor has no sizes or strides to read
        return None
    return tuple(key)


def is_real_key(key: tuple[Any, ...]) -> bool:
    """Whether a memo key was made by :func:`cost_key` (not by the shape-only memo)."""
    return len(key) > 1 and key[1] is _KEY
