"""Memoising operator calls on ``meta`` tensors: the shape-only fast path of the counter.

On ``meta`` tensors an operator's outputs and its cost depend on nothing but the metadata of its
arguments (shapes, strides, storage offsets, dtypes), its non-tensor arguments and the default
dtype: there are no values to read. So a call whose every tensor argument is a plain strided
``meta`` tensor is keyed by :func:`signature`, and

- its *outputs* are made again from the metadata the kernel produced the first time
  (:func:`replay`), instead of running the kernel (many meta kernels are Python code in torch:
  ``native_batch_norm`` takes about a millisecond), for operators that return new tensors
  (no output aliases an input, no argument is written) and for in-place operators that write
  only their first argument's values (it is returned: :data:`SELF`); views and operators that
  change metadata (``resize_``, ``transpose_``, ...) still run, and so does every call when
  another dispatch mode sits below the counter's (it must see the call);
- its *cost* is looked up (see ``Counter._record``), instead of building an ``OpCall`` and calling
  the rule, per phase and per Counter (the rules are the Counter's).

Only meta tensors qualify: a real tensor's values can be read by a rule (variable-length attention
offsets, grouped-matmul offsets, sparse ``nnz``, CTC lengths), and so can a fake tensor's when it
holds a constant; nothing is cached when any tensor argument or output is not a plain meta tensor
(subclasses, fake, functional, nested, sparse, complex with its conjugate bit), or when a
non-tensor argument is not one of a few immutable scalar types.

Symbolic counts (:mod:`flopscope.symbolic`) are the one exception: while :func:`symbolic_replay`
holds a fake mode whose shape environment carries the named sizes, calls on that mode's fake
tensors (no constant values) are keyed the same way and their outputs made again from templates
(:mod:`flopscope.core.fake_memo`, which keeps the running modes). A shape-only simulation's fake
mode (static sizes: :func:`static_replay`) is keyed the same way; its outputs are made fresh
(:mod:`flopscope.core.fake_outputs`), so with backward too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from flopscope.core import fake_outputs as fresh
from flopscope.core.facts import MemoKind, facts
from flopscope.core.fake_memo import (
    FAKE_KEYS,
    FAKE_MODES,
    KEY,
    add_fake,
    end_key,
    fake_spec,
    holds_fake,
    replay_fake,
    start_key,
    unkeyed,
)

__all__ = ["OUTPUTS", "SELF", "is_pure", "key_part", "outputs_of", "remember", "replay", "signature",
           "spec", "static_replay", "symbolic_replay"]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_STRIDED = torch.strided
_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_META = torch.device("meta")
_empty_strided = torch.empty_strided
_default_dtype = torch.get_default_dtype
# signature -> output spec, shared by every Counter (it depends only on torch's meta kernels)
OUTPUTS: dict[tuple[Any, ...], Any] = {}
_LIMIT = 200_000  # entries before the output cache starts over


def _add(key: list[Any], a: Any) -> bool:
    """Append an argument's part of a key; ``False`` when the call must not be memoised."""
    ta = type(a)
    if ta is _Tensor or ta is _Parameter:
        if not a.is_meta or a.layout is not _STRIDED or a.is_nested:
            return False
        dtype = a.dtype
        if dtype in _COMPLEX:
            return False
        key.append(KEY)
        key.append(a.shape)
        key.append(a.stride())
        key.append(a.storage_offset())
        key.append(dtype)
        return True
    if ta in _SCALARS:
        key.append(ta)  # 1, 1.0 and True are equal keys but promote differently
        key.append(a)
        return True
    if ta is list or ta is tuple:
        key.append(ta)
        key.append(len(a))
        for x in a:
            tx = type(x)
            if tx is int:
                key.append(x)
            elif tx is list or tx is tuple or not _add(key, x):
                return False
        return True
    if FAKE_MODES:
        return add_fake(key, a)  # a registered fake mode's tensor, a SymInt
    return False


_OBJECT = object()  # an object's place in a module call's key (key_part)


