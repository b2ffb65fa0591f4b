"""Module tracking: which module is running, under which path, in which phase, on which thread,
and, in backward, which module's forward built the autograd node that is running.

Forward: every module call is seen as it starts and returns (:mod:`flopscope.core.module_calls`,
while a Counter is active; nothing is stored on the user's model), keeping a stack of
:class:`Frame` s per thread. Each start and return also records the autograd sequence number at
that moment, so the timeline of sequence numbers maps any autograd node created in a forward back
to the module that was running then (``backward_path``).

Threads: module calls are seen process-wide, so :meth:`ModuleTracker.enter` first asks whether this thread is counted: the
thread that entered the Counter always is; another thread is when the Counter's dispatch mode is
active on it (``Counter.attach()`` in a worker thread, or autograd's own worker threads, to which
PyTorch propagates the mode during backward). Each counted thread has its own stack.

Phases: a module that starts while autograd is running a backward node is a forward recomputed by
activation checkpointing (``Phase.RECOMPUTE``); ``optimizer.step()`` of any ``torch.optim``
optimizer pushes a frame in ``Phase.OPTIMIZER`` on the root (global optimizer step hooks); frames
inherit their parent's phase. A forward that raises (or a checkpoint recomputation stopped early)
closes its frame too, so it leaves no stale frame behind.
"""

from __future__ import annotations

import sys
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._pytree import tree_iter

from flopscope.core.frames import (
    COSTED,
    KINDS,
    LAZY,
    SCRIPTED,
    Frame,
    ThreadState,
    drop_finished_steps,
    kind_of,
)
from flopscope.core.ledger import Sums
from flopscope.core.model_index import ModelTensors, model_tables
from flopscope.core.module_calls import listen, stop_listening
from flopscope.core.params import ParamStats, param_table
from flopscope.core.usual_calls import usual_calls
from flopscope.cost import Phase
from flopscope.rules.costed import Costed
from flopscope.rules.user import ModuleRules

__all__ = ["ModuleTracker"]

_sequence_nr = torch._C._autograd._get_sequence_nr
_current_autograd_node = torch._C._current_autograd_node
_get_ident = threading.get_ident
_ACCUMULATE_GRAD_SEQ = 2**64 - 1  # sequence number of AccumulateGrad nodes
_FORWARD = Phase.FORWARD
_RECOMPUTE = Phase.RECOMPUTE
_OPTIMIZER = Phase.OPTIMIZER
_grad_enabled = torch.is_grad_enabled


