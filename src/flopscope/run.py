"""How a model is run for a count: :func:`count` and its strategy.

One forward (and optionally backward) of the model under a :class:`~flopscope.Counter`, on real
tensors, on fake CPU tensors (``shape_only``, or a ``meta`` model with a device-chosen fast path)
or on meta kernels (other ``meta`` models), with the model's state saved before and restored after,
also when the forward raises.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import types
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from typing import Any, ParamSpec, TypeVar

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope.core.counter import CallObserver, Counter
from flopscope.errors import FlopscopeError, ForwardError, UsageError
from flopscope.execution.meta import grouped_mm_as_cpu, needs_fake_cpu, sdpa_as_cpu, to_fake
from flopscope.report.report import Report
from flopscope.rules.user import RulesArg

__all__ = ["Inputs", "count", "reset_observers"]


class Inputs:
    """The model's own arguments, passed verbatim to the model by :func:`count`.

    Use it when a model keyword has the same name as one of :func:`count`'s options::

        flopscope.count(model, flopscope.Inputs(x, strict=True), strict=False)
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


_OPTIONS = ("rules", "strict", "shape_only", "backward", "train", "warn", "observers")


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


def _all_meta(modules: list[nn.Module]) -> bool:
    """Whether every parameter and buffer of these modules is on ``meta`` (and there is one)."""
    found = False
    for m in modules:
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                if not t.is_meta:
                    return False
                found = True
    return found


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _heap_frozen(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with the objects that exist when it starts frozen (``gc.freeze``): the garbage
    collector's full collections, which a count's many small objects trigger (symbolic sizes
    above all: a 70B-shaped symbolic count spent about 1 s of 1.4 s in them), then scan only what
    the count made, not the whole process (torch, the model, sympy's caches). Left alone when the
    process has frozen objects of its own or the collector is off."""

    @functools.wraps(fn)
    def frozen(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if gc.get_freeze_count() or not gc.isenabled():
            return fn(*args, **kwargs)
        gc.freeze()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.unfreeze()

    return frozen


def reset_observers(observers: Sequence[CallObserver]) -> None:
    """Make observers forget an abandoned attempt (each that has a ``reset`` method): a count
    made again another way reports only the attempt that ran."""
    for observer in observers:
        reset = getattr(observer, "reset", None)
        if reset is not None:
            reset()


def _same_place(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` is a view of exactly ``b``'s memory: the same storage (by identity, which
    also tells meta storages apart, whose data pointers are all 0, and reads no fake tensor's
    data pointer), offset, sizes and strides."""
    return bool(StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
                and a.storage_offset() == b.storage_offset() and a.shape == b.shape
                and a.stride() == b.stride())


@_heap_frozen
def count(
    model: nn.Module,
    /,
    *args: Any,
    rules: RulesArg = None,
    strict: bool = False,
    shape_only: bool = False,
    backward: bool = False,
    train: bool | None = None,
    warn: bool = True,
    observers: Sequence[CallObserver] = (),
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
        model: the model.
        *args: positional arguments of ``model`` (or one :class:`Inputs`).
        rules: extra operator and module rules (see :class:`Counter`).
        strict: raise at the first operator without a rule.
        shape_only: run on fake tensors: no arithmetic, no activation memory; same counts.
            Models on the ``meta`` device are counted this way too (inputs are moved to ``meta``).
        backward: also run backward from every floating-point output that requires grad.
        train: run in training (True) or eval (False) mode; ``None`` keeps the model's mode.
        warn: warn once about uncounted operators and opaque modules, and, when ``train`` is
            ``None`` and no backward runs, about layers whose cost depends on the training flag
            (batch norm, dropout) found in training mode (:mod:`flopscope.core.modes`): a
            freshly built model is in training mode, and its forward is then a training-mode
            forward.
        observers: objects that see every costed call (see :class:`~flopscope.core.counter.CallObserver`).
        **kwargs: keyword arguments of ``model``.

    Returns:
        The :class:`Report`.

    Raises:
        UsageError: bad arguments (not a module, option/keyword clash, nothing to backward).
        ForwardError: the model's forward raised; ``module_path`` says where.
        StrictModeError: ``strict`` and an operator without a rule ran.
        RuleError: a rule raised or returned something that is not a cost.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"count() takes an nn.Module as its first argument, not {type(model).__name__}"
        )
    if len(args) == 1 and isinstance(args[0], Inputs):
        if kwargs:
            raise UsageError(
                "pass every model argument inside flopscope.Inputs(...) when you use it; got extra "
                f"keywords {sorted(kwargs)}"
            )
        args, kwargs = args[0].args, dict(args[0].kwargs)
    else:
        given = {"rules": rules, "strict": strict, "shape_only": shape_only, "backward": backward,
                 "train": train, "warn": warn, "observers": observers or None}
        explicit = {k for k, v in given.items() if v not in (None, False) or (k == "warn" and v is not True)}
        _check_collisions(model, {k: given[k] for k in explicit})
    counter = Counter(model, rules=rules, strict=strict, warn=warn, observers=observers,
                      mode_warning=train is None)
    if counter.uninitialized:  # counted as it will be after its first forward, on a copy: the
        # model stays lazy
        model = _initialized_copy(model, counter.uninitialized, args, kwargs)
        counter = Counter(model, rules=rules, strict=strict, warn=warn, observers=observers,
                          mode_warning=train is None)
    modules = counter.modules
    on_meta = _all_meta(modules)
    modes = [(m, m.training) for m in modules]
    saved: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
    # which tensor each parameter/buffer slot held, and each tensor attribute of a module with
    # its own forward hooks (legacy spectral_norm / weight_norm set module.weight from one on
    # every call), to put back objects a forward replaced
    eager = [m for m in modules if type(m._parameters) is dict]  # not TorchScript modules
    slots: list[tuple[dict[str, Any], str, Any]]
    slots = [(m._parameters, name, t) for m in eager for name, t in m._parameters.items()]
    slots += [(m._buffers, name, t) for m in eager for name, t in m._buffers.items()]
    slots += [(vars(m), name, t) for m in eager if m._forward_pre_hooks or m._forward_hooks
              for name, t in vars(m).items() if isinstance(t, torch.Tensor)]

    def save_buffers() -> None:  # fake mode too: BatchNorm bumps num_batches_tracked from Python
        with torch.no_grad():
            for m in modules:
                for name, b in m._buffers.items():
                    if b is not None:
                        saved.append((m._buffers, name, b, b.detach().clone()))

    # How to run: real tensors; or fake CPU tensors (shape_only, or a meta model with a module
    # whose fast path is chosen by device); or, for other meta models, meta kernels (fastest),
    # falling back to fake CPU tensors if the forward cannot run on meta (e.g. it reads a value,
    # which fake tensors allow for constants and meta tensors never do).
    if _given_fake_mode(args, kwargs) is not None:  # symbolic shapes: the caller's fake mode
        ways = ["fake"]
    elif (on_meta or shape_only) and not needs_fake_cpu(modules):
        # a real model counted shape-only runs on meta copies of its parameters (see _run);
        # observers see the model's own tensors in place of the copies (Counter.stand_ins)
        ways = ["meta", "fake"]
    else:
        ways = ["fake"] if shape_only or on_meta else ["real"]
    params: list[torch.Tensor] = []  # the model's parameters not on meta, for real and fake runs
    # aliases (no copy) of every parameter, to undo `p.data = other`, which swaps a tensor's
    # storage without any operator (buffers are put back from their copies below)
    # (made before the first attempt that can write to the model's tensors: a real model counted
    # on meta runs on meta copies of them, see _swap_to_meta)
    aliases: list[tuple[torch.Tensor, torch.Tensor]] = []
    kept = on_meta
    if on_meta:  # no values to protect, but `.data =` can still swap a storage or a shape
        save_buffers()
        aliases = [(p, p.detach()) for m in modules for p in m._parameters.values()
                   if p is not None]
    try:
        if train is not None:
            model.train(train)
        attempts = [(way, False) for way in ways]
        i = 0
        while i < len(attempts):
            way, alias = attempts[i]
            if i:
                counter.restore()  # the abandoned attempt's writes
                reset_observers(observers)  # the abandoned attempt's calls do not count
                counter = Counter(model, rules=rules, strict=strict, warn=warn, observers=observers,
                          mode_warning=train is None)
            if not kept and way != "meta":
                kept = True
                save_buffers()
                params = [p for m in modules for p in m._parameters.values()
                          if p is not None and not p.is_meta and p.device.type != "meta"]
                aliases = [(p, p.detach()) for p in params]
            if way == "real":
                counter.protect(params)
            try:
                if _run(way, counter, model, on_meta, args, kwargs, backward, alias):
                    break
                # a reentrant checkpoint got no input that requires grad: again, with inputs
                # that take part in autograd (see the docstring)
                attempts.insert(i + 1, (way, True))
            except ForwardError:
                if i + 1 == len(attempts):
                    raise
            i += 1
    finally:
        for m, mode in modes:
            if m.training != mode:
                m.training = mode
        counter.restore()
        for table, name, obj in slots:
            if table.get(name) is not obj:
                table[name] = obj
        with torch.no_grad():
            for held, original in aliases:
                if not _same_place(held, original):
                    held.data = original
        with torch.no_grad():
            for table, name, tensor, value in saved:
                table[name] = tensor
                if tensor.shape == value.shape and tensor.dtype == value.dtype:
                    tensor.copy_(value)
                else:  # `buffer.data = other` changed its shape: take the saved copy's storage
                    tensor.data = value
    report = counter.report
    if shape_only or on_meta:
        report = dataclasses.replace(report, shape_only=True)
    return report


def _initialized_copy(model: nn.Module, lazy: list[str], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> nn.Module:
    """A copy of a model with lazy modules (``nn.LazyLinear``, ...), initialised by one uncounted
    forward, so that the count sees the parameters the model will have after its first forward
    and the model itself is left as it was (initialising changes a lazy module's class and
    parameters for good). Lazy modules initialise from real inputs only (``.to("meta")`` breaks
    them), so meta inputs are given as zeros of their shapes: one real forward, even for a
    shape-only count.

    Raises:
        ForwardError: the initialising forward raised.
    """
    import copy

    twin = copy.deepcopy(model)
    args, kwargs = tree_map_only(
        torch.Tensor, lambda t: torch.zeros(t.shape, dtype=t.dtype) if t.is_meta else t,
        (args, kwargs))
    try:
        with torch.no_grad():
            twin(*args, **kwargs)
    except Exception as e:
        raise ForwardError(
            f"the model has lazy modules that are not initialised yet ({', '.join(map(repr, lazy))}); "
            "flopscope initialises them on a copy of the model with one uncounted forward, which "
            f"raised {type(e).__name__}: {e}. Run one forward yourself before counting.",
            module_path=None,
        ) from e
    return twin


def _run(way: str, counter: Counter, model: nn.Module, on_meta: bool, args: tuple[Any, ...],
         kwargs: dict[str, Any], backward: bool, alias: bool = False) -> bool:
    """One forward (and backward) of ``model`` under ``counter``, on ``way``'s tensors (with
    floating-point inputs that require grad if ``alias``); ``False`` when the count should be
    made again with ``alias`` (see :func:`count`)."""
    fake_params: dict[str, torch.Tensor] | None = None
    # id(stand-in) -> (stand-in, the caller's tensor it stands for): observers see the latter
    stand: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def standing(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def convert(t: torch.Tensor) -> torch.Tensor:
            made = fn(t)
            if made is not t:
                earlier = stand.get(id(t))
                stand[id(made)] = (made, earlier[1] if earlier is not None else t)
            return made
        return convert

    with ExitStack() as cleanup:
        if way == "meta":  # SDPA is made to pick the CPU's kernel
            try:
                args, kwargs = tree_map_only(torch.Tensor, standing(_to_meta), (args, kwargs))
            except Exception as e:  # an input that refuses meta tensors (PackedSequence): fake
                raise ForwardError(f"the inputs cannot be put on the meta device: "
                                   f"{type(e).__name__}: {e}", module_path=None) from e
            cleanup.enter_context(sdpa_as_cpu())
            if not on_meta:  # a real model, shape-only: meta copies of its tensors, for now
                swapped = _swap_to_meta(counter.modules)
                cleanup.callback(_put_back, swapped)
                stand.update((id(table[name]), (table[name], t)) for table, name, t in swapped)
        elif way == "fake":
            fake_mode, fake_params = _fake_mode(model if on_meta else None,
                                                _given_fake_mode(args, kwargs))
            args, kwargs = tree_map_only(
                torch.Tensor, standing(lambda t: to_fake(fake_mode, t)), (args, kwargs)
            )
            if fake_params is not None:
                own = dict([*model.named_parameters(remove_duplicate=False),
                            *model.named_buffers(remove_duplicate=False)])
                stand.update((id(fake), (fake, own[name])) for name, fake in fake_params.items())
            cleanup.enter_context(fake_mode)
            cleanup.enter_context(grouped_mm_as_cpu())
        if alias:  # inputs take part in autograd, as a training step's activations do
            args, kwargs = tree_map_only(torch.Tensor, standing(_differentiable), (args, kwargs))
        if counter.observed and stand:
            counter.stand_ins(stand.values())
        with counter:
            try:
                if fake_params is None:
                    out = model(*args, **kwargs)
                    _check_lazy(model, out)
                    if backward:
                        return _backward(model, out, None, (args, kwargs), counter, alias)
                else:
                    out = torch.func.functional_call(model, fake_params, args, kwargs)
                    _check_lazy(model, out)
                    if backward:
                        return _backward(model, out, fake_params, (args, kwargs), counter, alias)
            except FlopscopeError:
                raise
            except Exception as e:
                path = counter.failed_in_module(e)
                where = f" in module '{path}' ({counter.module_type(path)})" if path is not None else ""
                dynamic = _data_dependent(e)
                if dynamic is not None and way != "real":
                    raise ForwardError(
                        f"shape-only counting cannot run operator {dynamic}{where}: it needs the "
                        "values of its inputs (an output shape that depends on data, or a value "
                        "read with .item()/.tolist()), which a shape-only (fake or meta) count "
                        "does not have. Count with real tensors (shape_only=False, and a model "
                        "that is not on the meta device).",
                        module_path=path,
                    ) from e
                raise ForwardError(
                    f"the model's forward raised{where}: {type(e).__name__}: {e}", module_path=path
                ) from e
    return True


def _differentiable(t: torch.Tensor) -> torch.Tensor:
    """A floating-point input that does not require grad, as an alias that does (a leaf)."""
    if t.is_floating_point() and not t.requires_grad:
        return t.detach().requires_grad_(True)
    return t


def _check_lazy(model: nn.Module, out: Any) -> None:
    """Refuse a forward that returned a generator or another lazy object: nothing ran yet."""
    if isinstance(out, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType,
                        map, filter, zip)):
        raise UsageError(
            f"{type(model).__name__}.forward returned a {type(out).__name__}, so its work has not "
            "run yet and would count as zero; count a wrapper whose forward consumes it, e.g. "
            "one that returns list(model(x)) or tuple(...)"
        )


def _data_dependent(exc: BaseException) -> str | None:
    """The operator whose output shape depends on data, if ``exc`` (or its cause) is fake or
    meta tensors' way of saying so."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (DynamicOutputShapeException, DataDependentOutputException)):
            return str(getattr(e, "func", "?"))
        if isinstance(e, NotImplementedError) and "data-dependent" in str(e):
            return str(e).split(" ")[0]
        e = e.__cause__ or e.__context__
    return None


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    """An input for a model on ``meta``: the same metadata on ``meta`` (a leaf, like the input)."""
    if t.is_meta:
        return t
    return t.detach().to("meta").requires_grad_(t.requires_grad)


def _swap_to_meta(modules: list[nn.Module]) -> list[tuple[dict[str, Any], str, torch.Tensor]]:
    """Put meta copies (same shapes, strides and dtypes; no memory) in place of the modules'
    parameters and buffers, as ``torch.func.functional_call`` does (it swaps the same entries),
    in one pass; :func:`_put_back` restores them (and :func:`count` checks every slot again).
    A tensor registered under several names (tied weights) gets one copy; a trainable
    parameter's copy requires grad; tensors already on ``meta`` stay.

    Returns:
        (table, name, original) of every entry swapped.
    """
    copies: dict[int, torch.Tensor] = {}
    swapped: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    keep = swapped.append
    for m in modules:
        tables: tuple[dict[str, Any], ...] = (m._parameters, m._buffers)
        for table in tables:
            if not table or type(table) is not dict:  # nothing, or a TorchScript module
                continue
            for name, t in table.items():
                if t is None or t.is_meta:
                    continue
                copy = copies.get(id(t))
                if copy is None:
                    copy = copies[id(t)] = _meta_copy(t)
                table[name] = copy  # (a value replaced, not a key added: iteration goes on)
                keep((table, name, t))
    return swapped


# id(tensor) -> (weak reference to it, its meta copy, the metadata both had): copies are made
# again only for tensors not seen before, or whose (or whose copy's) metadata changed since
_COPIES: dict[int, tuple[Any, torch.Tensor, tuple[Any, ...]]] = {}


def _meta_copy(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor like ``t`` (a trainable parameter's copy requires grad), reused across
    counts while neither changed."""
    grad = t.requires_grad and isinstance(t, nn.Parameter)  # (isinstance is Python code here)
    facts = (t.shape, t.stride(), t.dtype, grad)
    entry = _COPIES.get(id(t))
    if entry is not None and entry[0]() is t and entry[2] == facts:
        copy = entry[1]
        if (copy.shape, copy.stride(), copy.dtype, copy.requires_grad) == facts and copy.is_leaf:
            return copy
    copy = torch.empty_like(t, device="meta")
    if grad:
        copy.requires_grad_(True)
    if len(_COPIES) > 100_000:
        _COPIES.clear()
    _COPIES[id(t)] = (weakref.ref(t), copy, facts)
    return copy


def _put_back(swapped: list[tuple[dict[str, Any], str, torch.Tensor]]) -> None:
    """Undo :func:`_swap_to_meta`."""
    for table, name, t in swapped:
        table[name] = t


def _given_fake_mode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fake mode of the first fake tensor among the model's arguments, or ``None``: inputs
    made by :mod:`flopscope.symbolic.count` (fake tensors with symbolic sizes) are counted in their own
    mode, whose shape environment holds their symbols."""
    from torch._subclasses.fake_tensor import FakeTensor

    for t in tree_iter((args, kwargs)):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return None


def _fake_mode(meta_model: nn.Module | None,
               given: Any = None) -> tuple[Any, dict[str, torch.Tensor] | None]:
    """A FakeTensorMode for shape-only counting, and for a model on ``meta`` its fake parameters.

    A ``meta`` model that holds a module with a device-chosen fast path (see ``flopscope.execution.meta``)
    is run as if it were on the CPU: it is called through ``torch.func.functional_call`` with fake
    CPU tensors in place of its meta parameters and buffers (put back on return; the model is not
    modified). Other ``meta`` models run on ``meta`` itself, which is faster.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = given if given is not None else FakeTensorMode(allow_non_fake_inputs=True)
    if meta_model is None:
        return fake_mode, None
    fake_params: dict[str, torch.Tensor] = {}
    for name, t in [*meta_model.named_parameters(remove_duplicate=False),
                    *meta_model.named_buffers(remove_duplicate=False)]:
        fake = to_fake(fake_mode, t)  # memoized: a tied weight stays one tensor
        if isinstance(t, nn.Parameter) and t.requires_grad and fake.is_leaf:
            fake.requires_grad_(True)
        fake_params[name] = fake
    return fake_mode, fake_params


def _float_tensors(out: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in ``out``: in any pytree (tuples, lists, dicts, named
    tuples, registered nodes) and inside dataclasses, each tensor once."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(tree: Any) -> None:
        for leaf in tree_iter(tree):
            if isinstance(leaf, torch.Tensor):
                if leaf.is_floating_point():
                    found.setdefault(id(leaf), leaf)
            elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
                walk([getattr(leaf, f.name, None) for f in dataclasses.fields(leaf)])

    walk(out)
    return list(found.values())


def _reentrant_checkpoint(roots: list[torch.Tensor]) -> bool:
    """Whether the autograd graph of ``roots`` holds a reentrant checkpoint (which refuses
    ``torch.autograd.grad``)."""
    seen: set[Any] = set()
    todo = [t.grad_fn for t in roots if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        todo.extend(n for n, _ in node.next_functions if n is not None)
    return False


def _backward(
    model: nn.Module, out: Any, fake_params: dict[str, torch.Tensor] | None = None,
    inputs: Any = (), counter: Counter | None = None, alias: bool = True,
) -> bool:
    """Backward from every floating-point output that requires grad; ``False`` (and nothing
    run) when the count should be made again with inputs that require grad (see :func:`count`)."""
    roots = [t for t in _float_tensors(out) if t.requires_grad]
    if not roots:
        raise UsageError(
            "backward=True, but no floating-point output of the model requires grad: run in a "
            "context where autograd is enabled and with parameters that require grad"
        )
    params: list[torch.Tensor]
    if fake_params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    else:  # a meta model run on fake parameters: differentiate with respect to those
        params = [fake_params[name] for name, p in model.named_parameters() if p.requires_grad]
    reentrant = _reentrant_checkpoint(roots)
    if (not reentrant and not alias and counter is not None
            and counter.no_grad_calls and torch.is_grad_enabled()):
        return False
    grads = [torch.ones_like(t) for t in roots]
    if reentrant:
        # backward() computes the gradient of every leaf that requires grad; put each .grad back
        leaves = [*params, *(t for t in tree_iter(inputs) if isinstance(t, torch.Tensor))]
        before = [(t, t.grad) for t in leaves]
        try:
            torch.autograd.backward(roots, grads)
        finally:
            for t, g in before:
                t.grad = g
        return True
    wrt = params if params else roots
    torch.autograd.grad(roots, wrt, grad_outputs=grads, allow_unused=True)
    return True
