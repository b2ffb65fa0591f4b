"""One forward (and backward) of a model under a Counter, on the tensors of a :class:`How`; and the
backward itself, from every floating-point output that requires grad.

:func:`run_forward` is one attempt of :func:`flopscope.count`'s ladder: it makes the inputs (and,
for a real model counted shape-only, the parameters) the stand-ins the way needs, shows observers
the caller's tensors in their place, runs the model under the Counter and turns what the model's
forward raised into a :class:`~flopscope.ForwardError` that says where.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope.core.counter import Counter
from flopscope.core.unseen import caller_modes
from flopscope.errors import FlopscopeError, ForwardError, UsageError
from flopscope.execution.copies import (
    fake_input,
    fake_mode_for,
    meta_input,
    put_back,
    swap_to_meta,
)
from flopscope.execution.how import How, given_fake_mode
from flopscope.execution.meta import fake_sparse

__all__ = ["backward", "initialized_copy", "run_forward"]


def initialized_copy(model: nn.Module, lazy: list[str], args: tuple[Any, ...],
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


def run_forward(how: How, counter: Counter, model: nn.Module, on_meta: bool,
                args: tuple[Any, ...], kwargs: dict[str, Any], with_backward: bool,
                alias: bool = False) -> bool:
    """One forward (and backward) of ``model`` under ``counter``, on ``how``'s tensors (with
    floating-point inputs that require grad if ``alias``).

    Args:
        how: the tensors to run on.
        counter: the Counter (entered here).
        model: the model.
        on_meta: the model is on ``meta``.
        args: its positional arguments.
        kwargs: its keyword arguments.
        with_backward: run backward too.
        alias: floating-point inputs take part in autograd (aliases that require grad).

    Returns:
        ``False`` when the count should be made again with ``alias`` (a reentrant checkpoint
        got no input that requires grad; see :func:`flopscope.count`), else ``True``.

    Raises:
        ForwardError: the model's forward raised; ``module_path`` says where.
    """
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
        if how is How.META:  # (SDPA picks the CPU's kernel: the Counter sees to it)
            try:
                args, kwargs = tree_map_only(torch.Tensor, standing(meta_input), (args, kwargs))
            except Exception as e:  # an input that refuses meta tensors (PackedSequence): fake
                raise ForwardError(f"the inputs cannot be put on the meta device: "
                                   f"{type(e).__name__}: {e}", module_path=None) from e
            # meta copies of the model's tensors not on meta (all of a real model's), for now
            swapped = swap_to_meta(counter.modules)
            cleanup.callback(put_back, swapped)
            stand.update((id(table[name]), (table[name], t)) for table, name, t in swapped)
        elif how is How.FAKE:
            fake_mode, fake_params = fake_mode_for(model if on_meta else None,
                                                   given_fake_mode(args, kwargs))
            try:
                args, kwargs = tree_map_only(
                    torch.Tensor, standing(lambda t: fake_input(fake_mode, t)), (args, kwargs)
                )
            except Exception as e:  # (jagged nested tensors: PyTorch's fake tensors refuse them)
                raise ForwardError(
                    "shape-only counting cannot make the inputs fake tensors "
                    f"({type(e).__name__}: {e}); count with real tensors (shape_only=False)",
                    module_path=None) from e
            if fake_params is not None:
                own = dict([*model.named_parameters(remove_duplicate=False),
                            *model.named_buffers(remove_duplicate=False)])
                stand.update((id(fake), (fake, own[name])) for name, fake in fake_params.items())
            if not on_meta:  # (a meta model's are among the fake parameters)
                fake_sparse(fake_mode, counter.modules)
            cleanup.enter_context(fake_mode)
        if alias:  # inputs take part in autograd, as a training step's activations do
            args, kwargs = tree_map_only(torch.Tensor, standing(_differentiable), (args, kwargs))
        if counter.observed and stand:
            counter.stand_ins(stand.values())
        with caller_modes(), counter:
            try:
                if fake_params is None:
                    out = model(*args, **kwargs)
                    _check_lazy(model, out)
                    if with_backward:
                        return backward(model, out, None, (args, kwargs), counter, alias)
                else:
                    out = torch.func.functional_call(model, fake_params, args, kwargs)
                    _check_lazy(model, out)
                    if with_backward:
                        return backward(model, out, fake_params, (args, kwargs), counter, alias)
            except FlopscopeError:
                raise
            except Exception as e:
                path = counter.failed_in_module(e)
                where = f" in module '{path}' ({counter.module_type(path)})" if path is not None else ""
                dynamic = _data_dependent(e)
                if dynamic is not None and how is not How.REAL:
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


def _float_tensors(out: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in ``out``: in any pytree (tuples, lists, dicts, named
    tuples, registered nodes) and inside dataclasses, each tensor once."""
    found: dict[int, torch.Tensor] = {}
    _walk_floats(out, found, set())
    return list(found.values())


def _walk_floats(tree: Any, found: dict[int, torch.Tensor], seen: set[int]) -> None:
    """:func:`_float_tensors`'s walk (a module function, not a closure: a closure that calls
    itself is a reference cycle, which kept the model's output, its autograd graph included,
    alive until the next cyclic collection)."""
    for leaf in tree_iter(tree):
        if isinstance(leaf, torch.Tensor):
            if leaf.is_floating_point():
                found.setdefault(id(leaf), leaf)
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            if id(leaf) in seen:
                continue
            seen.add(id(leaf))
            _walk_floats([getattr(leaf, f.name, None) for f in dataclasses.fields(leaf)], found,
                         seen)


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


def backward(
    model: nn.Module, out: Any, fake_params: dict[str, torch.Tensor] | None = None,
    inputs: Any = (), counter: Counter | None = None, alias: bool = True,
) -> bool:
    """Backward from every floating-point output that requires grad; ``False`` (and nothing
    run) when the count should be made again with inputs that require grad (see :func:`flopscope.count`)."""
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
