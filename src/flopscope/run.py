"""``count()``: the options of a count turned into a Counter and a run.

One forward (and optionally backward) of the model under a :class:`~flopscope.Counter`, walking
the one fallback ladder (:mod:`flopscope.execution.how`: real tensors; or meta kernels, then fake
CPU tensors), each attempt run by :func:`flopscope.execution.forward.run_forward`, with the
model's state saved before and put back after, also when the forward raises
(:mod:`flopscope.execution.snapshot`).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, ParamSpec, TypeVar

from torch import nn

from flopscope.core.counter import Counter
from flopscope.core.fake_memo import replays_outputs
from flopscope.core.observers import CallObserver, reset_observers
from flopscope.core.unseen import sets_modes_aside
from flopscope.errors import ForwardError, UsageError
from flopscope.execution.forward import initialized_copy, run_forward
from flopscope.execution.heap import frozen_heap
from flopscope.execution.how import How, given_fake_mode, ladder, on_meta
from flopscope.execution.inputs import Inputs
from flopscope.execution.snapshot import ModelSnapshot
from flopscope.report.report import Report
from flopscope.report.source import SourceInfo
from flopscope.rules.user import RulesArg

__all__ = ["count"]


_OPTIONS = ("rules", "strict", "shape_only", "backward", "train", "warn", "observers",
            "source")


# a forward method's function -> the names of its parameters (inspect.signature is slow)
_FORWARD_NAMES: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def _check_collisions(model: nn.Module, given: dict[str, Any]) -> None:
    forward = model.forward
    function = getattr(forward, "__func__", None)  # a bound method: its names are its class's
    params = _FORWARD_NAMES.get(function) if function is not None else None
    if params is None:
        try:
            params = frozenset(inspect.signature(forward).parameters)
        except (TypeError, ValueError):
            return
        if function is not None:
            with suppress(TypeError):  # not weakly referenceable: not remembered
                _FORWARD_NAMES[function] = params
    clash = [name for name in _OPTIONS if name in params and name in given]
    if clash:
        raise UsageError(
            f"{type(model).__name__}.forward also takes {', '.join(map(repr, clash))}, which is a "
            "flopscope.count option too; pass the model's arguments as "
            "flopscope.count(model, flopscope.Inputs(*args, **kwargs), ...)"
        )


def _check_inputs_given(model: nn.Module) -> None:
    """A count given no arguments for a forward that needs some fails here, naming them, not
    inside the forward (checked only when none were given: it costs a signature)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return
    needed = [p.name for p in params if p.default is inspect.Parameter.empty and p.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if needed:
        raise UsageError(
            f"{type(model).__name__}.forward needs {', '.join(map(repr, needed))}, and count() was "
            "given no inputs: pass them after the model, count(model, x), or name a library "
            "model to get its default input, count('torchvision:resnet50')"
        )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _heap_frozen(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` inside :func:`~flopscope.execution.heap.frozen_heap`."""

    @functools.wraps(fn)
    def frozen(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with frozen_heap():
            return fn(*args, **kwargs)

    return frozen


@_heap_frozen
@sets_modes_aside  # a user's dispatch modes see the model's calls, not flopscope's bookkeeping
def count(
    model: nn.Module | str,
    /,
    *args: Any,
    rules: RulesArg = None,
    strict: bool = False,
    shape_only: bool = False,
    backward: bool = False,
    train: bool | None = None,
    warn: bool = True,
    observers: Sequence[CallObserver] = (),
    source: SourceInfo | None = None,
    **kwargs: Any,
) -> Report:
    """Count one forward call of ``model`` (and optionally its backward).

    ``model(*args, **kwargs)`` is run once under a :class:`Counter`. The model's arguments pass
    through unchanged; flopscope's own options are the keyword-only names below. If the model
    itself takes a keyword with one of those names, wrap the model's arguments in
    :class:`Inputs` (flopscope refuses to guess and says so).

    The model is left as it was, bitwise: training flags (and ``train=`` changes) are restored;
    buffers updated by the forward (batch-norm running statistics) are put back; a parameter that
    an operator writes to in place (``nn.Embedding(max_norm=...)`` renormalising its rows) is
    saved just before the first write and put back (copy on write: only the parameters that are
    written to are copied); tensors a forward stores as plain module attributes (the ``.weight``
    of legacy ``spectral_norm`` / ``weight_norm``) and parameters or buffers it replaces are put
    back; gradients are computed with ``torch.autograd.grad`` so no ``.grad`` is touched (with a
    reentrant ``torch.utils.checkpoint``, which refuses ``autograd.grad``, ``backward()`` runs
    and every ``.grad`` is put back); and no hook or attribute remains.

    With ``backward=True``, gradients are computed for the parameters. A block checkpointed with
    ``use_reentrant=True`` whose inputs do not require grad gets no backward in PyTorch (its
    parameters would get no gradient); when a module with trainable parameters ran with grad
    disabled and no reentrant checkpoint reached the outputs' graph, the count is made again
    with the floating-point inputs taking part in autograd (aliases that require grad; the
    caller's tensors are untouched), so that such a block has its backward, which then includes
    the gradient of its input (reentrant checkpointing computes it).

    Args:
        model: the model, or a SOURCE string as the command line takes it
            (``"torchvision:resnet50"``, ``"hf:llama"``, ``"path/to/file.py:factory"``: built by
            :func:`flopscope.sources.load_model`, on ``meta`` with ``shape_only``), counted with
            its default inputs unless arguments are given.
        *args: positional arguments of ``model`` (or one :class:`Inputs`).
        rules: extra operator and module rules (see :class:`Counter`).
        strict: raise at the first operator without a rule.
        shape_only: run on fake tensors: no arithmetic, no activation memory; same counts.
            Models on the ``meta`` device are counted this way too (inputs are moved to ``meta``),
            also one that holds a few tensors on the CPU (they are converted with it).
        backward: also run backward from every floating-point output that requires grad.
        train: run in training (True) or eval (False) mode; ``None`` keeps the model's mode.
        warn: warn once about uncounted operators and opaque modules, and, when ``train`` is
            ``None`` and no backward runs, about layers whose cost depends on the training flag
            (batch norm, dropout) found in training mode (:mod:`flopscope.core.training_mode`): a
            freshly built model is in training mode, and its forward is then a training-mode
            forward.
        observers: objects that see every costed call (see
            :class:`~flopscope.core.observers.CallObserver`).
        source: where the model came from (:class:`~flopscope.report.source.SourceInfo`, as
            :func:`flopscope.sources.load_model` describes it): the report's ``meta``.
        **kwargs: keyword arguments of ``model``.

    Returns:
        The :class:`Report`.

    Raises:
        UsageError: bad arguments (not a module, option/keyword clash, nothing to backward).
        ForwardError: the model's forward raised; ``module_path`` says where.
        StrictModeError: ``strict`` and an operator without a rule ran.
        RuleError: a rule raised or returned something that is not a cost.
    """
    from flopscope.sources import model_of

    model, args, kwargs, source = model_of("count", model, args, kwargs, shape_only=shape_only,
                                           source=source)
    if len(args) == 1 and isinstance(args[0], Inputs):
        if kwargs:
            raise UsageError(
                "pass every model argument inside flopscope.Inputs(...) when you use it; got extra "
                f"keywords {sorted(kwargs)}"
            )
        args, kwargs = args[0].args, dict(args[0].kwargs)
    else:
        given = {"rules": rules, "strict": strict, "shape_only": shape_only, "backward": backward,
                 "train": train, "warn": warn, "observers": observers or None,
                 "source": source}
        explicit = {k for k, v in given.items() if v not in (None, False) or (k == "warn" and v is not True)}
        _check_collisions(model, {k: given[k] for k in explicit})
    if not args and not kwargs:
        _check_inputs_given(model)
    fake_mode = given_fake_mode(args, kwargs)
    # a symbolic count (fake inputs of a fake mode that replays outputs) replays repeated layers
    new_counter = functools.partial(
        Counter, rules=rules, strict=strict, warn=warn, observers=observers,
        mode_warning=train is None,
        replay_layers=fake_mode is not None and replays_outputs(fake_mode))
    counter = new_counter(model)
    if counter.uninitialized:  # counted as it will be after its first forward, on a copy: the
        # model stays lazy
        model = initialized_copy(model, counter.uninitialized, args, kwargs)
        counter = new_counter(model)
    modules = counter.modules
    tensors = counter.model_tensors  # (the model's tables, read once for all of the below)
    meta = on_meta(modules if tensors is None else tensors)
    ways = ladder(modules, shape_only=shape_only, meta=meta, fake_inputs=fake_mode is not None)
    snapshot = ModelSnapshot(modules, tensors)
    if meta:
        snapshot.keep_values(meta=True)
    try:
        if train is not None:
            model.train(train)
        attempts = [(how, False) for how in ways]
        i = 0
        while i < len(attempts):
            how, alias = attempts[i]
            if i:
                counter.restore()  # the abandoned attempt's writes
                reset_observers(observers)  # the abandoned attempt's calls do not count
                counter = new_counter(model)
            if how is How.REAL:  # parameters and buffers: copy on write
                snapshot.keep_values(buffers=False)
                counter.protect([*snapshot.params, *snapshot.own_buffers])
                counter.memo_shape_only = False  # real tensors: nothing for the memo
            elif how is not How.META:  # a real model counted on meta runs on meta copies of it
                snapshot.keep_values()
            try:
                if run_forward(how, counter, model, meta, args, kwargs, backward, alias):
                    break
                # a reentrant checkpoint got no input that requires grad: again, with inputs
                # that take part in autograd (see the docstring)
                attempts.insert(i + 1, (how, True))
            except ForwardError:
                if i + 1 == len(attempts):
                    raise
            i += 1
    finally:
        snapshot.restore()  # storages swapped by `.data =` first, then the values written
        counter.restore()
    return counter.make_report(shape_only=shape_only or meta, meta=source)
