"""The observer protocol: how a feature sees what a Counter counts, without the Counter knowing
the feature.

Roofline time, peak memory, communication, attention figures, generation steps and measured time
are all observers. Every observer has :meth:`CallObserver.on_call`; it may also have
``on_module_enter(path, phase)`` / ``on_module_exit(path, phase)`` (a module of the model starts
or returns, in the thread that entered the Counter) and ``reset()`` (forget an abandoned attempt:
:func:`flopscope.count` calls it before it counts again another way).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from flopscope.cost import Cost, OpCall, Phase

__all__ = ["CallObserver", "reset_observers"]


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
