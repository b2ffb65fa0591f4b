"""The observer protocol: how a feature sees what a Counter counts, without the Counter knowing
the feature.

Roofline time, peak memory, communication, attention figures, generation steps and measured time
are all observers. Every observer has :meth:`CallObserver.on_call`; it may also have
``on_module_enter(path, phase)`` / ``on_module_exit(path, phase)`` (a module of the model starts
or returns, in the thread that entered the Counter), ``on_dtensor_call(path, phase, op, pointwise)``
(an outermost operator on DTensors ran: DTensor's own dispatch, whose local calls ``on_call``
sees; ``pointwise``: the operator carries torch's ``pointwise`` tag)
and ``reset()`` (forget an abandoned attempt: :func:`flopscope.count` calls it before it counts
again another way).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from flopscope.cost import Cost, OpCall, Phase
from flopscope.errors import UsageError

__all__ = ["CallObserver", "checked_observers", "reset_observers"]

_WHAT = ("a list of objects with an on_call(path, phase, op, call, cost) method, e.g. "
         "[flopscope.estimate.CallLog()]")


@runtime_checkable
class CallObserver(Protocol):
    """Sees every operator call that a :class:`~flopscope.Counter` adds to its totals, after it
    is costed.

    ``path`` is the module the call is attributed to, ``phase`` its phase, ``op`` its report name
    (``aten.mm.default``), ``call`` the :class:`OpCall` (``None`` for a module rule's cost of a
    whole module) and ``cost`` what it cost. An operator counted by decomposition is seen once,
    with the summed cost; calls inside a module costed by a module rule are not seen (the rule's
    cost is).
    """

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call."""


def reset_observers(observers: Iterable[object]) -> None:
    """Make observers forget an abandoned attempt (each that has a ``reset`` method): a count
    made again another way reports only the attempt that ran.

    Args:
        observers: the observers.
    """
    for observer in observers:
        reset = getattr(observer, "reset", None)
        if reset is not None:
            reset()


def checked_observers(observers: Any) -> tuple[CallObserver, ...]:
    """The ``observers=`` argument (of a Counter, and so of :func:`flopscope.count`,
    :func:`flopscope.estimate.peak_memory`, ...) as a tuple, each item checked to be an observer,
    before anything runs (``observers=5`` was a bare ``TypeError``, and an item without
    ``on_call`` failed inside the first operator).

    Args:
        observers: what the caller passed (``None`` or empty: no observer).

    Returns:
        The observers.

    Raises:
        UsageError: not a list, one bare observer, or an item without an ``on_call`` method.
    """
    if observers is None:
        return ()
    if callable(getattr(observers, "on_call", None)):
        raise UsageError(f"observers= takes a list: observers=[{type(observers).__name__}(...)], "
                         "not one bare observer")
    if isinstance(observers, (str, bytes)) or not isinstance(observers, Iterable):
        raise UsageError(f"observers= must be {_WHAT}, not {type(observers).__name__} "
                         f"{observers!r}")
    items = tuple(observers)
    for i, item in enumerate(items):
        if not callable(getattr(item, "on_call", None)):
            raise UsageError(f"observers[{i}] is {type(item).__name__} {item!r}, which has no "
                             f"on_call method: observers= must be {_WHAT}")
    return items