class ModuleTracker:
    """Module paths, types, calls and parameters, the per-thread stacks of running modules, and the
    forward-timeline of autograd sequence numbers used to attribute backward operators.

    Args:
        model: the model whose paths are used (``None``: modules are named after their class).
        module_rules: rules that cost a module as a whole.
        on_rule_exit: called with the frame and the module's output when a ruled module returns.
        counts_here: whether the calling thread (not the one that entered the Counter) is counted.
        observers: objects told when a module starts and returns in the thread that entered the
            Counter (those with ``on_module_enter(path, phase)`` / ``on_module_exit(path,
            phase)``; see :mod:`flopscope.core.observers`).
    """

    def __init__(
        self,
        model: nn.Module | None,
        module_rules: ModuleRules,
        on_rule_exit: Callable[[Frame, Any], None],
        counts_here: Callable[[], bool] = lambda: False,
        observers: Sequence[object] = (),
    ) -> None:
        self.module_rules = module_rules
        self._any_module_rule = bool(module_rules)
        self.on_rule_exit = on_rule_exit
        self.counts_here = counts_here
        self.on_enter: tuple[Callable[[str, Phase], None], ...] = tuple(
            o.on_module_enter for o in observers  # type: ignore[attr-defined]
            if callable(getattr(o, "on_module_enter", None)))
        self.on_exit: tuple[Callable[[str, Phase], None], ...] = tuple(
            o.on_module_exit for o in observers  # type: ignore[attr-defined]
            if callable(getattr(o, "on_module_exit", None)))
        self.paths: dict[nn.Module, str] = {}
        self.types: dict[str, str] = {}
        self.calls: dict[str, int] = {}
        self.params: dict[str, ParamStats] = {}
        # paths of the model's lazy modules not initialised yet when counting began (see _Tables)
        self.uninitialized: list[str] = []
        self.param_paths: dict[int, str] = {}
        self.modules: list[nn.Module] = []  # the model's modules, in named_modules() order
        # their tables and tensors, read when this tracker was made (None without a model)
        self.tensors: ModelTensors | None = None
        self.shared: set[nn.Module] = set()  # modules registered under more than one path
        self.main = ThreadState()  # the thread that entered the Counter
        self.owner: int | None = None  # its id
        self.states: dict[int, ThreadState] = {}  # other counted threads
        self.opaque: dict[str, None] = {}
        self.scripted: dict[str, None] = {}  # TorchScript modules: their submodules are not seen
        self.lazy: dict[str, str] = {}  # modules whose forward returned a lazy object -> its type
        # modules with parameters called under no_grad -> calls (see no_grad_calls)
        self.no_grad_modules: dict[nn.Module, int] = {}
        self.foreign_calls = 0  # calls of the model's modules in threads this Counter does not count
        self.failure: tuple[BaseException, str] | None = None
        self._handles: list[Any] = []
        self._listener: Any = None  # (enter, leave) while installed (module_calls.listen)
        if model is not None:
            tables, self.tensors = model_tables(model)
            self.modules = self.tensors.modules
            self.paths = dict(zip(self.modules, tables.module_paths, strict=True))
            self.types = dict(tables.types)
            self.calls = dict.fromkeys(tables.types, 0)
            self.params = dict(tables.params)
            self.uninitialized = tables.uninitialized
            self.param_paths = dict(tables.param_paths)
            if tables.shared:
                self.shared = {m for m in self.modules if id(m) in tables.shared}
            module_rules.check_paths(self.types, type(model).__name__)

    @property
    def no_grad_calls(self) -> int:
        """Calls of modules with trainable parameters made with grad disabled."""
        return sum(calls for m, calls in self.no_grad_modules.items()
                   if any(p is not None and p.requires_grad for p in m._parameters.values()))

    # -- compatibility: the main thread's state -------------------------------------------------
    @property
    def stack(self) -> list[Frame]:
        """The stack of the thread that entered the Counter."""
        return self.main.stack

    @property
    def shadowing(self) -> Frame | None:
        """The outermost ruled module running in the thread that entered the Counter."""
        return self.main.shadowing

    def state(self) -> ThreadState:
        """The calling thread's state (made on first use)."""
        tid = _get_ident()
        if tid == self.owner:
            return self.main
        st = self.states.get(tid)
        if st is None:
            st = self.states[tid] = ThreadState()
        return st

    def _counted_state(self) -> ThreadState | None:
        """The calling thread's state if this thread is counted, else ``None``."""
        tid = _get_ident()
        if tid == self.owner:
            return self.main
        if not self.counts_here():
            return None
        st = self.states.get(tid)
        if st is None:
            st = self.states[tid] = ThreadState()
        return st

    # -- paths --------------------------------------------------------------------------------
    def _adopt(self, module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
        """Learn the paths, types and parameters of ``module``'s subtree, named under ``prefix``;
        returns ``module.named_modules()`` (unprefixed)."""
        named = list(module.named_modules())
        stats, owners = param_table(module, named)
        if prefix:
            def full(name: str) -> str:
                return f"{prefix}.{name}" if name else prefix
        else:
            def full(name: str) -> str:
                return name
        for name, sub in named:
            if sub not in self.paths:
                path = full(name)
                self.paths[sub] = path
                self.types.setdefault(path, type(sub).__name__)
                self.calls.setdefault(path, 0)
        for name, st in stats.items():
            self.params.setdefault(full(name), st)
        for pid, name in owners.items():
            self.param_paths.setdefault(pid, full(name))
        return named

    def path_of(self, module: nn.Module, stack: list[Frame] | None = None) -> str:
        """The path of ``module``; a module outside the model is named after its class, below the
        module running now (``Parent.Linear``, then ``Parent.Linear#2`` for a second one).

        A module registered under several paths (shared) takes the path it is called through:
        the running parent's path plus the attribute name under which the parent holds it.
        """
        if stack is None:
            stack = self.main.stack
        path = self.paths.get(module)
        if path is not None:
            if module in self.shared and stack:
                parent = stack[-1]
                if isinstance(parent.module, nn.Module):
                    for name, child in parent.module._modules.items():
                        if child is module:
                            alias = f"{parent.path}.{name}" if parent.path else name
                            if alias in self.types:
                                return alias
                            break
            return path
        parent_path = stack[-1].path if stack else ""
        base = module.name if isinstance(module, Costed) else type(module).__name__
        path = f"{parent_path}.{base}" if parent_path else base
        n = 1
        while path in self.types:
            n += 1
            path = f"{parent_path}.{base}#{n}" if parent_path else f"{base}#{n}"
        self._adopt(module, path)
        return path

    @property
    def innermost(self) -> str | None:
        """The path of the innermost module running now in the main thread (``None``: none)."""
        stack = self.main.stack
        for frame in reversed(stack):
            if isinstance(frame.module, nn.Module):
                return frame.path
        return None

    # -- backward attribution -----------------------------------------------------------------
    def backward_path(self, node: Any, st: ThreadState | None = None) -> str:
        """The module whose forward created autograd ``node`` (a parameter's owner for an
        AccumulateGrad node; the root ``""`` when no module was running)."""
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_GRAD_SEQ:
            var = getattr(node, "variable", None)
            return self.param_paths.get(id(var), "") if var is not None else ""
        if st is None or not st.seqs:
            st = self.main
        i = bisect_right(st.seqs, seq) - 1
        return st.seq_paths[i] if i >= 0 else ""

    # -- module calls -------------------------------------------------------------------------
    def enter(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """A module call starts (before its own forward pre-hooks): push its frame."""
        st = self.main if _get_ident() == self.owner else self._counted_state()
        if st is None:
            if module in self.paths:
                self.foreign_calls += 1
            return
        stack = st.stack
        if stack:
            phase = stack[-1].phase
            if phase is _OPTIMIZER:
                drop_finished_steps(stack)
                phase = stack[-1].phase if stack else _FORWARD
        elif _current_autograd_node() is not None:  # a forward rerun inside backward: checkpointing
            phase = _RECOMPUTE
        else:
            phase = _FORWARD
        path = self.paths.get(module)
        if path is None or (self.shared and module in self.shared):
            path = self.path_of(module, stack)
        self.calls[path] += 1
        frame = Frame(module, path, phase)
        if not _grad_enabled() and module._parameters:  # trainable? see no_grad_calls
            no_grad = self.no_grad_modules
            no_grad[module] = no_grad.get(module, 0) + 1
        kind = KINDS.get(type(module))
        if kind is None:
            kind = kind_of(type(module))
        if kind or self._any_module_rule:  # (most module calls: a plain module, no module rule)
            if st.shadowing is None and (self._any_module_rule or kind & COSTED):
                fn = self.module_rules.find(module, path)
                if fn is not None:
                    frame.rule = fn
                    frame.args = args
                    frame.shadow = Sums()
                    st.shadowing = frame
            if kind & SCRIPTED and module._modules:
                self.scripted[path] = None
        stack.append(frame)
        seq = _sequence_nr()  # the timeline's mark (see ThreadState)
        seqs = st.seqs
        if seqs and seqs[-1] == seq:
            st.seq_paths[-1] = path
        else:
            seqs.append(seq)
            st.seq_paths.append(path)
        if self.on_enter and st is self.main:
            for enter in self.on_enter:
                enter(path, phase)

    def leave(self, module: nn.Module, output: Any, exc: BaseException | None) -> None:
        """A module call returned ``output`` (after its own forward hooks), or raised ``exc``:
        pop its frame."""
        tid = _get_ident()
        st = self.main if tid == self.owner else self.states.get(tid)
        if st is None:
            return
        stack = st.stack
        failed = exc is not None
        if not stack or stack[-1].module is not module:
            if not any(f.module is module for f in stack):
                return  # a module entered before the Counter: nothing of ours to close
            while stack[-1].module is not module:  # frames left by an exception: unwind them
                self._close(st, stack.pop(), None, True)
        frame = stack.pop()
        if failed or frame.rule is not None or self.on_exit or type(output) in LAZY:
            if exc is not None and (self.failure is None or self.failure[0] is not exc):
                self.failure = (exc, frame.path)  # the innermost module it was raised in
            self._close(st, frame, output, failed)
            return
        # a usual call (returned, no rule, no observer, eager output): _close inline, one call less
        arithmetic, allocations = frame.arithmetic, frame.allocations
        flagged = (not arithmetic and allocations > 0 and st.shadowing is None
                   and any(isinstance(t, torch.Tensor) for t in tree_iter(output)))
        if flagged:  # allocations only, and a tensor out: an opaque module (see _close)
            self.opaque[frame.path] = None
        path = ""
        if stack:
            parent = stack[-1]
            parent.arithmetic += arithmetic
            if not flagged:
                parent.allocations += allocations
            path = parent.path
        seq = _sequence_nr()  # the timeline's mark (see ThreadState)
        seqs = st.seqs
        if seqs and seqs[-1] == seq:
            st.seq_paths[-1] = path
        else:
            seqs.append(seq)
            st.seq_paths.append(path)

    def _close(self, st: ThreadState, frame: Frame, output: Any, failed: bool) -> None:
        """Close a popped frame (a usual call's is closed inline in :meth:`leave`)."""
        stack = st.stack
        if self.on_exit and st is self.main:
            for leave in self.on_exit:
                leave(frame.path, frame.phase)
        parent = stack[-1] if stack else None
        flagged = False
        if frame.rule is not None:
            st.shadowing = None
            if not failed:
                self.on_rule_exit(frame, output)
        elif failed:
            pass
        elif (
            st.shadowing is None  # inside a ruled module the rule covers everything
            and frame.arithmetic == 0
            and frame.allocations > 0
            and any(isinstance(t, torch.Tensor) for t in tree_iter(output))
        ):
            self.opaque[frame.path] = None
            flagged = True
        if type(output) in LAZY and not failed:
            self.lazy.setdefault(frame.path, type(output).__name__)
        if parent is not None:
            parent.arithmetic += frame.arithmetic
            if frame.rule is not None:
                parent.arithmetic += 1  # the rule accounts for the module's work
            elif not flagged:  # flag the innermost module, not every ancestor of it
                parent.allocations += frame.allocations
        path = parent.path if parent is not None else ""
        seq = _sequence_nr()  # the timeline's mark (see ThreadState)
        seqs = st.seqs
        if seqs and seqs[-1] == seq:
            st.seq_paths[-1] = path
        else:
            seqs.append(seq)
            st.seq_paths.append(path)

    # -- optimizer hooks ----------------------------------------------------------------------
    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        st = self._counted_state()
        if st is None:
            return
        # a step that raised left its frame: drop it (and anything above it)
        while any(f.module is optimizer for f in st.stack):
            st.stack.pop()
        # args: the Python frame of the step wrapper, to tell later whether the step still runs
        st.stack.append(Frame(optimizer, "", _OPTIMIZER, args=(sys._getframe(1),)))

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        tid = _get_ident()
        st = self.main if tid == self.owner else self.states.get(tid)
        if st is None:
            return
        if any(f.module is optimizer for f in st.stack):
            while st.stack.pop().module is not optimizer:
                pass

    # -- install / remove ---------------------------------------------------------------------
    def install(self) -> None:
        """Start seeing module calls and optimizer steps; the calling thread is counted."""
        self.owner = _get_ident()
        self.failure = None
        self._handles = [
            register_optimizer_step_pre_hook(self._optimizer_pre_hook),
            register_optimizer_step_post_hook(self._optimizer_post_hook),
        ]
        self._listener = listen(self.enter, self.leave, partial(usual_calls, self))

    def failed_in(self, exc: BaseException | None) -> str | None:
        """The innermost module in which ``exc`` (or an exception it was raised from) was raised,
        or, failing that, the innermost module still running; ``None`` when neither is known."""
        seen: set[int] = set()
        e = exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            if self.failure is not None and self.failure[0] is e:
                return self.failure[1]
            e = e.__cause__ or e.__context__
        return self.innermost

    def remove(self, exc: BaseException | None = None) -> str | None:
        """Stop seeing module calls and optimizer steps and forget running modules; returns the module in which ``exc`` was
        raised (see :meth:`failed_in`), or ``None``."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._listener is not None:
            stop_listening(self._listener)
            self._listener = None
        left_in = self.failed_in(exc) if exc is not None else None
        self.main.stack.clear()
        self.main.shadowing = None
        self.states.clear()
        self.failure = None
        return left_in
