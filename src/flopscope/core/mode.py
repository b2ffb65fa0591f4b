"""The dispatch mode: where every operator call of a count arrives.

A call on wrapper tensor subclasses (jagged nested tensors, DTensor) is left to the subclass, so
that the work it does on its inner tensors arrives here as what runs; an operator with no rule but
a decomposition runs as its pieces; a call on plain meta tensors is answered from the shape-only
memo when it can be (:mod:`flopscope.core.memo`); every other call runs and is recorded
(:class:`~flopscope.core.recorder.Recorder`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from flopscope.core.cost_memo import KEY_LATER
from flopscope.core.dtensor import in_sharding_propagation, is_dtensor_call
from flopscope.core.fake_memo import FAKE_MODES, replays_fake
from flopscope.core.integrity import WriteGuard
from flopscope.core.memo import OUTPUTS, SELF, outputs_of, remember, replay, signature
from flopscope.core.recorder import Recorder
from flopscope.core.unseen import unseen_calls

__all__ = ["CountingMode"]

# tuple of tensor subclasses in a call -> whether the call is left to the subclass (see _defers)
_DEFERS: dict[tuple[type, ...], bool] = {}
_TRANSPARENT: tuple[type, ...] = (FakeTensor, FunctionalTensor)
_modes_below = torch._C._len_torch_dispatch_stack
_DEVICE = torch.ops.prim.device.default
try:  # Dynamo's per-code-object frame strategy (see CountingMode._should_skip_dynamo)
    from torch._C._dynamo.eval_frame import (  # type: ignore[attr-defined,unused-ignore]
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )
except ImportError:  # an older or newer torch without it: TorchDispatchMode's wrapper is kept
    set_code_exec_strategy = None  # type: ignore[assignment]


def _static_device(t: Any) -> Any:
    """A static fake mode's answer to ``prim.device`` on its fake tensor (its ``fake_device``:
    torch's ``_device_handler`` outside a kernel), when that mode is the only one below this
    one and memoised (:func:`~flopscope.core.memo.static_replay`); else ``None``."""
    if type(t) is not FakeTensor:
        return None
    entry = FAKE_MODES.get(id(t.fake_mode))
    if entry is None or entry[1] is not None or entry[0] is not t.fake_mode \
            or t.fake_mode.in_kernel_invocation or _modes_below() != 1:
        return None
    return t.fake_device


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


class CountingMode(TorchDispatchMode):
    """A Counter's dispatch mode (one per thread it counts).

    Args:
        owner: the Counter (what :meth:`owned_by` compares with).
        recorder: where calls are recorded.
        guard: copy on write of the model's tensors (a real :func:`flopscope.count`), or ``None``.
    """

    # higher-order operators (flex_attention, cond, ...) reach __torch_dispatch__ too
    supports_higher_order_operators = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Whether :class:`TorchDispatchMode` wraps ``__torch_dispatch__`` to keep Dynamo out of
        it: not where Dynamo can be told so once, on the handler's code object (skip it and
        every frame it calls: what the wrapper does by switching Dynamo's frame callback off
        and on around every operator call, two Python frames and two more Python calls per
        call). Dynamo reads that mark only while a ``torch.compile``'d function runs."""
        return set_code_exec_strategy is None

    def __init__(self, owner: object, recorder: Recorder, guard: WriteGuard | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner
        self.recorder = recorder
        self.record = recorder.record
        self.entries = recorder.costing.entries
        self.entry = recorder.entry
        self.guard = guard.before if guard is not None else None
        if _modes_below():  # (made just before it is pushed) modes below see the model's calls,
            # not flopscope's work on them: costing, observers, copies (flopscope.core.unseen)
            self.record = unseen_calls(self.record)
            self.guard = unseen_calls(self.guard) if self.guard is not None else None

    def owned_by(self, owner: object) -> bool:
        """Whether this mode counts for ``owner``."""
        return self.owner is owner

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if types and _defers(types):
            if is_dtensor_call(types):
                return self._dtensor(func, args, kwargs)
            return NotImplemented
        entry = self.entries.get(id(func))
        if entry is not None and entry.ignored:  # a prim:: metadata query (autograd asks
            if func is _DEVICE and len(args) == 1:  # every output's device): nothing to record
                return _static_device(args[0]) or func(*args, **kwargs)
            return func(*args, **kwargs)
        recorder = self.recorder
        if recorder.dtensor.depth and in_sharding_propagation():
            return func(*args, **kwargs)  # global-shape metadata propagation: no rank's work
        if entry is None:
            entry = self.entry(func)
        if self.guard is not None and entry.guarded:  # count(): keep the model's tensors
            self.guard(entry.facts, args, kwargs)
        if entry.decomposition is not None:  # no rule, but a decomposition: count its pieces
            out = recorder.decomposed(self, func, entry, args, kwargs)
            if out is not NotImplemented:
                return out
        # meta tensors: outputs and cost depend on metadata alone (flopscope.core.memo)
        memo = signature(id(func), args, kwargs) if recorder.memo else None
        if memo is not None:
            # outputs made from memory only when no other dispatch mode is below this one (it
            # would not see the call: FlopCounterMode around a Counter), save a symbolic count's
            # own fake mode (flopscope.core.fake_memo.replays_fake)
            made = OUTPUTS.get(memo) if not _modes_below() or replays_fake(memo) else None
            if made is not None:
                out = args[0] if made is SELF else replay(made, args)
                self.record(func, entry, args, kwargs, out, None, memo)
                return out
            kernel = entry.kernel
            if kernel is not None and func._pyobj_dispatcher is None:
                out = kernel(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            made = outputs_of(func, args, out)
            if made is None:
                memo = None
            elif made is not False:
                remember(memo, made)
            self.record(func, entry, args, kwargs, out, None, memo)
            return out
        kernel = entry.kernel  # the C++ callable, without OpOverload.__call__'s frame
        if kernel is not None and func._pyobj_dispatcher is None:
            out = kernel(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        # a default rule's cost is remembered by the call's metadata (flopscope.core.cost_memo),
        # keyed by the recorder once it knows the module (flopscope.core.call_guards)
        self.record(func, entry, args, kwargs, out, None,
                    KEY_LATER if entry.memoizable else None)
        return out

    def _dtensor(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An operator on DTensors (:mod:`flopscope.core.dtensor`): left to DTensor, whose work on
        the local shards and collectives reach this mode as the rank's work, and costed once more
        at its global shapes for the logical figure. The outermost DTensor call is run again with
        this mode pushed, marked so that the mode leaves it to DTensor when it comes back
        (``passing``); the work inside it is accumulated apart, as the part of the rank's work
        that the logical figure replaces."""
        recorder = self.recorder
        ledger = recorder.dtensor
        if ledger.passing:
            ledger.passing = False
            return NotImplemented
        if ledger.depth:  # a DTensor call inside another: only the outer one is logical
            return NotImplemented
        ledger.depth += 1
        ledger.passing = True
        try:
            with recorder.ledger.redirect(ledger.target(args, kwargs)), self:
                out = func(*args, **kwargs)
        finally:
            ledger.passing = False
            ledger.depth -= 1
        recorder.record_logical(func, args, kwargs, out)
        return out


if set_code_exec_strategy is not None:  # Dynamo never traces the handler nor what it calls
    set_code_exec_strategy(CountingMode.__torch_dispatch__.__code__,
                           _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
