"""What a counted thread is running: the frames of its module calls and optimizer steps, and
the timeline of autograd sequence numbers that attributes a backward node to the module whose
forward made it. :class:`~flopscope.core.tracker.ModuleTracker` pushes and pops them."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from flopscope.core.ledger import Sums
from flopscope.cost import Phase
from flopscope.rules.costed import Costed
from flopscope.rules.user import ModuleRule

__all__ = ["COSTED", "KINDS", "LAZY", "SCRIPTED", "Frame", "ThreadState", "drop_finished_steps",
           "kind_of"]

_FORWARD = Phase.FORWARD
_OPTIMIZER = Phase.OPTIMIZER
#: what a forward may return instead of its result: the work happens later, when it is consumed
LAZY = frozenset({types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, map, filter,
                  zip})
#: module class -> what it is (:func:`kind_of`): 0 for a plain module
KINDS: dict[type, int] = {}
SCRIPTED = 1  #: a TorchScript module (its submodules are not seen)
COSTED = 2  #: a :class:`~flopscope.rules.costed.Costed` function (it may carry its own rule)


def kind_of(cls: type) -> int:
    """What a module class is (``SCRIPTED | COSTED`` bits), kept in :data:`KINDS`."""
    kind = KINDS[cls] = ((SCRIPTED if issubclass(cls, torch.jit.ScriptModule) else 0)
                         | (COSTED if issubclass(cls, Costed) else 0))
    return kind


@dataclass(slots=True)
class Frame:
    """One running module call (or one running ``optimizer.step()``).

    Attributes:
        module: the module (the optimizer, for an optimizer step).
        path: its path in the model (the root ``""`` for an optimizer step).
        phase: forward, recompute (checkpointing) or optimizer.
        rule: the module rule costing this call as a whole, if any.
        args: the positional arguments (given to the module rule).
        arithmetic: operator calls with arithmetic seen inside (itself and below).
        allocations: allocation-only operator calls seen inside (to flag opaque modules).
        shadow: a ruled module's operator-level cost, kept for comparison.
    """

    module: Any
    path: str
    phase: Phase = _FORWARD
    rule: ModuleRule | None = None
    args: tuple[Any, ...] = ()
    arithmetic: int = 0
    allocations: int = 0
    shadow: Sums | None = None


def drop_finished_steps(stack: list[Frame]) -> None:
    """Pop optimizer frames (and what is above them) whose ``step()`` is no longer running: a
    step that raised never calls the post hook. Only called when a module starts inside an
    optimizer frame, which is rare, so walking the Python stack is affordable."""
    running = set()
    f: Any = sys._getframe(1)
    while f is not None:
        running.add(id(f))
        f = f.f_back
    for i, frame in enumerate(stack):
        if frame.phase is _OPTIMIZER and frame.args and id(frame.args[0]) not in running:
            del stack[i:]
            return


class ThreadState:
    """What one counted thread is running: its stack of frames, the outermost running ruled module,
    and the timeline of autograd sequence numbers of its forwards: from ``seqs[i]`` on, nodes are
    created under ``seq_paths[i]``. Each module start and return marks it (inline in
    :meth:`ModuleTracker.enter`, :meth:`~ModuleTracker.leave` and ``_close``); when no node was
    created since the last mark (``no_grad``, or a module that creates none) the last mark is
    replaced, not added to: a lookup takes the last mark at or before a node's number, so the
    answer is the same and the timeline does not grow with every module call."""

    __slots__ = ("seq_paths", "seqs", "shadowing", "stack")

    def __init__(self) -> None:
        self.stack: list[Frame] = []
        self.shadowing: Frame | None = None
        self.seqs: list[int] = []
        self.seq_paths: list[str] = []
