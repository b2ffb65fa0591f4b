"""The counter: a dispatch mode that sees every operator call, costs it with its rule and adds the
cost under (module path, operator, phase).

Which module made a call comes from :mod:`flopscope.core.tracker`; what a call costs from
:mod:`flopscope.rules`; how a model is run (real / fake / meta, state restored) from
:mod:`flopscope.run`. This module is the hot path between them.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import nn
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode_stack,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_map_only

from flopscope.core.comm import CommLog
from flopscope.core.decompose import decomposition, runs_decomposed
from flopscope.core.dtensor import DTensorLedger, in_sharding_propagation, is_dtensor_call
from flopscope.core.integrity import WRITTEN_ARGUMENTS, WriteGuard
from flopscope.core.memo import OUTPUTS as _OUTPUTS
from flopscope.core.memo import SELF as _SELF
from flopscope.core.memo import outputs_of as _outputs_of
from flopscope.core.memo import remember as _remember
from flopscope.core.memo import replay as _replay
from flopscope.core.memo import replays_fake as _replays_fake
from flopscope.core.memo import signature as _signature
from flopscope.core.modes import TRAINING_ADVICE, mode_dependent, warn_training_mode
from flopscope.core.numbers import in_real_numbers
from flopscope.core.params import ParamStats, param_table
from flopscope.core.replay import ModuleReplay, replaying
from flopscope.core.settings import eager_flex_attention
from flopscope.core.tracker import Frame, ModuleTracker, Sums
from flopscope.cost import Cost, OpCall, Phase, nested_parts
from flopscope.errors import (
    FlopscopeError,
    FlopscopeWarning,
    RuleError,
    StrictModeError,
    UsageError,
)
from flopscope.report.records import CommRecord, OpRecord, RuleRecord
from flopscope.report.report import Report
from flopscope.rules import default_rules
from flopscope.rules.collectives import is_collective
from flopscope.rules.registry import ADJUSTED_RULES, Rule
from flopscope.rules.user import RulesArg, as_cost, rule_name, split_rules

__all__ = ["Counter"]

_FORWARD = Phase.FORWARD
_BACKWARD = Phase.BACKWARD
_RECOMPUTE = Phase.RECOMPUTE
_get_ident = threading.get_ident
_dtype = torch.dtype
_Tensor = torch.Tensor
_current_autograd_node = torch._C._current_autograd_node
_modes_below = torch._C._len_torch_dispatch_stack
# id(operator overload) -> (report name, is a view, is an allocation, is ignored, the overload):
# facts that do not depend on the rules, shared by every Counter (the overload is kept alive, so
# its id is not reused)
_FACTS: dict[int, tuple[str, bool, bool, bool, Any]] = {}
# rule, report name, is a view, is an allocation, is ignored, the overload, decomposition
_OpInfo = tuple[Rule | None, str, bool, bool, bool, Any, Callable[..., Any] | None]
_ZERO = Cost()
# tuple of tensor subclasses in a call -> whether the call is left to the subclass (see _defers)
_DEFERS: dict[tuple[type, ...], bool] = {}
_TRANSPARENT: tuple[type, ...] = (FakeTensor, FunctionalTensor)
# id(phase) -> memo key -> (rule, cost) of a call on plain meta tensors whose rule is a default
# rule (see _record, flopscope.core.memo): shared by every Counter, as a default rule's cost depends on
# the call's metadata and phase alone; a hit counts only where the Counter's rule for the operator
# is that same rule (not where a user's rule replaces it). Those keys end with the default dtype;
# other keys (a symbolic count's fake tensors, whose rules may add guards to that count's shape
# environment) are memoised per Counter.
_MEMO_COSTS: dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]] = {id(p): {} for p in Phase}
_MEMO_LIMIT = 200_000  # entries per phase before the memo starts over
_ALLOCATIONS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::zeros", "aten::zeros_like", "aten::new_zeros",
})


def _nonzero(n: Any) -> bool:
    """Whether a symbolic cost field may be nonzero, without a guard: on a data-dependent size
    (``u0`` from ``nonzero``) no guard can be made (it refused any count where such a size
    reached a FLOP), and on input sizes it only added guards such as ``Ne(72*batch, 0)`` to the
    shape environment. Not known to be 0: not zero."""
    return not statically_known_true(n == 0)


class CallObserver(Protocol):
    """Sees every operator call that a :class:`Counter` adds to its totals, after it is costed.

    ``path`` is the module the call is attributed to, ``phase`` its phase, ``op`` its report name
    (``aten.mm.default``), ``call`` the :class:`OpCall` (``None`` for a module rule's cost of a
    whole module) and ``cost`` what it cost. An operator counted by decomposition is seen once,
    with the summed cost; calls inside a module costed by a module rule are not seen (the rule's
    cost is). Used by :mod:`flopscope.estimate` (roofline time, peak memory). An observer may
    also have a ``reset()`` method: :func:`flopscope.count` calls it when it abandons an attempt
    (a meta-device forward that has to rerun on fake CPU tensors) before counting again.
    """

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call."""


