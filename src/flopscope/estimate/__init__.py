"""From counts to cost: roofline time on named hardware and peak memory.

This package consumes counts; nothing in the core imports it. Per-call data arrives through
the Counter's observer hook (:class:`flopscope.core.counter.CallObserver`):

- :class:`CallLog` records what the roofline needs of each call; :meth:`CallLog.estimate` gives an
  :class:`Estimate` (a lower bound on time) for a :class:`Hardware` profile;
- :class:`MemoryTracker` follows tensor storages and gives a :class:`MemoryProfile` (peak bytes,
  where the peak happens, per-module high-water marks).

One-call helpers::

    report, est = flopscope.estimate.roofline(model, x, hardware="h100-sxm")
    report, mem = flopscope.estimate.peak_memory(model, x, train=True, optimizer="adamw")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope.core.counter import CallObserver, Counter
from flopscope.errors import FlopscopeError, UsageError
from flopscope.estimate.hardware import PROFILES, get_hardware, load_hardware
from flopscope.estimate.memory import CATEGORIES, MemoryProfile, MemoryTracker
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog, Estimate, Row
from flopscope.estimate.this_machine import measure_this_machine
from flopscope.report.report import Report
from flopscope.run import Inputs, count, reset_observers

__all__ = [
    "CATEGORIES",
    "PROFILES",
    "CallLog",
    "Estimate",
    "Hardware",
    "MemoryProfile",
    "MemoryTracker",
    "Row",
    "default_loss",
    "get_hardware",
    "load_hardware",
    "measure_this_machine",
    "peak_memory",
    "roofline",
]

OptimizerArg = str | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None


def roofline(
    model: nn.Module,
    /,
    *args: Any,
    hardware: str | Hardware = "h100-sxm",
    tf32: bool | None = None,
    **count_kwargs: Any,
) -> tuple[Report, Estimate]:
    """Count ``model(*args)`` and estimate its time on ``hardware`` (a roofline lower bound).

    Args:
        model: the model.
        *args: its positional arguments (or one :class:`flopscope.Inputs`).
        hardware: a profile name (:data:`PROFILES`), a JSON/TOML file, ``"this-machine"``, or a
            :class:`Hardware`.
        tf32: float32 matrix products as TF32; ``None``: as torch is set.
        **count_kwargs: options and model keywords for :func:`flopscope.count`
            (``shape_only=True``, ``backward=True``, ...).

    Returns:
        The report and the estimate.

    Raises:
        UsageError: an unknown hardware profile, or bad count arguments.
    """
    hw = get_hardware(hardware)
    log = CallLog()
    observers = [*count_kwargs.pop("observers", ()), log]
    report = count(model, *args, observers=observers, **count_kwargs)
    return report, log.estimate(hw, tf32=tf32)


def _optimizer(spec: OptimizerArg, params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    if spec is None:
        return None
    if callable(spec):
        return spec(params)
    name = spec.lower()
    if name == "sgd":  # momentum: one state tensor per parameter, as usually trained
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    raise UsageError(f"unknown optimizer {spec!r}: use 'sgd', 'adam', 'adamw', None, or a "
                     "function that takes the parameters and returns an optimizer")


def default_loss(out: Any) -> torch.Tensor:
    """The loss a training step backpropagates when none is given: the sum of every
    floating-point output that requires grad.

    Args:
        out: the model's output (any pytree of tensors).

    Returns:
        A scalar tensor.

    Raises:
        UsageError: no output requires grad.
    """
    roots = [t for t in tree_iter(out)
             if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    if not roots:
        raise UsageError("the model returned no floating-point output that requires grad: "
                         "nothing to train; pass loss_fn=")
    loss = roots[0].sum()
    for t in roots[1:]:
        loss = loss + t.sum()
    return loss


def _on_meta(model: nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def _split_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...],
                                                                           dict[str, Any]]:
    if len(args) == 1 and isinstance(args[0], Inputs):
        return args[0].args, {**args[0].kwargs, **kwargs}
    return args, kwargs


def peak_memory(
    model: nn.Module,
    /,
    *args: Any,
    train: bool = False,
    optimizer: OptimizerArg = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    shape_only: bool = False,
    rules: Any = None,
    strict: bool = False,
    observers: Sequence[CallObserver] = (),
    **kwargs: Any,
) -> tuple[Report, MemoryProfile]:
    """Peak memory of an inference forward or of one training step, from tensor lifetimes.

    Inference (``train=False``): one forward in eval mode under ``torch.no_grad()`` (through
    :func:`flopscope.count`). Training (``train=True``): a steady-state step in train mode:
    ``zero_grad(set_to_none=True)``, ``loss_fn(model(*args)).backward()`` (the output is not
    kept during ``step()``), ``step()``. One
    untracked warm-up step runs first so that the optimizer's state exists, as in every step but
    the first. The model is left as it was: parameters, buffers, ``.grad`` and training flags are
    put back (a real model's tensors are copied before the warm-up for that).

    Shape-only (``shape_only=True``, or a model on the ``meta`` device) runs on ``meta`` tensors
    (a real model is deep-copied to ``meta`` first): no arithmetic and no memory, the same
    lifetimes, so a large model's step can be sized on a laptop. The optimizer runs its
    single-tensor implementation there (``foreach`` is chosen on GPUs only); pass
    ``optimizer=lambda p: torch.optim.AdamW(p, foreach=True)`` to size the GPU's.

    Args:
        model: the model.
        *args: its positional arguments (or one :class:`flopscope.Inputs`).
        train: a training step instead of an inference forward.
        optimizer: ``"sgd"`` (momentum 0.9), ``"adam"``, ``"adamw"``, ``None`` (forward and
            backward only), or a function from the parameter list to an optimizer.
        loss_fn: output -> scalar loss (default: the sum of floating-point outputs).
        shape_only: run on meta tensors.
        rules: extra rules, as for :func:`flopscope.count`.
        strict: raise at the first operator without a rule, as for :func:`flopscope.count`.
        observers: more observers of the same run (a :class:`CallLog` for time).
        **kwargs: keyword arguments of the model.

    Returns:
        The report of the counted run and its :class:`MemoryProfile`.

    Raises:
        UsageError: bad arguments, an unknown optimizer, or no output to train.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"peak_memory() takes an nn.Module, not {type(model).__name__}")
    args, kwargs = _split_inputs(args, kwargs)
    tracker = MemoryTracker()
    if not train:
        return _inference(model, args, kwargs, tracker, shape_only, rules, strict, observers)
    return _train_step(model, args, kwargs, tracker, optimizer, loss_fn or default_loss,
                       shape_only, rules, strict, observers)


