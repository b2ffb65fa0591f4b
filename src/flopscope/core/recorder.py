"""The per-operator hot path: attribute a call to a module and a phase, cost it, add it to the
ledger and show it to the observers.

Which module is running comes from the tracker (:mod:`flopscope.core.tracker`), what a call costs
from :class:`~flopscope.core.costing.Costing`, where it is added up from the
:class:`~flopscope.core.ledger.Ledger`. The dispatch mode (:mod:`flopscope.core.mode`) calls
:meth:`Recorder.record` for every operator call; the tracker calls
:meth:`Recorder.apply_module_rule` when a module with a module rule returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from flopscope.core.call_guards import call_key
from flopscope.core.comm import CommLog
from flopscope.core.cost_memo import KEY_LATER
from flopscope.core.costing import Costing, OpEntry, may_be_nonzero
from flopscope.core.dtensor import DTensorLedger
from flopscope.core.frames import Frame
from flopscope.core.ledger import Ledger, decomposed_key
from flopscope.core.observers import CallObserver
from flopscope.core.tracker import ModuleTracker
from flopscope.cost import Cost, OpCall, Phase
from flopscope.errors import FlopscopeError, RuleError, StrictModeError
from flopscope.rules.collectives import is_collective
from flopscope.rules.user import as_cost, rule_name

__all__ = ["Recorder"]

_FORWARD = Phase.FORWARD
_BACKWARD = Phase.BACKWARD
_RECOMPUTE = Phase.RECOMPUTE
_get_ident = threading.get_ident
_Tensor = torch.Tensor
_current_autograd_node = torch._C._current_autograd_node
_ZERO = Cost()


class Recorder:
    """Costs and adds up the calls of one Counter.

    Args:
        tracker: the Counter's module tracker.
        costing: its rules.
        observers: objects that see every costed call.
        strict: raise at the first operator with no rule.
    """

    def __init__(self, tracker: ModuleTracker, costing: Costing,
                 observers: tuple[CallObserver, ...], strict: bool) -> None:
        self.tracker = tracker
        self.costing = costing
        self.remembered = costing.remembered  # (bound once: read on every remembered call)
        self.observers = observers
        # observers that also see each outermost operator on DTensors (``on_dtensor_call``)
        self.dtensor_observers = tuple(o for o in observers if hasattr(o, "on_dtensor_call"))
        self.strict = strict
        self.ledger = Ledger()
        self.dtensor = DTensorLedger()  # work inside DTensor operators, logical costs
        self.comm: CommLog | None = None  # the communication log, once a collective ran
        self.originals: dict[int, torch.Tensor] = {}  # id(stand-in) -> original (stand_ins)
        self.in_rule = False  # a module rule is running: its tensor arithmetic is not counted
        self.memo = True  # look calls up in the shape-only memo (off for a run on real tensors)
        self.pieces: list[tuple[Any, Cost, bool]] | None = None  # a running decomposition's
        self.main = tracker.main  # the entering thread's state, read on the hot path
        self.owner: int | None = None  # the entering thread's id

    def entry(self, func: Any) -> OpEntry:
        """The operator's entry (see :meth:`Costing.entry`); the first collective starts the
        communication log, which observes every call from then on."""
        found = self.costing.entry(func)
        if self.comm is None and is_collective(func):
            self.comm = CommLog()
            self.observers = (*self.observers, self.comm)
        return found

    # -- module rules ---------------------------------------------------------------------------
    def apply_module_rule(self, frame: Frame, output: Any) -> None:
        """A ruled module returned: cost it as a whole by its rule."""
        fn = frame.rule
        assert fn is not None
        where = f"module '{frame.path}' ({type(frame.module).__name__})"
        name = rule_name(fn)
        self.in_rule = True  # tensor arithmetic inside the rule is the rule's, not the model's
        try:
            try:
                result = fn(frame.module, frame.args, output)
            except FlopscopeError:
                raise
            except Exception as e:
                raise RuleError(
                    f"module rule {name} raised for {where}: {type(e).__name__}: {e}; fix "
                    "the rule (it is called as rule(module, inputs, output), inputs being the "
                    "positional arguments)"
                ) from e
            cost = as_cost(result, f"module rule {name} for {where}")
        finally:
            self.in_rule = False
        if min(cost.macs, cost.flops, cost.bytes_read, cost.bytes_written) < 0:
            raise RuleError(f"module rule {name} for {where} returned a negative cost: {cost}")
        self.ledger.add_rule(frame.path, name, not isinstance(result, Cost), cost, frame.shadow)
        op = f"module_rule:{type(frame.module).__name__}"
        self.ledger.add((frame.path, op, frame.phase), cost)
        for observer in self.observers:
            observer.on_call(frame.path, frame.phase, op, None, cost)

    # -- decompositions -------------------------------------------------------------------------
    def decomposed(self, mode: Any, func: Any, entry: OpEntry, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        """Run ``func`` as its decomposition with the pieces counted under ``func``; returns its
        output, or ``NotImplemented`` when the decomposition does not apply here (then the
        caller runs ``func`` itself, which is reported as uncounted)."""
        if self.in_rule:
            return NotImplemented
        run: Callable[..., Any] = entry.decomposition
        if self.pieces is not None:  # a piece of a decomposition: its pieces go to the outer one
            with mode:
                return run(*args, **kwargs)
        pieces: list[tuple[Any, Cost, bool]] = []
        self.pieces = pieces
        try:
            with mode:
                out = run(*args, **kwargs)
        except FlopscopeError:
            raise
        except Exception:  # e.g. a decomposition that needs values a fake tensor does not have
            out = NotImplemented
        finally:
            self.pieces = None
        if out is NotImplemented:
            return NotImplemented
        macs = flops = 0
        for piece, cost, counted in pieces:
            if counted:
                macs += cost.macs
                flops += cost.flops
            else:  # nothing covers this piece: listed as uncounted under its own name
                self.record(piece, self.entry(piece), (), {}, None, (Cost(), False))
        read, written = OpCall(func, args, kwargs, out, _FORWARD, entry.facts.view).io_bytes()
        self.record(func, entry, args, kwargs, out, (Cost(macs, flops, read, written), True))
        return out

    # -- the per-operator hot path ------------------------------------------------------------
    def record(self, func: Any, entry: OpEntry, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any, decomposed: tuple[Cost, bool] | None = None,
               memo: tuple[Any, ...] | None = None) -> None:
        """Cost one operator call and add it under (module path, operator, phase).

        ``decomposed`` is given by :meth:`decomposed`: the summed cost of a decomposition's
        pieces (``True``: counted) or an uncounted piece (``False``). ``memo`` is the call's key
        when its cost depends on argument metadata alone (meta tensors, see
        :mod:`flopscope.core.memo`; real tensors: :data:`~flopscope.core.cost_memo.KEY_LATER`,
        keyed here once the module is known, :mod:`flopscope.core.call_guards`): a default rule's
        cost is then computed once per key and phase."""
        if self.in_rule:
            return
        f = entry.facts
        if f.ignored:
            return
        st = self.main if _get_ident() == self.owner else self.tracker.state()
        stack = st.stack
        node = _current_autograd_node()
        if node is None:
            if stack:
                frame = stack[-1]
                path = frame.path
                phase = frame.phase
            else:
                frame = None
                path = ""
                phase = _FORWARD
            shadowing = st.shadowing
        elif stack and stack[-1].phase is _RECOMPUTE:  # checkpointing reruns a forward
            frame = stack[-1]
            path = frame.path
            phase = _RECOMPUTE
            shadowing = st.shadowing
        else:
            phase = _BACKWARD
            frame = None
            path = self.tracker.backward_path(node, st)
            shadowing = None
        hit = None
        if memo is KEY_LATER:  # a call on real tensors: keyed now that its module is known
            cell = call_key(func, frame.module if frame is not None else None, args, kwargs, out)
            if cell is None:
                memo = None
            elif cell[1] is entry.rule and cell[2] is phase:  # remembered with its template
                memo = cell[0]
                hit = cell[3]
            else:
                memo = cell[0]
                hit = self.remembered(entry, memo, phase)
                if hit is not None:
                    cell[1:] = entry.rule, phase, hit
        elif memo is not None:
            hit = self.remembered(entry, memo, phase)
        key: Any = f
        if decomposed is not None:
            cost, counted = decomposed
            if counted:
                key = decomposed_key(f)  # the decomposed operator's own record
        elif hit is not None:
            cost = hit
            counted = True
            if self.pieces is not None:  # part of a decomposition: added up by decomposed()
                self.pieces.append((func, cost, True))
                return
        elif entry.rule is None:
            counted = False
            call = OpCall(func, args, kwargs, out, phase, f.view)
            if self.strict and shadowing is None:
                raise StrictModeError(
                    f"no rule for operator {func} (called in module '{path}', {phase.value}, "
                    f"inputs {call.input_shapes()}) and no decomposition; "
                    f"add one with rules={{'{func._schema.name}': fn}}, or count with "
                    "strict=False to list it in Report.uncounted"
                )
            if self.pieces is not None:  # part of a decomposition: listed by decomposed()
                self.pieces.append((func, _ZERO, False))
                return
            read, written = call.io_bytes()
            cost = Cost(0, 0, read, written)
        else:
            counted = True
            cost = self.costing.cost(entry, OpCall(func, args, kwargs, out, phase, f.view),
                                     path, memo)
            if self.pieces is not None:  # part of a decomposition: added up by decomposed()
                self.pieces.append((func, cost, True))
                return
        if frame is not None:
            fl = cost.flops
            if not counted or (fl != 0 if type(fl) is int else may_be_nonzero(fl)):
                frame.arithmetic += 1
            elif f.allocation:
                frame.allocations += 1
        if shadowing is not None:
            sh = shadowing.shadow
            assert sh is not None
            sh.add(cost)
            return
        self.ledger.add((path, key, phase), cost)
        if self.observers:
            if self.originals:  # observers see the model's own tensors, not their stand-ins
                args, kwargs, out = tree_map_only(_Tensor, self._original, (args, kwargs, out))
            seen = OpCall(func, args, kwargs, out, phase, f.view)
            for observer in self.observers:
                observer.on_call(path, phase, f.name, seen, cost)

    def _original(self, t: torch.Tensor) -> torch.Tensor:
        return self.originals.get(id(t), t)

    def record_logical(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                       out: Any) -> None:
        """Add the logical (global-shape) cost of an operator on DTensors under the module and
        phase it ran in."""
        if self.in_rule:
            return
        entry = self.entry(func)
        f = entry.facts
        if f.ignored:
            return
        st = self.main if _get_ident() == self.owner else self.tracker.state()
        stack = st.stack
        node = _current_autograd_node()
        if node is None or (stack and stack[-1].phase is _RECOMPUTE):
            path, phase = (stack[-1].path, stack[-1].phase) if stack else ("", _FORWARD)
            if st.shadowing is not None:
                return
        else:
            phase = _BACKWARD
            path = self.tracker.backward_path(node, st)
        call = OpCall(func, args, kwargs, out, phase, f.view)
        if entry.rule is None:
            read, written = call.io_bytes()
            cost = Cost(0, 0, read, written)
        else:
            cost = self.costing.cost(entry, call, path, logical=True)
        self.dtensor.add_logical((path, f, phase), cost)
        for observer in self.dtensor_observers:
            observer.on_dtensor_call(path, phase, f.name, f.pointwise)