class _RuleSums:
    """A ruled module's calls, what its rule said, and what its operators measured."""

    __slots__ = ("macs_only", "name", "rule", "shadow")

    def __init__(self, name: str, macs_only: bool) -> None:
        self.name = name
        self.macs_only = macs_only
        self.rule = Sums()
        self.shadow = Sums()


def _cost(sums: Sums) -> Cost:
    # one call (most entries of a forward): its own cost, not a new one (plain integers only:
    # comparing symbolic sizes would add guards)
    first = sums.first
    macs, flops, read, written = sums.macs, sums.flops, sums.bytes_read, sums.bytes_written
    if (first is not None and type(macs) is int and type(flops) is int and type(read) is int
            and type(written) is int and first.macs == macs and first.flops == flops
            and first.bytes_read == read and first.bytes_written == written):
        return first  # type: ignore[no-any-return]
    return Cost(sums.macs, sums.flops, sums.bytes_read, sums.bytes_written)


def _summed(fn: Rule, parts: list[OpCall]) -> Cost | None:
    """The sum of a rule's costs of the parts of a nested call; ``None`` if it fails on a part."""
    total = Cost()
    try:
        for part in parts:
            cost = fn(part)
            total = total + (cost if type(cost) is Cost else as_cost(cost, rule_name(fn)))
    except Exception:  # reported by the caller as the rule's failure on the whole call
        return None
    return total


def _defers(types: tuple[type, ...]) -> bool:
    """Whether a call on tensors of these subclasses is left to the subclass, so that the work
    it does on its inner tensors reaches the counter: wrapper subclasses such as jagged nested
    tensors and DTensor (their inner operators are what runs, on the real shapes: a nested
    tensor's packed values, a DTensor's local shard). Fake and functional tensors are not
    wrappers of this kind and are counted where they stand."""
    found = _DEFERS.get(types)
    if found is None:
        found = any(is_traceable_wrapper_subclass_type(t) and not issubclass(t, _TRANSPARENT)
                    for t in types)
        _DEFERS[types] = found
    return found