def _inference(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               tracker: MemoryTracker, shape_only: bool, rules: Any, strict: bool,
               observers: Sequence[CallObserver]) -> tuple[Report, MemoryProfile]:
    # count() shows observers the model's own tensors and the caller's inputs wherever it runs
    # on copies of them (meta or fake tensors: Counter.stand_ins)
    tracker.register(model.parameters(), "parameters")
    tracker.register(model.buffers(), "buffers")
    tracker.register(tree_iter((args, kwargs)), "inputs")
    with torch.no_grad():
        report = count(model, Inputs(*args, **kwargs), shape_only=shape_only, train=False,
                       rules=rules, strict=strict, warn=False, observers=[tracker, *observers])
    profile = tracker.profile()
    return report, _noted(profile, False, "inference forward under torch.no_grad(), eval mode")


def _noted(profile: MemoryProfile, train: bool, note: str) -> MemoryProfile:
    import dataclasses

    return dataclasses.replace(profile, train=train, note=note)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_iter(tree) if isinstance(t, torch.Tensor)]


def _train_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                tracker: MemoryTracker, optimizer: OptimizerArg,
                loss_fn: Callable[[Any], torch.Tensor], shape_only: bool, rules: Any,
                strict: bool, observers: Sequence[CallObserver]) -> tuple[Report, MemoryProfile]:
    """A training step on the model's own tensors; shape-only, on ``meta`` tensors or, where
    the model cannot run there (it reads a value, or picks a fused path by device), on fake CPU
    tensors, as :func:`flopscope.count` does."""
    from flopscope.execution.meta import (
        ShapeOnlyFakeMode,
        converted_copy,
        needs_fake_cpu,
        to_fake,
    )

    on_meta = _on_meta(model)
    run_model = model
    if shape_only and not on_meta:
        run_model = converted_copy(model, lambda t: t.to("meta"))
        on_meta = True
    if not on_meta:
        return _step(run_model, args, kwargs, tracker, optimizer, loss_fn, rules, strict,
                     observers, None)
    if not needs_fake_cpu(list(run_model.modules())):
        meta_args, meta_kwargs = tree_map_only(
            torch.Tensor, lambda t: t if t.is_meta else t.detach().to("meta"), (args, kwargs))
        try:
            return _step(run_model, meta_args, meta_kwargs, tracker, optimizer, loss_fn, rules,
                         strict, observers, None)
        except FlopscopeError:
            raise
        except Exception:  # noqa: BLE001 - it cannot run on meta: again on fake CPU tensors
            tracker.close()
            tracker = MemoryTracker()  # what the attempt registered were its own meta copies
            reset_observers(observers)  # the abandoned attempt's calls do not count
    fake_mode = ShapeOnlyFakeMode(allow_non_fake_inputs=True)
    fake_args, fake_kwargs = tree_map_only(torch.Tensor, lambda t: to_fake(fake_mode, t),
                                           (args, kwargs))
    fake_model = converted_copy(run_model, lambda t: to_fake(fake_mode, t))
    return _step(fake_model, fake_args, fake_kwargs, tracker,
                 optimizer, loss_fn, rules, strict, observers, fake_mode)


