"""Measured time beside every count: :func:`measure`.

The model is counted once (every operator call in order, with its module, phase and cost, and
what the roofline needs of it), then run for real, without flopscope's dispatch mode: warm-up
runs, then ``repeat`` runs under ``torch.profiler`` (CPU activities; CUDA too where the model is
on a GPU), each inside a ``record_function`` range (:data:`~flopscope.timing.join.REGION`), with
each module call inside a range of its own (``module::<path>``, for the trace's module track).
The counted calls are joined to the profiler's events by name and order
(:mod:`flopscope.timing.join`); per call, the median over the runs and its spread. The model is
left as it was (its state saved before the runs and put back after).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter

from flopscope.core.facts import facts
from flopscope.core.module_calls import listen, stop_listening
from flopscope.core.unseen import unseen
from flopscope.cost import Cost, OpCall, Phase
from flopscope.errors import UsageError
from flopscope.estimate import heap
from flopscope.estimate.bound import Row, call_row, resolve_tf32
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog
from flopscope.execution.forward import backward as run_backward
from flopscope.execution.how import on_meta
from flopscope.execution.inputs import Inputs, model_arguments
from flopscope.execution.snapshot import ModelSnapshot
from flopscope.report.report import Report
from flopscope.report.source import SourceInfo
from flopscope.run import count
from flopscope.timing.join import REGION, Event, events_of, innermost, match, region_events

__all__ = ["NOISY", "CallList", "CallTime", "Timing", "join_calls", "measure", "module_ranges",
           "recording"]

NOISY = 0.10  # a spread (max - min) / median above this is called out as large


class CallList:
    """An observer that keeps every counted call in order: module, phase, operator, cost."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Phase, str, str, Cost]] = []

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call (a module rule's, with no call, is never matched to an event)."""
        schema = facts(call.op).schema_name if call is not None else ""
        self.calls.append((path, phase, op, schema, cost))

    def reset(self) -> None:
        """Forget an abandoned attempt."""
        self.calls.clear()


@dataclass(frozen=True)
class CallTime:
    """One counted operator call and its measured time.

    Attributes:
        index: its place in the run (0 first).
        module: the module path it is attributed to.
        phase: its phase.
        op: the operator's report name.
        cost: what it costs (as counted).
        seconds: its measured time in the median run (the run of median wall time; 0 when it
            was not matched there), so that the calls and the time outside them add up to
            that run's wall time.
        runs: its time in each run (``None`` where not matched).
        bound: its roofline row on the profile (a lower bound), or ``None`` without one.
        start_s: its start in the median run, from the region's start (for the trace).
    """

    index: int
    module: str
    phase: Phase
    op: str
    cost: Cost
    seconds: float
    runs: tuple[float | None, ...]
    bound: Row | None = None
    start_s: float = 0.0

    @property
    def matched(self) -> bool:
        """Whether a profiler event was found for it in every run."""
        return all(t is not None for t in self.runs)


@dataclass(frozen=True)
class Timing:
    """What a profiled run measured, joined to its count.

    Attributes:
        calls: every counted call with its time.
        walls: the region's wall time of each measured run, seconds.
        outsides: per run, the wall time not inside any counted call (Python, module hooks,
            composite operators' own dispatch, launch gaps).
        median_run: the run whose wall time is the median: the one the figures are of.
        warmup: unmeasured runs before.
        device: ``"cpu"`` or ``"cuda"`` (on CUDA a call's time is its kernels' time).
        hardware: the profile the bounds are on, or ``None``.
        modules: the module spans of the median run: (path, start, end) seconds from the
            region's start, for the trace.
        events: the median run's profiler events (seconds from its start), for the trace.
        countings: per run, the time flopscope's counting mode spent inside the counted calls'
            events (a block counted and measured in one run, :func:`flopscope.profiling`; part
            of the time outside the calls); empty when the runs were not counted.
    """

    calls: tuple[CallTime, ...]
    walls: tuple[float, ...]
    outsides: tuple[float, ...]
    warmup: int
    device: str
    median_run: int = 0
    hardware: Hardware | None = None
    modules: tuple[tuple[str, float, float], ...] = ()
    events: tuple[Event, ...] = field(default=(), repr=False)
    countings: tuple[float, ...] = ()

    @property
    def wall_s(self) -> float:
        """The median run's wall time."""
        return self.walls[self.median_run]

    @property
    def outside_s(self) -> float:
        """The median run's time outside every counted call (its calls' times plus this are its
        wall time)."""
        return self.outsides[self.median_run]

    @property
    def counting_s(self) -> float | None:
        """The median run's time in flopscope's counting mode inside the calls' events, or
        ``None`` when the runs were not counted."""
        return self.countings[self.median_run] if self.countings else None

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median wall time of the runs."""
        return (max(self.walls) - min(self.walls)) / self.wall_s if self.wall_s else 0.0

    @property
    def unmatched(self) -> int:
        """Counted calls that do work (FLOPs or bytes) with no profiler event in some run: the
        gradient ``add`` autograd's engine makes where a tensor feeds several operators (its
        input buffers, recorded by no event; their time is in the time outside the calls).
        Calls that only make views without a recorded event (the ``detach`` of a tensor autograd
        saves) are not among them; every unmatched call shows 0 s."""
        return sum(not c.matched and bool(c.cost.flops or c.cost.bytes) for c in self.calls)


@contextmanager
def module_ranges(model: nn.Module) -> Iterator[None]:
    """Within the block, each call of a module of ``model`` runs inside a profiler range of its
    own (``module::<path>``, the trace's module track). Module calls are seen as a Counter sees
    them (:mod:`flopscope.core.module_calls`); a range is PyTorch's C++ record-function scope,
    which no dispatch mode sees (``torch.profiler.record_function`` is an operator call, about
    ten times the cost, that a Counter around the block would otherwise count)."""
    names = {m: f"module::{p or '(root)'}" for p, m in model.named_modules()}
    spans: list[Any] = []

    def enter(module: nn.Module, _: Any) -> None:
        name = names.get(module)
        if name is not None:
            span = _range(name)
            span.__enter__()
            spans.append(span)

    def leave(module: nn.Module, _: Any, __: Any) -> None:
        if module in names and spans:
            spans.pop().__exit__(None, None, None)

    listener = listen(enter, leave)
    try:
        yield
    finally:
        stop_listening(listener)


def _range(name: str) -> Any:
    """A profiler range named ``name``, entered and exited by the caller."""
    if _FAST_RANGE is not None:
        return _FAST_RANGE(name)
    from torch.profiler import record_function

    return _Unseen(record_function(name))


class _Unseen:
    """A ``record_function`` range opened and closed unseen by the dispatch modes."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def __enter__(self) -> None:
        with unseen():
            self.span.__enter__()

    def __exit__(self, *exc: Any) -> None:
        with unseen():
            self.span.__exit__(*exc)


# PyTorch's C++ record-function scope (torch >= 2.2; older: record_function, unseen)
_FAST_RANGE: Any = getattr(torch._C._profiler, "_RecordFunctionFast", None)


def _region_runs(model: nn.Module, run: Callable[[], None], repeat: int, cuda: bool) -> list[Any]:
    """``repeat`` calls of ``run`` (one run of ``model``) under ``torch.profiler``, each in a
    region, each module call in a range of its own; the profiler's events."""
    from torch.profiler import record_function

    with recording(cuda) as prof, module_ranges(model):
        for _ in range(repeat):
            with record_function(REGION):
                run()
                if cuda:
                    torch.cuda.synchronize()
    return list(prof.events())


@contextmanager
def recording(cuda: bool) -> Iterator[Any]:
    """``torch.profiler`` recording within the block: CPU activities, and CUDA ones with
    ``cuda``; its own start and stop lines muted.

    Args:
        cuda: record CUDA kernels too.

    Yields:
        The profiler (its ``events()`` after the block).
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    with _native_stderr_muted():  # kineto prints a line at start and one at stop
        prof.__enter__()
    try:
        yield prof
    finally:
        with _native_stderr_muted():
            prof.__exit__(None, None, None)


@contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Native code's writes to standard error dropped while the block runs (the profiler's own
    start and stop lines; Python's ``sys.stderr`` is flushed first and left alone after)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedded interpreter): nothing to mute
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _one_run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             with_backward: bool) -> None:
    out = model(*args, **kwargs)
    if with_backward:
        run_backward(model, out, None, (args, kwargs), None, alias=True)


def measure(
    model: nn.Module | str,
    /,
    *args: Any,
    backward: bool = False,
    train: bool = False,
    optimizer: Any = "adamw",
    warmup: int = 2,
    repeat: int = 5,
    hardware: Hardware | None = None,
    tf32: bool | None = None,
    rules: Any = None,
    source: SourceInfo | None = None,
    **kwargs: Any,
) -> tuple[Report, Timing]:
    """Count ``model(*args, **kwargs)`` and measure it: every counted call joined to its time.

    Args:
        model: the model (real tensors; counted as :func:`flopscope.count` counts it), or a
            SOURCE string (:func:`flopscope.sources.named`: its default inputs unless given).
        *args: its positional arguments (or one :class:`flopscope.Inputs`).
        backward: a forward and backward (gradients of the parameters), as
            ``count(..., backward=True)``; otherwise an inference forward under ``no_grad``.
        train: a steady-state training step in train mode: ``zero_grad``, the sum of the
            floating outputs backpropagated, ``optimizer.step()`` (as ``peak_memory``'s step;
            a warm-up step first, so the optimizer's state exists).
        optimizer: with ``train``: ``"adamw"``, ``"adam"``, ``"sgd"``, ``None`` or a function of
            the parameters.
        warmup: unmeasured runs first.
        repeat: measured runs (the median and the spread are over them).
        hardware: a profile for each call's roofline bound, or ``None``.
        tf32: float32 products as TF32 on ``hardware`` (``None``: as torch is set).
        rules: extra rules, as for :func:`flopscope.count`.
        source: where the model came from (the report's ``meta``).
        **kwargs: keyword arguments of the model.

    Returns:
        The count's report and the :class:`Timing`.

    Raises:
        UsageError: a model or input on ``meta`` (nothing to measure), or bad counts of runs.
    """
    from flopscope.sources import model_of

    model, args, kwargs, source = model_of("profile", model, args, kwargs, source=source)
    args, kwargs = model_arguments(args, kwargs)
    if warmup < 0 or repeat < 1:
        raise UsageError(f"profile needs warmup >= 0 and repeat >= 1 (got {warmup}, {repeat})")
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in tree_iter((args, kwargs)) if isinstance(t, torch.Tensor))]
    if on_meta(model.modules()) or any(t.is_meta for t in tensors):
        raise UsageError("profile measures a real run: the model and its inputs must hold real "
                         "tensors, not meta ones (count shape-only with flopscope count)")
    cuda = any(t.is_cuda for t in tensors)
    calls, log = CallList(), CallLog()
    if train:
        return _train(model, args, kwargs, optimizer, warmup, repeat, hardware, tf32, rules,
                      source, cuda, calls, log)
    with torch.no_grad() if not backward else torch.enable_grad():
        report = count(model, Inputs(*args, **kwargs), backward=backward, rules=rules,
                       warn=False, observers=[calls, log], source=source)
    snapshot = ModelSnapshot(list(model.modules()))
    snapshot.keep_values()
    try:
        if not cuda:  # the runs' page faults are this process's heap's (estimate.heap)
            log.heap_start = heap.this_process()
        with torch.no_grad() if not backward else torch.enable_grad():
            for _ in range(warmup):
                _one_run(model, args, kwargs, backward)
            if cuda:
                torch.cuda.synchronize()
            events = events_of(_region_runs(
                model, lambda: _one_run(model, args, kwargs, backward), repeat, cuda))
    finally:
        snapshot.restore()
    timing = join_calls(calls.calls, log, events, warmup, "cuda" if cuda else "cpu", hardware,
                     tf32)
    return report, timing


def _train(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], optimizer: Any,
           warmup: int, repeat: int, hardware: Hardware | None, tf32: bool | None, rules: Any,
           source: SourceInfo | None, cuda: bool, calls: CallList,
           log: CallLog) -> tuple[Report, Timing]:
    """A training step counted (:func:`flopscope.execution.training.training_step`), then run
    for real inside it (its model, optimizer and state are the counted step's, put back after)."""
    from flopscope.core.counter import Counter
    from flopscope.execution.how import How
    from flopscope.execution.training import Step, default_loss, training_step

    def counter(step: Step) -> Counter:
        return Counter(step.model, rules=rules, warn=False, observers=[calls, log])

    def after(step: Step) -> list[Event]:
        def run() -> None:
            if step.optimizer is not None:
                step.optimizer.zero_grad(set_to_none=True)
            default_loss(step.model(*step.args, **step.kwargs)).backward()
            if step.optimizer is not None:
                step.optimizer.step()

        if not cuda:  # the runs' page faults are this process's heap's (estimate.heap)
            log.heap_start = heap.this_process()
        for _ in range(warmup):
            run()
        return events_of(_region_runs(step.model, run, repeat, cuda))

    counted, events, how = training_step(
        model, args, kwargs, optimizer=optimizer, loss_fn=default_loss, shape_only=False,
        counter=counter, after=after, on_retry=calls.reset)
    assert how is How.REAL
    report = counted.make_report(meta=source)
    return report, join_calls(calls.calls, log, events, warmup, "cuda" if cuda else "cpu",
                           hardware, tf32)


def join_calls(calls: Sequence[tuple[str, Phase, str, str, Cost]], log: CallLog,
               events: list[Event], warmup: int, device: str, hardware: Hardware | None,
               tf32: bool | None, *, counted: bool = False) -> Timing:
    """The counted calls joined to each measured run's events (see :mod:`.join`).

    Args:
        calls: the counted calls, in order (:class:`CallList`).
        log: the same calls' roofline records.
        events: the profile's events.
        warmup: unmeasured runs before.
        device: ``"cpu"`` or ``"cuda"``.
        hardware: the profile of the bounds, or ``None``.
        tf32: float32 products as TF32 (``None``: as torch is set).
        counted: the runs ran under the counting mode (:func:`flopscope.profiling`): each call's
            time is its operator's own event below the mode (:func:`~.join.innermost`), and the
            mode's share of the calls' events is :attr:`Timing.countings`.

    Returns:
        The timing.

    Raises:
        UsageError: no measured run was recorded.
    """
    names = [schema for _, _, _, schema, _ in calls]
    if hardware is not None:  # the heap's page faults (estimate.heap), as log.estimate does
        log.simulate_faults(hardware)
    runs = region_events(events)
    per_call: list[list[float | None]] = [[] for _ in calls]
    starts: list[list[float | None]] = [[] for _ in calls]
    walls, outsides, countings = [], [], []
    for region, inside in runs:
        ops = [e for e in inside if not e.name.startswith("module::")]
        found = match(names, ops)
        total = counting = 0.0
        for i, k in enumerate(found):
            if k is None:
                per_call[i].append(None)
                starts[i].append(None)
                continue
            ev = ops[innermost(ops, k)] if counted else ops[k]
            counting += (ops[k].dur_us - ev.dur_us) / 1e6
            seconds = (ev.device_us if device == "cuda" else ev.dur_us) / 1e6
            per_call[i].append(seconds)
            starts[i].append((ev.start_us - region.start_us) / 1e6)
            total += seconds
        wall = region.dur_us / 1e6
        walls.append(wall)
        outsides.append(wall - total)
        countings.append(counting)
    if not runs:
        raise UsageError("the profiler recorded no measured run (no region event)")
    matmul_tf32, convolution_tf32 = resolve_tf32(tf32)
    median_run = sorted(range(len(walls)), key=lambda r: walls[r])[len(walls) // 2]
    out = []
    for i, (path, phase, op, _, cost) in enumerate(calls):
        mine = per_call[i][median_run]
        bound = (call_row(log.records[i], hardware, matmul_tf32, convolution_tf32)
                 if hardware is not None and i < len(log.records) else None)
        start = starts[i][median_run] or 0.0
        out.append(CallTime(i, path, phase, op, cost, mine if mine is not None else 0.0,
                            tuple(per_call[i]), bound, start))
    region, inside = runs[median_run]
    modules = tuple((e.name.removeprefix("module::"), (e.start_us - region.start_us) / 1e6,
                     (e.end_us - region.start_us) / 1e6)
                    for e in inside if e.name.startswith("module::"))
    return Timing(tuple(out), tuple(walls), tuple(outsides), warmup, device, median_run,
                  hardware, modules, tuple(inside), tuple(countings) if counted else ())