class _Mode(TorchDispatchMode):
    # higher-order operators (flex_attention, cond, ...) reach __torch_dispatch__ too
    supports_higher_order_operators = True

    def __init__(self, counter: Counter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.record = counter._record
        self.ops = counter._ops
        self.op_info = counter._op_info
        self.decomposed = counter._decomposed
        self.counter = counter
        self.guard = counter._write_guard.before if counter._write_guard is not None else None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if types and _defers(types):
            if is_dtensor_call(types):
                return self._dtensor(func, args, kwargs)
            return NotImplemented
        counter = self.counter
        if counter._dtensor.depth and in_sharding_propagation():
            return func(*args, **kwargs)  # global-shape metadata propagation: no rank's work
        info = self.ops.get(id(func)) or self.op_info(func)
        if self.guard is not None:  # count(): keep the model's tensors as they were
            written = WRITTEN_ARGUMENTS.get(id(func))
            if written is None or written:  # unknown yet, or it writes to an argument
                self.guard(func, args, kwargs)
        if info[6] is not None:  # no rule, but a decomposition: count its pieces instead
            out = self.decomposed(self, func, info, args, kwargs)
            if out is not NotImplemented:
                return out
        # meta tensors: outputs and cost depend on metadata alone (flopscope.core.memo)
        memo = _signature(id(func), args, kwargs)
        if memo is not None:
            # outputs made from memory only when no other dispatch mode is below this one (it
            # would not see the call: FlopCounterMode around a Counter), save a symbolic count's
            # own fake mode (flopscope.core.memo.replays_fake)
            made = _OUTPUTS.get(memo) if not _modes_below() or _replays_fake(memo) else None
            if made is not None:
                out = args[0] if made is _SELF else _replay(made)
                self.record(func, info, args, kwargs, out, None, memo)
                return out
            out = func(*args, **kwargs)
            made = _outputs_of(func, args, out)
            if made is None:
                memo = None
            elif made is not False:
                _remember(memo, made)
            self.record(func, info, args, kwargs, out, None, memo)
            return out
        out = func(*args, **kwargs)
        self.record(func, info, args, kwargs, out)
        return out

    def _dtensor(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An operator on DTensors (:mod:`flopscope.core.dtensor`): left to DTensor, whose work on the
        local shards and collectives reach this mode as the rank's work, and costed once more at
        its global shapes for the logical figure. The outermost DTensor call is run again with
        this mode pushed, marked so that the mode leaves it to DTensor when it comes back
        (``passing``); the work inside it is accumulated apart, as the part of the rank's work
        that the logical figure replaces."""
        counter = self.counter
        ledger = counter._dtensor
        if ledger.passing:
            ledger.passing = False
            return NotImplemented
        if ledger.depth:  # a DTensor call inside another: only the outer one is logical
            return NotImplemented
        outer = counter._acc
        counter._acc = ledger.target(args, kwargs)
        ledger.depth += 1
        ledger.passing = True
        try:
            with self:
                out = func(*args, **kwargs)
        finally:
            ledger.passing = False
            ledger.depth -= 1
            counter._acc = outer
        counter._record_logical(func, args, kwargs, out)
        return out


class Counter:
    """Count every operator that runs inside a ``with`` block.

    Example::

        with flopscope.Counter(model) as counter:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        print(counter.report)

    Operators are attributed to the innermost module running (paths relative to ``model``; the
    root is ``""``; work outside any module, such as a functional loss, is the root's own cost,
    and a module that is not part of the model, such as a loss module, gets a row named after its
    class below the module running when it is called: ``CrossEntropyLoss`` at the top level,
    forward and backward). A module registered under several paths
    is charged under the path it was called through. Operators run by ``backward()`` are
    attributed to the module whose forward built them, in the backward phase; a forward that
    activation checkpointing recomputes inside backward is charged to the recomputed modules in
    the recompute phase; work inside ``optimizer.step()`` (any ``torch.optim`` optimizer) is the
    root's, in the optimizer phase. Entering the same Counter again adds to its counts.

    Threads: a Counter counts the thread that entered it (and autograd's worker threads during a
    backward it started). Work in other threads is not counted, and other Counters in other
    threads never see this one's modules; to count a worker thread, run the work inside
    ``with counter.attach():`` in that thread.

    Args:
        model: the model whose module paths and parameters the report uses. Modules that are not
            part of it get paths named after their class. ``None`` counts without a model.
        rules: extra rules (see :func:`flopscope.rules.user.split_rules`): operator rules on top
            of the defaults, and module rules that cost a module as a whole.
        strict: raise :class:`~flopscope.errors.StrictModeError` at the first operator with no rule.
        warn: emit one :class:`~flopscope.errors.FlopscopeWarning` on exit when operators went
            uncounted or modules look opaque, or when layers whose cost depends on the training
            flag (batch norm, dropout: :mod:`flopscope.core.modes`) ran in training mode and no
            backward did (a training-mode forward outside a training step).
        mode_warning: with ``warn``, warn about the training mode as above (``count(train=...)``
            passes ``False``: the caller chose the mode).
        observers: objects that see every costed call (:class:`CallObserver`).

    Raises:
        UsageError: ``model`` is not an ``nn.Module``.
        RuleError: a rule is malformed or names a module path the model does not have.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        rules: RulesArg = None,
        strict: bool = False,
        warn: bool = True,
        observers: Sequence[CallObserver] = (),
        mode_warning: bool = True,
    ) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise UsageError(
                f"Counter(model=...) takes an nn.Module, not {type(model).__name__}; pass the model "
                "whose modules should be named in the report, or nothing"
            )
        self.model = model
        self.strict = strict
        self.warn = warn
        self.mode_warning = mode_warning
        self._rules, module_rules = split_rules(rules)
        self._observers = tuple(observers)
        self._originals: dict[int, torch.Tensor] = {}  # id(stand-in) -> original (stand_ins)
        self._tracker = ModuleTracker(model, module_rules, self._apply_module_rule,
                                      self._active_here)
        self._main = self._tracker.main  # the entering thread's state, read on the hot path
        self._owner: int | None = None  # the entering thread's id
        # count() only: copy on write of the model's parameters (see protect)
        self._write_guard: WriteGuard | None = None
        self._in_rule = False
        # (module path, id of the operator overload or a module-rule name, phase) -> sums
        self._acc: dict[tuple[str, int | str, Phase], Sums] = {}
        self._rule_acc: dict[str, _RuleSums] = {}
        # id(operator overload) -> _op_info (ids: an OpOverload's __hash__ is Python code)
        self._ops: dict[int, _OpInfo] = {}
        self._pieces: list[tuple[Any, Cost, bool]] | None = None  # a decomposition's, while it runs
        # id(operator overload) -> whether its rule's costs may be memoised (see _MEMO_COSTS);
        # this Counter's own memo of costs, for keys that are not process-wide
        self._memo_rules: dict[int, bool] = {}
        self._memo_costs: dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]] = {
            id(p): {} for p in Phase}
        self._mode: _Mode | None = None
        self.failed_in: str | None = None
        self._dtensor = DTensorLedger()  # work inside DTensor operators, logical costs
        self._comm: CommLog | None = None  # the communication log, once a collective ran
        self._module_replay: ModuleReplay | None = None  # a symbolic count's (_module_replay)

    @property
    def modules(self) -> list[nn.Module]:
        """The model's modules (``named_modules()`` order); empty without a model."""
        return self._tracker.modules

    @property
    def running(self) -> str | None:
        """The path of the innermost module running now (``None`` when none is)."""
        return self._tracker.innermost

    @property
    def uninitialized(self) -> list[str]:
        """Paths of the model's lazy modules whose parameters were not initialised yet when
        this Counter was made (``nn.LazyLinear`` before its first forward)."""
        return self._tracker.uninitialized

    @property
    def observed(self) -> bool:
        """Whether observers (:class:`CallObserver`) see this Counter's calls."""
        return bool(self._observers)

    def module_type(self, path: str) -> str:
        """The class name of the module at ``path`` (``"?"`` when unknown)."""
        return self._tracker.types.get(path, "?")

    def failed_in_module(self, exc: BaseException) -> str | None:
        """The innermost module in which ``exc`` was raised while this Counter was active (also
        after the module stack has unwound), or ``None``."""
        return self._tracker.failed_in(exc)

    # -- threads --------------------------------------------------------------------------------
    def _active_here(self) -> bool:
        """Whether this Counter's dispatch mode is active on the calling thread."""
        return any(isinstance(m, _Mode) and m.counter is self
                   for m in _get_current_dispatch_mode_stack())

    @contextmanager
    def attach(self) -> Iterator[Counter]:
        """Count the calling thread too, while the ``with`` block runs (use it in a worker thread
        that runs part of the work of an active Counter)::

            def worker():
                with counter.attach():
                    model(x)

        Its modules get their own stack, so threads never mix their module paths.

        Yields:
            This Counter.

        Raises:
            UsageError: the Counter is not active.
        """
        if self._mode is None:
            raise UsageError("Counter.attach() needs an active Counter: call it inside its with block")
        mode = _Mode(self)
        with mode:
            try:
                yield self
            finally:
                self._tracker.states.pop(_get_ident(), None)

    # -- stand-ins (count()) ----------------------------------------------------------------------
    def stand_ins(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Show observers each original tensor wherever a call has its stand-in: used by
        :func:`flopscope.count`, which runs a real model shape-only on ``meta`` copies of its
        parameters and buffers, so that an observer that follows tensors' storages (peak memory:
        the parameters it registered before the count) sees the model's own tensors. The rules
        and the counts see the calls as they ran.

        Args:
            pairs: (stand-in, original) pairs; the stand-ins must stay alive while counting.
        """
        self._originals = {id(copy): original for copy, original in pairs}

    def _original(self, t: torch.Tensor) -> torch.Tensor:
        return self._originals.get(id(t), t)

    # -- model integrity (count()) --------------------------------------------------------------
    def protect(self, tensors: list[torch.Tensor]) -> None:
        """Keep ``tensors`` as they were: each is saved just before an operator first writes to
        it (copy on write, :mod:`flopscope.core.integrity`); :meth:`restore` puts them back. Used by
        :func:`flopscope.count` for real runs; call it before the Counter is entered."""
        self._write_guard = WriteGuard(tensors)

    def restore(self) -> int:
        """Put back every protected tensor an operator wrote to; returns how many."""
        return self._write_guard.restore() if self._write_guard is not None else 0

    @property
    def no_grad_calls(self) -> int:
        """Calls of modules with trainable parameters that ran with grad disabled (a reentrant
        checkpoint's forward)."""
        return self._tracker.no_grad_calls

    # -- module rules ---------------------------------------------------------------------------
    def _apply_module_rule(self, frame: Frame, output: Any) -> None:
        fn = frame.rule
        assert fn is not None
        where = f"module '{frame.path}' ({type(frame.module).__name__})"
        name = rule_name(fn)
        self._in_rule = True  # tensor arithmetic inside the rule is the rule's, not the model's
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
            self._in_rule = False
        if min(cost.macs, cost.flops, cost.bytes_read, cost.bytes_written) < 0:
            raise RuleError(f"module rule {name} for {where} returned a negative cost: {cost}")
        sums = self._rule_acc.get(frame.path)
        if sums is None:
            sums = _RuleSums(name, not isinstance(result, Cost))
            self._rule_acc[frame.path] = sums
        sums.rule.calls += 1
        sums.rule.add(cost)
        if frame.shadow is not None:
            sums.shadow.add(frame.shadow)
        op = f"module_rule:{type(frame.module).__name__}"
        self._add((frame.path, op, frame.phase), cost)
        for observer in self._observers:
            observer.on_call(frame.path, frame.phase, op, None, cost)

    # -- the per-operator hot path ------------------------------------------------------------
    def _add(self, key: tuple[str, int | str, Phase], cost: Cost) -> None:
        """Add one call costing ``cost`` under ``key`` (module path, operator id or module-rule
        name, phase)."""
        sums = self._acc.get(key)
        if sums is None:  # the first call: its cost itself (adding to 0 costs SymInt arithmetic)
            sums = self._acc[key] = Sums()
            sums.first = cost
            sums.calls = 1
            sums.macs = cost.macs
            sums.flops = cost.flops
            sums.bytes_read = cost.bytes_read
            sums.bytes_written = cost.bytes_written
            return
        sums.calls += 1
        sums.macs += cost.macs
        sums.flops += cost.flops
        sums.bytes_read += cost.bytes_read
        sums.bytes_written += cost.bytes_written

    def _add_calls(self, key: tuple[str, int | str, Phase], calls: int, cost: Cost) -> None:
        """Add ``calls`` calls costing ``cost`` in all under ``key`` (a replayed module's records,
        flopscope.core.replay)."""
        sums = self._acc.get(key)
        if sums is None:
            self._add(key, cost)
            self._acc[key].calls = calls
            return
        sums.calls += calls
        sums.add(cost)

    def _op_info(self, func: Any) -> _OpInfo:
        """What the hot path needs to know about an operator, worked out once per operator:
        its rule, its report name, whether it is a view, whether it is an allocation, whether
        to ignore it (``prim::`` metadata queries such as ``prim::device``, made by fake tensors),
        the overload itself, and, for an operator with no rule, its decomposition (or None)."""
        facts = _FACTS.get(id(func))
        if facts is None or facts[-1] is not func:
            if isinstance(func, HigherOrderOperator):
                facts = (f"higher_order.{func.name()}", False, False, False, func)
            else:
                is_view = any(r.alias_info is not None and not r.alias_info.is_write
                              for r in func._schema.returns)
                facts = (str(func), is_view, func._schema.name in _ALLOCATIONS,
                         func.namespace == "prim", func)
            _FACTS[id(func)] = facts
        fn = self._rules.find(func)
        if self._comm is None and is_collective(func):  # communication is logged from now on
            self._comm = CommLog()
            self._observers = (*self._observers, self._comm)
        decomp = None
        if not facts[3]:
            decomp = decomposition(func)
            if fn is not None and not (runs_decomposed(func) and fn is default_rules().find(func)):
                decomp = None  # a rule wins, except a default rule on a composite operator
        info = (fn, *facts, decomp)
        self._ops[id(func)] = info
        return info

    def _memoizable(self, func: Any, fn: Rule) -> bool:
        """Whether ``fn``'s costs for ``func`` may be memoised per argument metadata: default
        rules only (a user's rule may keep state or read more than its call)."""
        ok = self._memo_rules.get(id(func))
        if ok is None:
            ok = fn is default_rules().find(func)
            self._memo_rules[id(func)] = ok
        return ok

    def _decomposed(
        self, mode: _Mode, func: Any, info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run ``func`` as its decomposition with the pieces counted under ``func``; returns its
        output, or ``NotImplemented`` when the decomposition does not apply here (then the
        caller runs ``func`` itself, which is reported as uncounted)."""
        if self._in_rule:
            return NotImplemented
        if self._pieces is not None:  # a piece of a decomposition: its pieces go to the outer one
            with mode:
                return info[6](*args, **kwargs)  # type: ignore[misc]
        pieces: list[tuple[Any, Cost, bool]] = []
        self._pieces = pieces
        try:
            with mode:
                out = info[6](*args, **kwargs)  # type: ignore[misc]
        except FlopscopeError:
            raise
        except Exception:  # e.g. a decomposition that needs values a fake tensor does not have
            out = NotImplemented
        finally:
            self._pieces = None
        if out is NotImplemented:
            return NotImplemented
        macs = flops = 0
        for piece, cost, counted in pieces:
            if counted:
                macs += cost.macs
                flops += cost.flops
            else:  # nothing covers this piece: listed as uncounted under its own name
                self._record(piece, self._ops[id(piece)], (), {}, None, (Cost(), False))
        read, written = OpCall(func, args, kwargs, out, _FORWARD, info[2]).io_bytes()
        self._record(func, info, args, kwargs, out, (Cost(macs, flops, read, written), True))
        return out

    def _record(self, func: Any, info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any],
                out: Any, decomposed: tuple[Cost, bool] | None = None,
                memo: tuple[Any, ...] | None = None) -> None:
        """Cost one operator call and add it under (module path, operator, phase).

        ``decomposed`` is given by :meth:`_decomposed`: the summed cost of a decomposition's
        pieces (``True``: counted) or an uncounted piece (``False``). ``memo`` is the call's key
        when its cost depends on argument metadata alone (meta tensors, see
        :mod:`flopscope.core.memo`): a default rule's cost is then computed once per key and phase."""
        if self._in_rule:
            return
        fn, _, is_view, is_alloc, ignored, _, _ = info
        if ignored:
            return
        st = self._main if _get_ident() == self._owner else self._tracker.state()
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
            path = self._tracker.backward_path(node, st)
            shadowing = None
        key: int = id(func)
        if decomposed is not None:
            cost, counted = decomposed
            if counted:
                key = -key  # the decomposed operator's own record
        elif (memo is not None
              and (hit := (_MEMO_COSTS if type(memo[-1]) is _dtype else self._memo_costs)[
                  id(phase)].get(memo)) is not None
              and hit[0] is fn):
            cost = hit[1]
            counted = True
            if self._pieces is not None:  # part of a decomposition: added up by _decomposed
                self._pieces.append((func, cost, True))
                return
        else:
            call = OpCall(func, args, kwargs, out, phase, is_view)
            if fn is None:
                counted = False
                if self.strict and shadowing is None:
                    raise StrictModeError(
                        f"no rule for operator {func} (called in module '{path}', {phase.value}, "
                        f"inputs {call.input_shapes()}) and no decomposition; "
                        f"add one with rules={{'{func._schema.name}': fn}}, or count with "
                        "strict=False to list it in Report.uncounted"
                    )
                if self._pieces is not None:  # part of a decomposition: listed by _decomposed
                    self._pieces.append((func, _ZERO, False))
                    return
                read, written = call.io_bytes()
                cost = Cost(0, 0, read, written)
            else:
                counted = True
                try:
                    cost = fn(call)
                except FlopscopeError:
                    raise
                except Exception as e:
                    parts = nested_parts(call)  # a rule written for dense tensors, on nested
                    summed = _summed(fn, parts) if parts is not None else None
                    if summed is not None:
                        cost = summed
                    else:
                        raise RuleError(
                            f"rule {rule_name(fn)} for operator {func} failed in module '{path}' "
                            f"(inputs {call.input_shapes()}): {type(e).__name__}: {e}"
                        ) from e
                if type(cost) is not Cost:
                    cost = as_cost(cost, f"rule {rule_name(fn)} for operator {func} in module '{path}'")
                flops = cost.flops  # on symbolic sizes: no guard (see _nonzero)
                if (flops if type(flops) is int else _nonzero(flops)) and fn in ADJUSTED_RULES:
                    # a default rule: integer work is not FLOPs, complex work is counted in
                    # real operations (flopscope.core.numbers)
                    cost = in_real_numbers(call, cost, info[1])
                if memo is not None and self._memoizable(func, fn):
                    memo_costs = (_MEMO_COSTS if type(memo[-1]) is _dtype
                                  else self._memo_costs)[id(phase)]
                    if len(memo_costs) >= _MEMO_LIMIT:
                        memo_costs.clear()
                    memo_costs[memo] = (fn, cost)
                if self._pieces is not None:  # part of a decomposition: added up by _decomposed
                    self._pieces.append((func, cost, True))
                    return
        if frame is not None:
            flops = cost.flops
            if (flops if type(flops) is int else _nonzero(flops)) or not counted:
                frame.arithmetic += 1
            elif is_alloc:
                frame.allocations += 1
        if shadowing is not None:
            sh = shadowing.shadow
            assert sh is not None
            sh.add(cost)
            return
        self._add((path, key, phase), cost)
        if self._observers:
            if self._originals:  # observers see the model's own tensors, not their stand-ins
                args, kwargs, out = tree_map_only(_Tensor, self._original, (args, kwargs, out))
            seen = OpCall(func, args, kwargs, out, phase, is_view)
            for observer in self._observers:
                observer.on_call(path, phase, info[1], seen, cost)

    def _record_logical(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                        out: Any) -> None:
        """Add the logical (global-shape) cost of an operator on DTensors under the module and
        phase it ran in."""
        if self._in_rule:
            return
        fn, name, is_view, _, ignored, _, _ = self._ops.get(id(func)) or self._op_info(func)
        if ignored:
            return
        st = self._main if _get_ident() == self._owner else self._tracker.state()
        stack = st.stack
        node = _current_autograd_node()
        if node is None or (stack and stack[-1].phase is _RECOMPUTE):
            path, phase = (stack[-1].path, stack[-1].phase) if stack else ("", _FORWARD)
            if st.shadowing is not None:
                return
        else:
            phase = _BACKWARD
            path = self._tracker.backward_path(node, st)
        self._dtensor.add_logical(fn, name, OpCall(func, args, kwargs, out, phase, is_view), path)

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> Counter:
        if self._mode is not None:
            raise UsageError("this Counter is already active; nest a new Counter instead")
        self._tracker.install()
        self._main = self._tracker.main
        self._owner = self._tracker.owner
        self._mode = _Mode(self)
        self.failed_in = None
        if self.model is not None and replaying():  # a symbolic count: repeated layers
            self._module_replay = ModuleReplay(self, self._tracker, self.model)
            self._module_replay.install()
        self._torch_settings = eager_flex_attention()
        try:
            self._torch_settings.__enter__()
            self._mode.__enter__()  # type: ignore[no-untyped-call]
        except BaseException:
            self._torch_settings.__exit__(None, None, None)
            self._tracker.remove()
            self._mode = None
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
        finally:
            self._mode = None
            self._torch_settings.__exit__(None, None, None)
            if self._module_replay is not None:
                self._module_replay.remove()
            failed_in = self._tracker.remove(exc)
            self._in_rule = False
        if exc is not None:
            self.failed_in = failed_in
            if failed_in is not None and not isinstance(exc, FlopscopeError):
                exc.__dict__.setdefault("flopscope_module_path", failed_in)
                if hasattr(exc, "add_note"):
                    exc.add_note(f"flopscope: raised in module '{failed_in}'")
            return
        if self.warn:
            self._warn()

    def _warn(self) -> None:
        report = self.report
        if report.uncounted:
            listed = ", ".join(f"{op} ({n} calls)" for op, n in report.uncounted.items())
            warnings.warn(
                f"flopscope: {len(report.uncounted)} operator(s) had no rule and were counted as 0 "
                f"FLOPs: {listed}. See Report.uncounted; add rules or count with strict=True.",
                FlopscopeWarning,
                stacklevel=3,
            )
        tracker = self._tracker
        if tracker.scripted:
            warnings.warn(
                "flopscope: TorchScript modules (torch.jit.script/trace) run their submodules "
                "inside the TorchScript interpreter, so their work is charged to the scripted "
                "module itself and its submodules show no calls: "
                f"{', '.join(repr(p) if p else repr(p) + ' (the model)' for p in tracker.scripted)}. "
                "Count the eager (unscripted) model for a per-submodule breakdown.",
                FlopscopeWarning,
                stacklevel=3,
            )
        if tracker.lazy:
            listed = ", ".join(f"'{p}' ({t})" for p, t in tracker.lazy.items())
            warnings.warn(
                f"flopscope: these modules returned a lazy object, so the work it does when it is "
                f"consumed is not counted as theirs: {listed}. Consume it inside the forward "
                "(e.g. return a list or tuple instead of a generator).",
                FlopscopeWarning,
                stacklevel=3,
            )
        if tracker.foreign_calls:
            warnings.warn(
                f"flopscope: the model's modules ran {tracker.foreign_calls} time(s) in another "
                "thread, which this Counter does not count; run that work inside "
                "`with counter.attach():` in the worker thread.",
                FlopscopeWarning,
                stacklevel=3,
            )
        if report.opaque:
            warnings.warn(
                "flopscope: these modules produced outputs with no arithmetic operator (only "
                f"allocations), so their work may bypass the dispatcher: {', '.join(report.opaque)}. "
                "Give them a module rule.",
                FlopscopeWarning,
                stacklevel=3,
            )
        if self.mode_warning and self.model is not None and Phase.BACKWARD not in report.phases:
            ran = {path for path, n in tracker.calls.items() if n}
            warn_training_mode(mode_dependent(self.model, ran), TRAINING_ADVICE, stacklevel=3)

    # -- results ------------------------------------------------------------------------------
    @property
    def report(self) -> Report:
        """A :class:`Report` of everything counted so far."""
        tracker = self._tracker
        paths = set(tracker.types)
        ledger = self._dtensor
        for acc in (self._acc, ledger.sharded, ledger.replicated, ledger.logical):
            for path, _, _ in acc:
                paths.add(path)
        modules = {p: (tracker.types.get(p, ""), tracker.calls.get(p, 0)) for p in tracker.types}
        for p in sorted(paths - set(modules)):
            modules[p] = ("", 0)
        records = self._records(self._merged(self._acc, ledger.sharded, ledger.replicated))
        replicated = self._records(ledger.replicated)
        logical: tuple[OpRecord, ...] = ()
        if ledger.logical:
            logical = self._records(self._merged(self._acc, ledger.logical))
        rules = tuple(
            RuleRecord(path, r.name, r.rule.calls, _cost(r.rule), _cost(r.shadow), r.macs_only)
            for path, r in self._rule_acc.items()
        )
        communication: tuple[CommRecord, ...] = self._comm.records() if self._comm else ()
        rank = world = None
        if "torch.distributed" in sys.modules:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        return Report(
            model=type(self.model).__name__ if self.model is not None else "",
            modules=modules,
            module_params=self._module_params(),
            records=records,
            rules=rules,
            opaque=tuple(tracker.opaque),
            communication=communication,
            logical=logical,
            replicated=replicated,
            rank=rank,
            world_size=world,
        )

    def _module_params(self) -> dict[str, ParamStats]:
        """Parameter counts per module path; a model that had lazy modules is counted again now
        (its first forward has given their parameters a size)."""
        params = dict(self._tracker.params)
        if self._tracker.uninitialized and self.model is not None:
            params.update(param_table(self.model)[0])
        return params

    @staticmethod
    def _merged(
        *accs: dict[tuple[str, int | str, Phase], Sums]
    ) -> dict[tuple[str, int | str, Phase], Sums]:
        """Accumulators added together (the first one itself when the others are empty)."""
        if not any(accs[1:]):
            return accs[0]
        out: dict[tuple[str, int | str, Phase], Sums] = {}
        for acc in accs:
            for key, sums in acc.items():
                total = out.get(key)
                if total is None:
                    total = out[key] = Sums()
                total.calls += sums.calls
                total.add(sums)
        return out

    def _records(self, acc: dict[tuple[str, int | str, Phase], Sums]) -> tuple[OpRecord, ...]:
        """Report records of an accumulator."""
        records = []
        for (path, op, phase), sums in acc.items():
            decomposed = False
            if isinstance(op, str):  # a module rule's entry
                name, counted = op, True
            elif op < 0:  # minus the id of an operator counted by its decomposition
                name, counted, decomposed = self._ops[-op][1], True, True
            else:
                fn, name = self._ops[op][:2]  # op is the id of an operator overload
                counted = fn is not None
            records.append(OpRecord(path, name, phase, sums.calls, _cost(sums), counted,
                                    decomposed))
        return tuple(records)
