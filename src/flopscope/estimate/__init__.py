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
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_iter

from flopscope.core.counter import Counter
from flopscope.core.observers import CallObserver, reset_observers
from flopscope.errors import UsageError
from flopscope.estimate.bound import Estimate, Row
from flopscope.estimate.calibrate import calibrate
from flopscope.estimate.calibration import Calibration
from flopscope.estimate.display import EstimateSection, MemorySection
from flopscope.estimate.hardware import PROFILES, get_hardware, load_hardware
from flopscope.estimate.memory import CATEGORIES, MemoryProfile, MemoryTracker
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog
from flopscope.estimate.this_machine import measure_this_machine
from flopscope.execution.how import How
from flopscope.execution.inputs import Inputs, model_arguments
from flopscope.execution.training import (
    OptimizerArg,
    Step,
    default_loss,
    tensors,
    training_step,
)
from flopscope.report.report import Report
from flopscope.report.source import SourceInfo
from flopscope.run import count

__all__ = [
    "CATEGORIES",
    "PROFILES",
    "CallLog",
    "Calibration",
    "Estimate",
    "Hardware",
    "MemoryProfile",
    "MemoryTracker",
    "Row",
    "calibrate",
    "default_loss",
    "get_hardware",
    "MemoryResult",
    "RooflineResult",
    "load_hardware",
    "measure_this_machine",
    "peak_memory",
    "roofline",
]


class _Unset:
    """The default of an option whose presence matters (``optimizer=`` without ``train=``)."""


_DEFAULT = _Unset()


class RooflineResult(NamedTuple):
    """What :func:`roofline` returns (it unpacks as ``report, estimate``).

    Attributes:
        report: the count, with the estimate as a section (its table shows the estimate).
        estimate: the roofline estimate (a lower bound on time).
    """

    report: Report
    estimate: Estimate


class MemoryResult(NamedTuple):
    """What :func:`peak_memory` returns (it unpacks as ``report, memory``).

    Attributes:
        report: the count, with the memory profile as a section.
        memory: the memory profile.
    """

    report: Report
    memory: MemoryProfile

def roofline(
    model: nn.Module,
    /,
    *args: Any,
    hardware: str | Hardware = "h100-sxm",
    tf32: bool | None = None,
    **count_kwargs: Any,
) -> RooflineResult:
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
        The report (the estimate one of its sections) and the estimate.

    Raises:
        UsageError: an unknown hardware profile, or bad count arguments.
    """
    hw = get_hardware(hardware)
    log = CallLog()
    observers = [*count_kwargs.pop("observers", ()), log]
    report = count(model, *args, observers=observers, **count_kwargs)
    estimate = log.estimate(hw, tf32=tf32)
    return RooflineResult(report.with_sections(EstimateSection(estimate)), estimate)


def peak_memory(
    model: nn.Module | str,
    /,
    *args: Any,
    train: bool = False,
    optimizer: OptimizerArg | _Unset = _DEFAULT,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    shape_only: bool = False,
    rules: Any = None,
    strict: bool = False,
    observers: Sequence[CallObserver] = (),
    source: SourceInfo | None = None,
    **kwargs: Any,
) -> MemoryResult:
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
        model: the model, or a SOURCE string (``"hf:llama"``: :func:`flopscope.sources.named`,
            its default inputs unless given).
        *args: its positional arguments (or one :class:`flopscope.Inputs`).
        train: a training step instead of an inference forward.
        optimizer: ``"sgd"`` (momentum 0.9), ``"adam"``, ``"adamw"`` (the default), ``None``
            (forward and backward only), or a function from the parameter list to an optimizer;
            with ``train=True`` only.
        loss_fn: output -> scalar loss (default: the sum of floating-point outputs); with
            ``train=True`` only.
        shape_only: run on meta tensors.
        rules: extra rules, as for :func:`flopscope.count`.
        strict: raise at the first operator without a rule, as for :func:`flopscope.count`.
        observers: more observers of the same run (a :class:`CallLog` for time).
        source: where the model came from (the report's ``meta``).
        **kwargs: keyword arguments of the model.

    Returns:
        The report of the counted run (the profile one of its sections) and its
        :class:`MemoryProfile`.

    Raises:
        UsageError: bad arguments, an unknown optimizer, or no output to train.
    """
    from flopscope.sources import model_of

    model, args, kwargs, source = model_of("peak_memory", model, args, kwargs,
                                           shape_only=shape_only, source=source)
    if not train and (optimizer is not _DEFAULT or loss_fn is not None):
        given = "optimizer=" if optimizer is not _DEFAULT else "loss_fn="
        raise UsageError(f"peak_memory({given}...) sizes a training step, but train is False: "
                         "pass train=True, or leave it out for an inference forward")
    if optimizer is _DEFAULT:
        optimizer = "adamw"
    assert not isinstance(optimizer, _Unset)
    args, kwargs = model_arguments(args, kwargs)
    tracker = MemoryTracker()
    if not train:
        report, profile = _inference(model, args, kwargs, tracker, shape_only, rules, strict,
                                     observers, source)
    else:
        report, profile = _train_step(model, args, kwargs, tracker, optimizer,
                                      loss_fn or default_loss, shape_only, rules, strict,
                                      observers, source)
    return MemoryResult(report.with_sections(MemorySection(profile)), profile)