def _step(run_model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
          tracker: MemoryTracker, optimizer: OptimizerArg,
          loss_fn: Callable[[Any], torch.Tensor], rules: Any, strict: bool,
          observers: Sequence[CallObserver], fake_mode: Any) -> tuple[Report, MemoryProfile]:
    """One tracked steady-state step of ``run_model`` (a warm-up step first), on real, ``meta``
    or (with ``fake_mode``) fake tensors; the model's flags, gradients and values are put back."""
    import dataclasses

    on_meta = fake_mode is not None or _on_meta(run_model)
    params = [p for p in run_model.parameters() if p.requires_grad]
    if not params:
        raise UsageError("train=True, but the model has no parameter that requires grad")
    modes = [(m, m.training) for m in run_model.modules()]
    grads = [(p, p.grad) for p in run_model.parameters()]
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if not on_meta:  # the warm-up and the step change parameters and buffers: copy them back
        with torch.no_grad():
            saved = [(t, t.detach().clone())
                     for t in [*run_model.parameters(), *run_model.buffers()]]
    try:
        run_model.train(True)
        with ExitStack() as stack:
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            elif on_meta:
                from flopscope.execution.meta import sdpa_as_cpu

                stack.enter_context(sdpa_as_cpu())
            opt = _optimizer(optimizer, params)

            def step() -> None:
                # the output and loss are released before step(), as in
                # loss_fn(model(x)).backward(): the logits of a language model are large
                loss_fn(run_model(*args, **kwargs)).backward()
                if opt is not None:
                    opt.step()

            if opt is not None:  # warm-up: the optimizer's state exists from the second step
                step()
                opt.zero_grad(set_to_none=True)
            for p in params:
                p.grad = None
            state = _tensors([list(s.values()) for s in opt.state.values()]) if opt else []
            tracker.register(run_model.parameters(), "parameters")
            tracker.register(run_model.buffers(), "buffers")
            tracker.register(state, "optimizer_state")
            tracker.register(_tensors((args, kwargs)), "inputs")
            with Counter(run_model, rules=rules, strict=strict, warn=False,
                         observers=[tracker, *observers]) as counter:
                step()
            state = _tensors([list(s.values()) for s in opt.state.values()]) if opt else []
            profile = tracker.profile(relabel={
                "gradients": [p.grad for p in params if p.grad is not None],
                "optimizer_state": state,
            })
            del state
    finally:
        for m, mode in modes:
            m.training = mode
        for p, g in grads:
            p.grad = g
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)
    report = counter.report
    if on_meta:
        report = dataclasses.replace(report, shape_only=True)
    what = "zero_grad(set_to_none), forward, backward" + (
        f", {type(opt).__name__}.step()" if opt is not None else "")
    return report, _noted(profile, True, f"training step (steady state): {what}")
