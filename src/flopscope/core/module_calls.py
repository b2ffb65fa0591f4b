"""Seeing every module call while a Counter is active: ``nn.Module._call_impl`` wrapped.

The module tracker (:mod:`flopscope.core.tracker`) must know when each module starts and returns.
PyTorch's global forward hooks would tell it, but any global hook sends every module call of the
process through ``Module._call_impl``'s general path (its hook lists, its always-called set, its
closure): about 4 µs per module call before a hook does anything, more than the tracker's own
work. So while at least one tracker listens, ``nn.Module._call_impl`` (what ``Module.__call__``
runs) is replaced by a function that tells the listeners, calls the original (whose fast path runs
when the module has no hooks of its own) and tells them again when it returns or raises -- the way
``torch.fx``'s symbolic tracer intercepts module calls. The original is put back when the last
listener leaves. (``__call__`` itself is not replaced: assigning a special method of a class makes
CPython update the slot of each of its subclasses, about a millisecond per assignment with
transformers' classes loaded; ``_call_impl`` is a plain attribute.) A module class that overrides
``_call_impl`` itself (``torch.compiler.disable`` on a module class does) is not seen, nor is a
module compiled with ``Module.compile()`` (its compiled call replaces ``_call_impl``).

A listener is a pair ``(enter(module, args), leave(module, output, exc))``: ``enter`` runs before
the module's own forward pre-hooks, ``leave`` after its own forward hooks (so what those hooks
compute, such as a tensor-parallel layer's output redistribution, is the module's), with ``exc``
the exception when the call raised (``output`` is then ``None``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["Enter", "Leave", "listen", "stop_listening"]

Enter = Callable[[nn.Module, tuple[Any, ...]], None]
Leave = Callable[[nn.Module, Any, "BaseException | None"], None]

_LOCK = threading.Lock()
# the listeners now (a tuple, replaced whole: a call in flight keeps the one it started with)
_LISTENERS: list[tuple[tuple[Enter, Leave], ...]] = [()]
_ORIGINAL: list[Any] = [nn.Module._call_impl]  # what nn.Module._call_impl was before ours
# (enter, leave, original) while there is exactly one listener, else None (read first by _call)
_ONE: list[tuple[Enter, Leave, Any] | None] = [None]


def _update_one() -> None:
    """Set :data:`_ONE` from the listeners now (called with the lock held)."""
    listeners = _LISTENERS[0]
    _ONE[0] = (*listeners[0], _ORIGINAL[0]) if len(listeners) == 1 else None


def _call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    one = _ONE[0]
    if one is not None:  # the common case: one Counter
        enter, leave, original = one
        enter(self, args)
        try:
            out = original(self, *args, **kwargs)
        except BaseException as e:
            leave(self, None, e)
            raise
        leave(self, out, None)
        return out
    listeners = _LISTENERS[0]
    original = _ORIGINAL[0]
    for enter, _ in listeners:
        enter(self, args)
    try:
        out = original(self, *args, **kwargs)
    except BaseException as e:
        for _, leave in reversed(listeners):
            leave(self, None, e)
        raise
    for _, leave in reversed(listeners):
        leave(self, out, None)
    return out


def listen(enter: Enter, leave: Leave) -> tuple[Enter, Leave]:
    """Start telling ``enter``/``leave`` about every module call (of every thread).

    Args:
        enter: called with the module and its positional arguments before it runs.
        leave: called with the module, its output and the exception it raised (or ``None``).

    Returns:
        The listener, for :func:`stop_listening`.
    """
    pair = (enter, leave)
    with _LOCK:
        if nn.Module._call_impl is not _call:
            _ORIGINAL[0] = nn.Module._call_impl
            nn.Module._call_impl = _call  # type: ignore[method-assign]
        _LISTENERS[0] = (*_LISTENERS[0], pair)
        _update_one()
    return pair


def stop_listening(pair: tuple[Enter, Leave]) -> None:
    """Stop telling a listener of :func:`listen`; the last one out puts ``nn.Module._call_impl``
    back (unless something else replaced it meanwhile: then ours stays below it, passing every
    call straight through)."""
    with _LOCK:
        _LISTENERS[0] = tuple(p for p in _LISTENERS[0] if p is not pair)
        _update_one()
        if not _LISTENERS[0] and nn.Module._call_impl is _call:
            nn.Module._call_impl = _ORIGINAL[0]  # type: ignore[method-assign]
