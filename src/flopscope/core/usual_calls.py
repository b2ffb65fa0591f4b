"""A usual module call seen in one Python frame.

:class:`~flopscope.core.tracker.ModuleTracker` sees a module call start (``enter``) and return
(``leave``) through :mod:`flopscope.core.module_calls`: three Python frames per module call
(the wrapper, ``enter``, ``leave``). For the usual call (the thread that entered the Counter, a
plain module, no module rule, no observer of module calls, an eager output) :func:`usual_calls`
gives the wrapper one function that does what ``enter`` and ``leave`` do for it, inline, around
the module's own ``_call_impl``; every other call goes through ``enter`` and ``leave``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter

from flopscope.core.frames import KINDS, LAZY, Frame, drop_finished_steps
from flopscope.cost import Phase

__all__ = ["usual_calls"]

_sequence_nr = torch._C._autograd._get_sequence_nr
_current_autograd_node = torch._C._current_autograd_node
_get_ident = threading.get_ident
_grad_enabled = torch.is_grad_enabled
_FORWARD = Phase.FORWARD
_RECOMPUTE = Phase.RECOMPUTE
_OPTIMIZER = Phase.OPTIMIZER


def usual_calls(tracker: Any, original: Callable[..., Any]) -> Callable[..., Any] | None:
    """One function that sees a whole module call, ``call(module, args, kwargs)``, for
    :func:`~flopscope.core.module_calls.listen`: :meth:`~flopscope.core.tracker.ModuleTracker.enter`,
    ``original`` and :meth:`~flopscope.core.tracker.ModuleTracker.leave` in one Python frame for the usual call (the thread that entered the
    Counter, a plain module, nothing returned lazily: what :meth:`enter` and :meth:`leave`
    do for it, inline), the three of them otherwise; ``None`` with a module rule or an
    observer of module calls (each call then goes through :meth:`enter` and :meth:`leave`)."""
    if tracker.module_rules or tracker.on_enter or tracker.on_exit:
        return None
    enter, leave, owner, main, paths, shared = (tracker.enter, tracker.leave, tracker.owner,
                                                tracker.main, tracker.paths, tracker.shared)
    calls, no_grad, kinds, opaque = tracker.calls, tracker.no_grad_modules, KINDS, tracker.opaque
    path_of = tracker.path_of
    stack, seqs, seq_paths = main.stack, main.seqs, main.seq_paths

    def call(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _get_ident() != owner or kinds.get(type(module), 1):  # (not seen yet: 1)
            enter(module, args)
            try:
                out = original(module, *args, **kwargs)
            except BaseException as e:
                leave(module, None, e)
                raise
            leave(module, out, None)
            return out
        if stack:  # enter, inline
            phase = stack[-1].phase
            if phase is _OPTIMIZER:
                drop_finished_steps(stack)
                phase = stack[-1].phase if stack else _FORWARD
        else:
            phase = _RECOMPUTE if _current_autograd_node() is not None else _FORWARD
        path = paths.get(module)
        if path is None or (shared and module in shared):
            path = path_of(module, stack)
        calls[path] += 1
        frame = Frame(module, path, phase)
        if not _grad_enabled() and module._parameters:
            no_grad[module] = no_grad.get(module, 0) + 1
        stack.append(frame)
        seq = _sequence_nr()  # the timeline's mark (see ThreadState)
        if seqs and seqs[-1] == seq:
            seq_paths[-1] = path
        else:
            seqs.append(seq)
            seq_paths.append(path)
        try:
            out = original(module, *args, **kwargs)
        except BaseException as e:
            leave(module, None, e)
            raise
        if not stack or stack[-1] is not frame or type(out) in LAZY:
            leave(module, out, None)
            return out
        stack.pop()  # leave, inline (a usual call: see leave)
        arithmetic, allocations = frame.arithmetic, frame.allocations
        if arithmetic or not allocations:  # (the usual call: arithmetic ran, so not opaque)
            flagged = False
        else:
            flagged = main.shadowing is None and any(isinstance(t, torch.Tensor)
                                                     for t in tree_iter(out))
            if flagged:
                opaque[path] = None
        if stack:  # (what a child adds to its parent: nothing to add when 0)
            parent = stack[-1]
            if arithmetic:
                parent.arithmetic += arithmetic
            if allocations and not flagged:
                parent.allocations += allocations
            path = parent.path
        else:
            path = ""
        seq = _sequence_nr()
        if seqs and seqs[-1] == seq:
            seq_paths[-1] = path
        else:
            seqs.append(seq)
            seq_paths.append(path)
        return out

    return call

