"""flopscope's own tensor work, out of sight of the dispatch modes around a count.

A user may count inside a ``TorchDispatchMode`` of their own (a logger, ``FlopCounterMode``, a
fake tensor mode): that mode must see the operator calls the model makes, exactly those of a plain
forward, and none of flopscope's bookkeeping: the aliases and copies :func:`flopscope.count` makes
to put the model back as it was, the meta or fake copies of a shape-only run, what a rule
computes to cost a call (a quantized layer's packed weight unpacked, a nested tensor's
components), an observer's work. The same holds for a fake tensor mode *below* the counter in a
shape-only run: a rule that reads a real object (a packed weight) must not run it as fake.

- :func:`sets_modes_aside` decorates :func:`flopscope.count`: it runs with the caller's dispatch
  modes set aside, and :func:`caller_modes` puts them back around the model's forward and
  backward only (under the Counter, as before);
- :func:`unseen` and :func:`unseen_calls` run flopscope's work inside a Counter's dispatch with
  the modes below it set aside (the Counter uses them when modes are below it).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, ParamSpec, TypeVar

from torch._C import (
    _len_torch_dispatch_stack,
    _pop_torch_dispatch_stack,
    _push_on_torch_dispatch_stack,
)
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["caller_modes", "sets_modes_aside", "unseen", "unseen_calls"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_LOCAL = threading.local()  # .aside: one list of modes per active sets_modes_aside call


def _set_aside() -> list[Any]:
    """Pop every mode of the dispatch stack (infrastructure modes such as fake tensors' too);
    :func:`_put_back` pushes them again. (PyTorch's ``_disable_current_modes`` does the same and
    also handles pre-dispatch tracing modes, at several times the cost: this runs once per
    operator call of a count with modes below the Counter.)"""
    return [_pop_torch_dispatch_stack(None) for _ in range(_len_torch_dispatch_stack())]


def _put_back(modes: list[Any]) -> None:
    for mode in reversed(modes):
        _push_on_torch_dispatch_stack(mode)


@contextmanager
def unseen() -> Iterator[None]:
    """Within the block no dispatch mode is active; each is put back, in order, on exit."""
    modes = _set_aside()
    try:
        yield
    finally:
        _put_back(modes)


def unseen_calls(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn``, called inside :func:`unseen`."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        modes = _set_aside()
        try:
            return fn(*args, **kwargs)
        finally:
            _put_back(modes)

    return call


def sets_modes_aside(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with the caller's dispatch modes set aside (no cost when there are none);
    inside it, :func:`caller_modes` makes them active again."""

    @functools.wraps(fn)
    def aside(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not _len_torch_dispatch_stack():
            return fn(*args, **kwargs)
        stack: list[list[Any]] = _LOCAL.__dict__.setdefault("aside", [])
        stack.append(_get_current_dispatch_mode_stack())  # bottom first
        try:
            with unseen():
                return fn(*args, **kwargs)
        finally:
            stack.pop()

    return aside


@contextmanager
def caller_modes() -> Iterator[None]:
    """Within the block, the dispatch modes set aside by the innermost :func:`sets_modes_aside`
    call of this thread are active again, in their order, on top of any entered since."""
    stack: list[list[Any]] = getattr(_LOCAL, "aside", [])
    if not stack or not stack[-1]:
        yield
        return
    with ExitStack() as entered:
        for mode in stack[-1]:
            entered.enter_context(mode)
        yield
