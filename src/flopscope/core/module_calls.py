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
the exception when the call raised (``output`` is then ``None``). A listener may also give
``calls(original)``, which returns one function ``call(module, args, kwargs)`` that does the
three (``enter``, ``original(module, *args, **kwargs)``, ``leave``) itself, or ``None``: while it
is the only listener, every module call goes to that function (one Python frame fewer, and
what the listener does twice per call done once: :mod:`flopscope.core.usual_calls`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["Calls", "Enter", "Leave", "listen", "stop_listening"]

Enter = Callable[[nn.Module, tuple[Any, ...]], None]
Leave = Callable[[nn.Module, Any, "BaseException | None"], None]
Call = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]
Calls = Callable[[Callable[..., Any]], "Call | None"]

_LOCK = threading.Lock()
# the listeners now (a tuple, replaced whole: a call in flight keeps the one it started with)
_LISTENERS: list[tuple[tuple[Enter, Leave], ...]] = [()]
_CALLS: dict[int, Calls] = {}  # id(listener) -> its calls(original), for those that give one
_ORIGINAL: list[Any] = [nn.Module._call_impl]  # what nn.Module._call_impl was before ours
# (enter, leave, original) while there is exactly one listener, else None (read first by _call)
_ONE: list[tuple[Enter, Leave, Any] | None] = [None]
# the one listener's call(module, args, kwargs), when it gave one (read before _ONE)
_CALL: list[Call | None] = [None]


def _update_one() -> None:
    """Set :data:`_ONE` and :data:`_CALL` from the listeners now (called with the lock held)."""
    listeners = _LISTENERS[0]
    _ONE[0] = (*listeners[0], _ORIGINAL[0]) if len(listeners) == 1 else None
    calls = _CALLS.get(id(listeners[0])) if len(listeners) == 1 else None
    _CALL[0] = calls(_ORIGINAL[0]) if calls is not None else None


def _call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    call = _CALL[0]
    if call is not None:  # the usual case: one Counter (flopscope.core.usual_calls)
        return call(self, args, kwargs)
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


def listen(enter: Enter, leave: Leave, calls: Calls | None = None) -> tuple[Enter, Leave]:
    """Start telling ``enter``/``leave`` about every module call (of every thread).

    Args:
        enter: called with the module and its positional arguments before it runs.
        leave: called with the module, its output and the exception it raised (or ``None``).
        calls: given the original ``_call_impl``, one function that makes the whole call
            while this is the only listener, or ``None`` (see the module docstring).

    Returns:
        The listener, for :func:`stop_listening`.
    """
    pair = (enter, leave)
    with _LOCK:
        if nn.Module._call_impl is not _call:
            _ORIGINAL[0] = nn.Module._call_impl
            nn.Module._call_impl = _call  # type: ignore[method-assign]
        _LISTENERS[0] = (*_LISTENERS[0], pair)
        if calls is not None:
            _CALLS[id(pair)] = calls
        _update_one()
    return pair


def stop_listening(pair: tuple[Enter, Leave]) -> None:
    """Stop telling a listener of :func:`listen`; the last one out puts ``nn.Module._call_impl``
    back (unless something else replaced it meanwhile: then ours stays below it, passing every
    call straight through)."""
    with _LOCK:
        _LISTENERS[0] = tuple(p for p in _LISTENERS[0] if p is not pair)
        _CALLS.pop(id(pair), None)
        _update_one()
        if not _LISTENERS[0] and nn.Module._call_impl is _call:
            nn.Module._call_impl = _ORIGINAL[0]  # type: ignore[method-assign]