def _inference(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               tracker: MemoryTracker, shape_only: bool, rules: Any, strict: bool,
               observers: Sequence[CallObserver],
               source: SourceInfo | None) -> tuple[Report, MemoryProfile]:
    # count() shows observers the model's own tensors and the caller's inputs wherever it runs
    # on copies of them (meta or fake tensors: Counter.stand_ins)
    tracker.register(model.parameters(), "parameters")
    tracker.register(model.buffers(), "buffers")
    tracker.register(tree_iter((args, kwargs)), "inputs")
    with torch.no_grad():
        report = count(model, Inputs(*args, **kwargs), shape_only=shape_only, train=False,
                       rules=rules, strict=strict, warn=False, observers=[tracker, *observers],
                       source=source)
    profile = tracker.profile()
    return report, _noted(profile, False, "inference forward under torch.no_grad(), eval mode")


def _noted(profile: MemoryProfile, train: bool, note: str) -> MemoryProfile:
    import dataclasses

    return dataclasses.replace(profile, train=train, note=note)


def _train_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                tracker: MemoryTracker, optimizer: OptimizerArg,
                loss_fn: Callable[[Any], torch.Tensor], shape_only: bool, rules: Any,
                strict: bool, observers: Sequence[CallObserver],
                source: SourceInfo | None) -> tuple[Report, MemoryProfile]:
    """A training step (:func:`flopscope.execution.training.training_step`), its tensors
    registered with the memory tracker once the warm-up has made the optimizer's state."""
    trackers = [tracker]

    def counter(step: Step) -> Counter:
        t = trackers[-1]
        t.register(step.model.parameters(), "parameters")
        t.register(step.model.buffers(), "buffers")
        t.register(step.optimizer_state(), "optimizer_state")
        t.register(tensors((step.args, step.kwargs)), "inputs")
        return Counter(step.model, rules=rules, strict=strict, warn=False,
                       observers=[t, *observers])

    def after(step: Step) -> tuple[MemoryProfile, str]:
        profile = trackers[-1].profile(relabel={
            "gradients": [p.grad for p in step.params if p.grad is not None],
            "optimizer_state": step.optimizer_state(),
        })
        opt = step.optimizer
        return profile, f", {type(opt).__name__}.step()" if opt is not None else ""

    def retry() -> None:
        trackers[-1].close()
        trackers.append(MemoryTracker())  # what the attempt registered were its own copies
        reset_observers(observers)  # the abandoned attempt's calls do not count

    counted, (profile, stepped), how = training_step(
        model, args, kwargs, optimizer=optimizer, loss_fn=loss_fn, shape_only=shape_only,
        counter=counter, after=after, on_retry=retry)
    report = counted.make_report(shape_only=how is not How.REAL, meta=source)
    return report, _noted(profile, True, "training step (steady state): zero_grad(set_to_none), "
                                         f"forward, backward{stepped}")