def key_part(key: list[Any], a: Any) -> bool:
    """Append a module call's argument to its key (:mod:`flopscope.core.replay`): tensors and
    scalars as in :func:`signature`, containers element by element, any other object by
    identity (a cache passed to every layer is the same object); ``False`` when a tensor or a
    symbolic value cannot be keyed."""
    ta = type(a)
    if ta is tuple or ta is list:
        key.append(ta)
        key.append(len(a))
        return all(key_part(key, x) for x in a)
    if ta is dict:
        key.append(ta)
        for k, v in a.items():
            key.append(k)
            if not key_part(key, v):
                return False
        return True
    if ta in _SCALARS or isinstance(a, (_Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _add(key, a)
    key.append(_OBJECT)
    key.append(id(a))
    return True


def signature(func_id: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The memo key of a call, or ``None`` when the call must not be memoised (see the module
    docstring).

    Args:
        func_id: ``id`` of the operator overload.
        args: the positional arguments as the dispatcher passed them.
        kwargs: the keyword arguments.

    Returns:
        A hashable key, or ``None``.
    """
    key: list[Any] = [func_id]
    if FAKE_MODES and not start_key(func_id):
        return None
    for a in args:
        if not _add(key, a):
            return None  # on a real count: the first tensor argument, before anything else
    if kwargs:
        for name, a in kwargs.items():
            key.append(name)
            if not _add(key, a):
                return None
    # the default dtype decides the result type of an integer tensor times a float, and of
    # factory functions given no dtype
    key.append(_default_dtype())
    if FAKE_MODES:
        end_key(key)
    try:
        return tuple(key)
    except RuntimeError:  # pragma: no cover - a size that cannot be read
        return None


SELF = ("self",)
"""The remembered outputs of an in-place operator: its first argument, returned as it is."""


def is_pure(func: Any) -> bool:
    """Whether an operator returns only new tensors (no output aliases an argument and no
    argument is written), so that its outputs can be made from their metadata alone."""
    return facts(func).memo_kind == MemoKind.NEW


def outputs_of(func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """What to remember of a call's outputs (see :func:`spec`): ``None`` when the call is not
    memoised at all, ``False`` when only its cost is, :data:`SELF` for an in-place operator that
    returned its first argument, otherwise a :func:`spec` to :func:`replay`.

    Args:
        func: the operator overload.
        args: its positional arguments.
        out: what it returned.

    Returns:
        As above.
    """
    kind = facts(func).memo_kind
    if FAKE_MODES:
        if unkeyed(func):
            return None
        fake = fake_spec(func, out)
        if fake is not None:
            if not FAKE_MODES[id(fake[1])][2]:
                return False  # costs only (a count with backward)
            if kind == MemoKind.SELF and args and out is args[0]:
                return SELF
            if fake[0] in fresh.SPECS:
                return fresh.fresh_or_view(func, args, out, fake)
            return fake if kind == MemoKind.NEW or facts(func).pure_view else False
    if kind == MemoKind.SELF and args and out is args[0]:
        return SELF if _meta_of(out) is not False else None
    made = spec(out)
    if made is None or made is False:
        return made
    return made if kind == MemoKind.NEW else False


def _meta_of(t: Any) -> Any:
    if type(t) is not _Tensor or not t.is_meta or t.layout is not _STRIDED or t.is_nested:
        return False
    if t.dtype in _COMPLEX:
        return False
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def spec(out: Any) -> Any:
    """What :func:`replay` needs to make ``out`` again: ``None`` when an output is not a plain
    meta tensor (then the call is not memoised at all); ``False`` when the outputs are meta
    tensors but cannot be made from metadata alone (a storage offset, a ``None`` among them);
    otherwise ``(shape, stride, dtype)`` for one tensor, or a tuple/list of those.

    Args:
        out: an operator's return value.

    Returns:
        The spec, ``False`` or ``None``.
    """
    if type(out) is _Tensor:
        m = _meta_of(out)
        if m is False:
            return None
        return (m[0], m[1], m[3]) if m[2] == 0 else False
    if type(out) is tuple or type(out) is list:
        parts = []
        replayable = True
        for t in out:
            if not isinstance(t, _Tensor):
                if t is None or type(t) in _SCALARS:
                    replayable = False
                    continue
                return None
            m = _meta_of(t)
            if m is False:
                return None
            if m[2] != 0:
                replayable = False
            parts.append((m[0], m[1], m[3]))
        if not replayable:
            return False
        return (type(out), tuple(parts))
    return None


def replay(s: Any, args: tuple[Any, ...] = ()) -> Any:
    """New meta tensors with the metadata of a :func:`spec` (not ``False`` or ``None``).

    Args:
        s: the spec.
        args: the call's arguments (a static fake mode's view is made over the first one's
            storage).

    Returns:
        A tensor, or a tuple or list of tensors.
    """
    if type(s[0]) is tuple:
        return _empty_strided(s[0], s[1], dtype=s[2], device=_META)
    if s[0] is not tuple and s[0] is not list:  # a fake mode's outputs
        return replay_fake(s, args)
    made = [_empty_strided(p[0], p[1], dtype=p[2], device=_META) for p in s[1]]
    return tuple(made) if s[0] is tuple else made


def remember(key: tuple[Any, ...], s: Any) -> None:
    """Keep an output spec for a key (the cache starts over past a bound on its size)."""
    if len(OUTPUTS) >= _LIMIT:
        OUTPUTS.clear()
    OUTPUTS[key] = s
    # a symbolic count's entries go when it ends (see fake_memo.holds_fake)
    if FAKE_MODES and holds_fake(key, s):
        FAKE_KEYS.append(key)


@contextmanager
def static_replay(mode: Any) -> Iterator[None]:
    """While the block runs, calls on ``mode``'s fake tensors (a fake mode without a shape
    environment, as a shape-only simulation's) are memoised as a symbolic count's are: their
    costs looked up, their outputs made again by :mod:`flopscope.core.fake_outputs` (new
    tensors fresh, views over their base's storage), so with backward too.

    Args:
        mode: the ``FakeTensorMode`` (``shape_env`` ``None``).

    Yields:
        Nothing.

    Raises:
        ValueError: the mode has a shape environment (use :func:`symbolic_replay`).
    """
    if getattr(mode, "shape_env", None) is not None:
        raise ValueError("static_replay() takes a fake mode without a shape environment; "
                         "use symbolic_replay() for a symbolic count's")
    with symbolic_replay(mode):
        yield


@contextmanager
def symbolic_replay(mode: Any, *, replay: bool = True,
                    origins: dict[str, str] | None = None) -> Iterator[None]:
    """While the block runs, calls on ``mode``'s fake tensors are memoised (see the module
    docstring); their entries are dropped at the end.

    Args:
        mode: the ``FakeTensorMode`` of a symbolic count (with a ``ShapeEnv``).
        replay: make outputs from templates (a count without backward); ``False``: costs only.
        origins: filled with data-dependent (unbacked) symbol name -> the operator whose output
            first held it (``u0`` -> ``aten.nonzero.default``), for error messages.

    Yields:
        Nothing.
    """
    FAKE_MODES[id(mode)] = (mode, mode.shape_env, replay, {} if origins is None else origins)
    try:
        yield
    finally:
        del FAKE_MODES[id(mode)]
        if not FAKE_MODES:
            for k in FAKE_KEYS:
                OUTPUTS.pop(k, None)
            FAKE_KEYS.clear()
