"""The Counter: count every operator that runs inside a ``with`` block.

A :class:`Counter` puts together the engine's parts: the module tracker (which module is running,
in which phase: :mod:`flopscope.core.tracker`), the dispatch mode that sees every call
(:mod:`flopscope.core.mode`), the recorder that costs and adds up each call
(:mod:`flopscope.core.recorder`, with :mod:`flopscope.core.costing` and
:mod:`flopscope.core.ledger`) and the observers (:mod:`flopscope.core.observers`). How a model is
run (real, meta or fake tensors; its state restored) is not its business: see
:mod:`flopscope.run`.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import itemgetter
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from flopscope.core.costing import Costing
from flopscope.core.integrity import WriteGuard
from flopscope.core.ledger import Ledger
from flopscope.core.mode import CountingMode
from flopscope.core.model_index import ModelTensors
from flopscope.core.notices import warn_about
from flopscope.core.observers import CallObserver, checked_observers
from flopscope.core.params import ParamStats, param_table
from flopscope.core.recorder import Recorder
from flopscope.core.replay import ModuleReplay
from flopscope.core.settings import while_counting
from flopscope.core.tracker import ModuleTracker
from flopscope.errors import FlopscopeError, UsageError
from flopscope.report.records import CommRecord, OpRecord
from flopscope.report.report import Report
from flopscope.report.source import SourceInfo
from flopscope.rules.user import RulesArg, split_rules

__all__ = ["CallObserver", "Counter"]

_get_ident = threading.get_ident
_path_of_key = itemgetter(0)  # a ledger key's module path


def _weak(method: Callable[..., Any], gone: Any = None) -> Callable[..., Any]:
    """The bound ``method`` called through a weak reference to its object (``gone`` once that
    object is collected): a callback that does not keep its Counter alive."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        return gone if bound is None else bound(*args)

    return call


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
            flag (batch norm, dropout: :mod:`flopscope.core.training_mode`) ran in training mode and no
            backward did (a training-mode forward outside a training step).
        mode_warning: with ``warn``, warn about the training mode as above (``count(train=...)``
            passes ``False``: the caller chose the mode).
        observers: objects that see every costed call (:class:`CallObserver`).
        replay_layers: answer repeated layers of the model from what two earlier layers did
            alike (:mod:`flopscope.core.replay`); for symbolic counts without backward, whose
            layers run slowly on symbolic sizes (:func:`flopscope.count_symbolic` asks for it).

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
        replay_layers: bool = False,
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
        self.replay_layers = replay_layers
        self.mode_warning = mode_warning
        op_rules, module_rules = split_rules(rules)
        observers = checked_observers(observers)  # a clear error for observers=5
        # the tracker and the replay call back into this Counter through weak references: a bound
        # method would make a reference cycle (Counter -> tracker -> method -> Counter), so every
        # count would leave its Counter, tracker, ledger and memo entries (about 585 objects on
        # mobilenet_v3_large) to the cyclic collector, where they pile up in the oldest
        # generation until a full collection of the whole process (150-250 ms with torch
        # imported) runs, about every 150 counts
        self._tracker = ModuleTracker(model, module_rules, _weak(self._on_rule_exit),
                                      _weak(self._active_here, False), observers)
        self._recorder = Recorder(self._tracker, Costing(op_rules), observers, strict)
        self._write_guard: WriteGuard | None = None  # count() only: see protect
        self._mode: CountingMode | None = None
        self._report: Report | None = None  # made once the block has ended (see report)
        self.failed_in: str | None = None
        self._module_replay: ModuleReplay | None = None  # a symbolic count's (core.replay)

    @property
    def modules(self) -> list[nn.Module]:
        """The model's modules (``named_modules()`` order); empty without a model."""
        return self._tracker.modules

    @property
    def model_tensors(self) -> ModelTensors | None:
        """The model's module tables and the tensors in them, read when this Counter was made
        (:class:`~flopscope.core.model_index.ModelTensors`; ``None`` without a model): what
        :func:`flopscope.count` saves and checks the model from, without walking it again."""
        return self._tracker.tensors

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
        return bool(self._recorder.observers)

    @property
    def ledger(self) -> Ledger:
        """The sums counted so far (see :class:`~flopscope.core.ledger.Ledger`)."""
        return self._recorder.ledger

    def module_type(self, path: str) -> str:
        """The class name of the module at ``path`` (``"?"`` when unknown)."""
        return self._tracker.types.get(path, "?")

    def failed_in_module(self, exc: BaseException) -> str | None:
        """The innermost module in which ``exc`` was raised while this Counter was active (also
        after the module stack has unwound), or ``None``."""
        return self._tracker.failed_in(exc)

    def engine_state(self) -> tuple[Any, ...]:
        """What besides the ledger a call can change in this Counter (modules flagged opaque,
        lazy or scripted; ruled modules; the communication log): equal before and after a block
        of calls when the block did nothing but add to the ledger."""
        tracker, recorder = self._tracker, self._recorder
        return (len(tracker.opaque), len(tracker.lazy), len(tracker.scripted),
                len(recorder.ledger.rules), recorder.comm)

    def _replay_blocked(self) -> bool:
        """Whether whole-module replay must not answer a call now: observers see every call,
        or a DTensor operator is running."""
        return bool(self._recorder.observers) or bool(self._recorder.dtensor.depth)

    # -- threads --------------------------------------------------------------------------------
    def _active_here(self) -> bool:
        """Whether this Counter's dispatch mode is active on the calling thread."""
        return any(isinstance(m, CountingMode) and m.owned_by(self)
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
        with CountingMode(self, self._recorder, self._write_guard):
            try:
                yield self
            finally:
                self._tracker.states.pop(_get_ident(), None)

    # -- stand-ins and model integrity (count()) ------------------------------------------------
    def stand_ins(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Show observers each original tensor wherever a call has its stand-in: used by
        :func:`flopscope.count`, which runs a real model shape-only on ``meta`` copies of its
        parameters and buffers, so that an observer that follows tensors' storages (peak memory:
        the parameters it registered before the count) sees the model's own tensors. The rules
        and the counts see the calls as they ran.

        Args:
            pairs: (stand-in, original) pairs; the stand-ins must stay alive while counting.
        """
        self._recorder.originals = {id(copy): original for copy, original in pairs}

    def protect(self, tensors: list[torch.Tensor]) -> None:
        """Keep ``tensors`` as they were: each is saved just before an operator first writes to
        it (copy on write, :mod:`flopscope.core.integrity`); :meth:`restore` puts them back. Used
        by :func:`flopscope.count` for real runs; call it before the Counter is entered."""
        self._write_guard = WriteGuard(tensors)

    def restore(self) -> int:
        """Put back every protected tensor an operator wrote to; returns how many."""
        return self._write_guard.restore() if self._write_guard is not None else 0

    @property
    def memo_shape_only(self) -> bool:
        """Whether calls on ``meta`` tensors are looked up in the shape-only memo
        (:mod:`flopscope.core.memo`; on by default). :func:`flopscope.count` turns it off for a
        run on real tensors, where nothing is on ``meta`` and the lookup is wasted work."""
        return self._recorder.memo

    @memo_shape_only.setter
    def memo_shape_only(self, on: bool) -> None:
        self._recorder.memo = on

    @property
    def no_grad_calls(self) -> int:
        """Calls of modules with trainable parameters that ran with grad disabled (a reentrant
        checkpoint's forward)."""
        return self._tracker.no_grad_calls

    def _on_rule_exit(self, frame: Any, output: Any) -> None:
        self._recorder.apply_module_rule(frame, output)

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> Counter:
        if self._mode is not None:
            raise UsageError("this Counter is already active; nest a new Counter instead")
        tracker, recorder = self._tracker, self._recorder
        tracker.install()
        recorder.main = tracker.main
        recorder.owner = tracker.owner
        self._mode = CountingMode(self, recorder, self._write_guard)
        self._report = None
        self.failed_in = None
        if self.model is not None and self.replay_layers:  # a symbolic count: repeated layers
            self._module_replay = ModuleReplay(recorder.ledger, tracker, self.model,
                                               _weak(self.engine_state, ()),
                                               _weak(self._replay_blocked, True))
            self._module_replay.install()
        self._torch_settings = while_counting()
        try:
            self._torch_settings.__enter__()
            self._mode.__enter__()  # type: ignore[no-untyped-call]
        except BaseException:
            self._torch_settings.__exit__(None, None, None)
            tracker.remove()
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
            self._recorder.in_rule = False
        if exc is not None:
            self.failed_in = failed_in
            if failed_in is not None and not isinstance(exc, FlopscopeError):
                exc.__dict__.setdefault("flopscope_module_path", failed_in)
                if hasattr(exc, "add_note"):
                    exc.add_note(f"flopscope: raised in module '{failed_in}'")
            return
        if self.warn:
            warn_about(self.report, self._tracker, stacklevel=2,
                       model=self.model if self.mode_warning else None)

    # -- results ------------------------------------------------------------------------------
    @property
    def report(self) -> Report:
        """A :class:`Report` of everything counted so far (made once after the ``with`` block
        ends; while it runs, made again at each read)."""
        if self._report is not None:
            return self._report
        report = self.make_report()
        if self._mode is None:
            self._report = report
        return report

    def make_report(self, *, shape_only: bool = False, meta: SourceInfo | None = None) -> Report:
        """A :class:`Report` of everything counted so far, with what the caller knows of the run.

        Args:
            shape_only: whether the count ran on fake or meta tensors.
            meta: where the model came from.

        Returns:
            The report.
        """
        tracker, recorder = self._tracker, self._recorder
        ledger, dt = recorder.ledger, recorder.dtensor
        paths = set(tracker.types)
        for acc in (ledger.sums, dt.sharded, dt.replicated, dt.logical):
            paths.update(map(_path_of_key, acc))  # (in C: one key per operator row)
        types = tracker.types
        # path -> (type, calls), in C (one pass each; a path never called: 0)
        modules = dict(zip(types, zip(types.values(), map(tracker.calls.get, types, repeat(0)),
                                      strict=True), strict=True))
        for p in sorted(paths - set(modules)):
            modules[p] = ("", 0)
        counted = recorder.costing.counted
        records = Ledger.records(Ledger.merged(ledger.sums, dt.sharded, dt.replicated), counted)
        replicated = Ledger.records(dt.replicated, counted)
        logical: tuple[OpRecord, ...] = ()
        if dt.logical:
            logical = Ledger.records(Ledger.merged(ledger.sums, dt.logical), counted)
        communication: tuple[CommRecord, ...] = recorder.comm.records() if recorder.comm else ()
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
            rules=ledger.rule_records(),
            opaque=tuple(tracker.opaque),
            shape_only=shape_only,
            meta=meta if meta is not None else SourceInfo(),
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
