"""Monitoring a training loop at (almost) no cost: count once per input signature, reuse after.

A training step's FLOPs depend on the shapes and dtypes of its inputs, on the model's training
mode and on which parameters require grad (a frozen weight has no weight-gradient product). The
:class:`TrainingMonitor` keys its counts on exactly that *signature*; the first step with a new
signature is counted, the following ones reuse the count, so a logged step costs a dictionary
lookup and a clock read.

Two ways to count a step whose signature is new:

- **live** (:meth:`TrainingMonitor.step` given the batch, the Lightning callback): a
  :class:`~flopscope.Counter` is active for the whole step: forward, loss, backward, optimizer:
  exactly what ran;
- **shadow** (the ``transformers`` callback, which does not see the batch before the step): a
  forward pre-hook on the model records the forward's inputs when their signature is new; after
  the step :func:`flopscope.count` counts forward + backward of those inputs on a copy of the
  model on the meta device (no weights copied; falling back to fake tensors, then to real
  tensors for data-dependent models). The optimizer step is not included.

When a cached count is wrong: data-dependent shapes or work (mixture-of-experts routing, early
exits, ``nonzero``-based packing, dynamic padding inside the model) change the FLOPs without
changing the signature; give ``recount_every=k`` to count again every k steps (the logged
figure is then that of the latest count). A new signature is reported (``new_signature`` in
:class:`StepStats`) so shape changes are visible.

Model FLOPs use attention's visible pairs (:class:`~flopscope.llm.AttentionFigures`); MFU =
model FLOPs / seconds / peak, HFU = hardware FLOPs (recomputation included, attention as
executed) / seconds / peak.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from flopscope.core.counter import Counter
from flopscope.execution.copies import meta_input, meta_twin
from flopscope.llm.attention import AttentionFigures
from flopscope.llm.flops import peak_flops, report_flops

__all__ = ["StepStats", "TrainingMonitor", "input_signature", "tokens_in"]

_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _leaf_meta(tree: Any, out: list[Any]) -> None:
    if isinstance(tree, torch.Tensor):
        out.append((tuple(tree.shape), tree.dtype, tree.requires_grad))
    elif isinstance(tree, dict):
        for k in sorted(tree, key=str):
            out.append(str(k))
            _leaf_meta(tree[k], out)
    elif isinstance(tree, (list, tuple)):
        out.append(len(tree))
        for item in tree:
            _leaf_meta(item, out)
    elif isinstance(tree, (int, float, bool, str, type(None))):
        out.append(tree)
    else:
        out.append(type(tree).__name__)


def input_signature(model: nn.Module, args: Any, kwargs: Any = None, *,
                    params: Sequence[nn.Parameter] | None = None) -> tuple[Any, ...]:
    """What a step's cost depends on: input shapes and dtypes, training mode, which parameters
    require grad.

    Args:
        model: the model.
        args: the step's inputs (any nesting of tensors, lists, dicts and scalars).
        kwargs: more inputs.
        params: the model's parameters, listed once by the caller (``model.parameters()``
            walks every module: about 160 us on a 2-layer transformer, most of a monitored
            step's cost); default: listed now.

    Returns:
        A hashable signature.
    """
    leaves: list[Any] = []
    _leaf_meta(args, leaves)
    _leaf_meta(kwargs, leaves)
    if params is None:
        params = list(model.parameters())
    return (tuple(leaves), model.training, _grad_mask(params))


def _grad_mask(params: Sequence[nn.Parameter]) -> tuple[bool, ...]:
    """Which parameters require grad (``map`` with an attrgetter: no Python frame per
    parameter).

    Whether a parameter already holds a gradient is left out on purpose: a backward that adds
    into an existing ``.grad`` (gradient accumulation) costs one add per parameter element
    more, under 1 / (6 x tokens) of the step, and at the start of a step it cannot be told
    whether the loop will ``zero_grad()`` before its backward (Lightning does), so keying on it
    would count most loops' second step again for nothing."""
    return tuple(map(_REQUIRES_GRAD, params))


def tokens_in(args: Any, kwargs: Any = None) -> int:
    """Tokens of a batch: the elements of ``input_ids`` (or of the first integer tensor), else the
    first dimension of the first tensor.

    Args:
        args: the inputs.
        kwargs: more inputs.

    Returns:
        The token (or sample) count, 0 when there is no tensor.
    """
    found: list[torch.Tensor] = []

    def walk(tree: Any) -> None:
        if isinstance(tree, torch.Tensor):
            found.append(tree)
        elif isinstance(tree, dict):
            if isinstance(tree.get("input_ids"), torch.Tensor):
                found.insert(0, tree["input_ids"])
            for v in tree.values():
                walk(v)
        elif isinstance(tree, (list, tuple)):
            for v in tree:
                walk(v)

    walk(kwargs)
    walk(args)
    for t in found:
        if not t.is_floating_point() and not t.is_complex() and t.dtype is not torch.bool:
            return int(t.numel())
    return int(found[0].shape[0]) if found and found[0].dim() else 0


@dataclass(frozen=True)
class _Figures:
    counted_flops: int
    model_flops: int
    hardware_flops: int


@dataclass(frozen=True)
class StepStats:
    """What one monitored step did.

    Attributes:
        step: step number (from 0).
        tokens: tokens (or samples) of the step.
        seconds: wall time of the step (without the counting of a counted step's figures when
            shadow-counted; a live-counted step includes the counter's overhead).
        counted_flops: FLOPs as the report counts them (dense attention).
        model_flops: model FLOPs (visible attention pairs, no recomputation).
        hardware_flops: hardware FLOPs (recomputation, attention as executed).
        counted: this step was counted (a new signature or a due recount).
        new_signature: its signature had not been seen before.
        mfu: model FLOPs / seconds / peak (``None`` without a peak).
        hfu: hardware FLOPs / seconds / peak.
    """

    step: int
    tokens: int
    seconds: float
    counted_flops: int
    model_flops: int
    hardware_flops: int
    counted: bool
    new_signature: bool
    mfu: float | None = None
    hfu: float | None = None

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tflops(self) -> float:
        """Achieved model TFLOP/s."""
        return self.model_flops / self.seconds / 1e12 if self.seconds > 0 else 0.0

    def metrics(self, prefix: str = "flopscope/") -> dict[str, float]:
        """The figures to log, by name.

        Args:
            prefix: put before every name.

        Returns:
            ``flops_per_step``, ``model_flops_per_step``, ``tokens_per_second``, ``tflops``
            and, with a peak, ``mfu`` and ``hfu``.
        """
        out = {"flops_per_step": float(self.counted_flops),
               "model_flops_per_step": float(self.model_flops),
               "tokens_per_second": self.tokens_per_second, "tflops": self.tflops}
        if self.mfu is not None and self.hfu is not None:
            out["mfu"] = self.mfu
            out["hfu"] = self.hfu
        return {prefix + k: v for k, v in out.items()}


class TrainingMonitor:
    """FLOPs per step, tokens/s, achieved TFLOP/s and MFU of a training loop, counted once per
    input signature.

    Plain loop (live counting)::

        monitor = TrainingMonitor(model, peak="h100-sxm")
        for batch in loader:
            with monitor.step(batch):
                loss = loss_fn(model(batch["x"]), batch["y"])
                loss.backward(); opt.step(); opt.zero_grad()
            print(monitor.last.metrics())

    Args:
        model: the model trained.
        peak: hardware peak for MFU: a profile name (``"h100-sxm"``), a
            :class:`flopscope.estimate.Hardware` or FLOP/s; ``None``: no MFU.
        dtype: dtype of the matrix products (picks the profile's peak).
        recount_every: count again every k steps even with a known signature (MoE routing,
            data-dependent shapes); ``None``: never.
        assume_mask: for shape-only (shadow) counts, what explicit attention masks are taken to
            be (see :class:`~flopscope.llm.AttentionFigures`).
        log: called with each :class:`StepStats`.

    Attributes:
        cache: signature -> the counted figures.
        history: every step's :class:`StepStats`; :attr:`last` the latest.
        shadow_path: how the latest shadow count ran: ``"meta"`` (on a meta copy of the model,
            the fast path), ``"fake"`` (fake tensors) or ``"real"`` (real tensors).

    Raises:
        UsageError: an unknown hardware profile.
    """

    def __init__(self, model: nn.Module, *, peak: Any = None,
                 dtype: torch.dtype = torch.bfloat16, recount_every: int | None = None,
                 assume_mask: str | int | None = "causal",
                 log: Callable[[StepStats], None] | None = None) -> None:
        self.model = model
        # listed once: model.parameters() walks every module (most of a step's cost if done
        # per step); listed again by refresh() and whenever a step is counted
        self._params: list[nn.Parameter] = list(model.parameters())
        self.peak = peak_flops(peak, dtype) if peak is not None else None
        self.recount_every = recount_every
        self.assume_mask = assume_mask
        self.log = log
        self.cache: dict[tuple[Any, ...], _Figures] = {}
        self.history: list[StepStats] = []
        self.last: StepStats | None = None
        self._step = 0
        self._t0 = 0.0
        self._live: tuple[Counter, AttentionFigures, tuple[Any, ...]] | None = None
        self._pending: list[tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any]]] = []
        self._forwards: list[tuple[Any, ...]] = []
        self._hook: Any = None
        # how the latest shadow count ran: "meta" (a meta twin), "fake" or "real"
        self.shadow_path: str | None = None
        self._counting = False
        self._new = False
        self._tokens = 0

    def refresh(self) -> None:
        """List the model's parameters again. A step with a new signature does this itself; call
        it after adding parameters (adapters) when neither the inputs nor any existing
        parameter's ``requires_grad`` changed with them, or the cached count is reused."""
        self._params = list(self.model.parameters())

    def _relisted(self, args: Any, kwargs: Any) -> tuple[Any, ...]:
        """The signature with the parameters listed again (a new signature may come from new
        parameters, such as adapters added since the last count)."""
        self.refresh()
        return input_signature(self.model, args, kwargs, params=self._params)

    # -- shadow counting: record forwards -------------------------------------------------------
    def attach(self) -> None:
        """Record the model's forwards (shadow counting); :meth:`detach` removes the hook."""
        if self._hook is None:
            self._hook = self.model.register_forward_pre_hook(self._on_forward, with_kwargs=True)

    def detach(self) -> None:
        """Remove the forward hook of :meth:`attach`."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._counting or self._live is not None:
            return
        sig = input_signature(module, args, kwargs, params=self._params)
        if sig not in self.cache:
            sig = self._relisted(args, kwargs)
        self._forwards.append(sig)
        self._tokens += tokens_in(args, kwargs)
        if (sig not in self.cache or self._due()) and all(s != sig for s, _, _ in self._pending):
            self._pending.append((sig, args, dict(kwargs)))

    def _due(self) -> bool:
        return bool(self.recount_every) and self._step % int(self.recount_every or 1) == 0

    def _shadow_count(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Figures:
        """Forward + backward of recorded inputs, counted without running them for real: on a
        copy of the model on the meta device (the weights not copied: each parameter and
        buffer maps to a meta tensor of its shape). :func:`flopscope.count` then has no real
        tensors to guard, swap to meta copies and restore, or turn into fake tensors (a model
        with device-chosen fast paths, such as ``nn.TransformerEncoderLayer``, still runs as
        fake CPU tensors): 0.14 s instead of 0.25 s on the benchmark's model. If the copy or
        its count fails, the real model is counted shape-only, then for real (a data-dependent
        model)."""
        from flopscope.errors import ForwardError
        from flopscope.execution.inputs import Inputs
        from flopscope.run import count

        train = self.model.training and any(p.requires_grad for p in self._params)
        self._counting = True
        try:
            try:
                twin = meta_twin(self.model, keep={id(self): self})  # the monitor itself stays
                figures = AttentionFigures(assume_mask=self.assume_mask)
                meta_args, meta_kwargs = tree_map_only(torch.Tensor, meta_input, (args, kwargs))
                report = count(twin, Inputs(*meta_args, **meta_kwargs),
                               backward=train, shape_only=True, warn=False, observers=[figures])
                self.shadow_path = "meta"
                return _figures(report, figures)
            except Exception:  # noqa: BLE001 - any failure of the copy: count as before
                pass
            for shape_only in (True, False):
                figures = AttentionFigures(assume_mask=self.assume_mask if shape_only else None)
                try:
                    report = count(self.model, Inputs(*args, **kwargs), backward=train,
                                   shape_only=shape_only, warn=False, observers=[figures])
                    self.shadow_path = "fake" if shape_only else "real"
                    return _figures(report, figures)
                except ForwardError:
                    if not shape_only:
                        raise
            raise AssertionError("unreachable")
        finally:
            self._counting = False

    # -- steps ----------------------------------------------------------------------------------
    def begin(self, *args: Any, **kwargs: Any) -> None:
        """Start a step. Given the step's inputs, a step with a new signature (or a due recount)
        is counted live; without them the forwards recorded by :meth:`attach` are used.

        Args:
            *args: the step's inputs (optional).
            **kwargs: more inputs.
        """
        self._forwards, self._pending, self._new = [], [], False
        self._tokens = tokens_in(args, kwargs) if (args or kwargs) else 0
        if args or kwargs:
            sig = input_signature(self.model, args, kwargs, params=self._params)
            if sig not in self.cache:
                sig = self._relisted(args, kwargs)
            self._forwards = [sig]
            if sig not in self.cache or self._due():
                self._new = sig not in self.cache
                figures = AttentionFigures()
                counter = Counter(self.model, warn=False, observers=[figures])
                self._live = (counter, figures, sig)
                self._t0 = time.perf_counter()
                counter.__enter__()
                return
        self._t0 = time.perf_counter()

    def end(self, tokens: int | None = None) -> StepStats:
        """End the step: its figures from the cache (or the count just made) and its time.

        Args:
            tokens: the step's tokens, if the inputs were not given to :meth:`begin` (default:
                those of the recorded forwards).

        Returns:
            The step's :class:`StepStats` (also in :attr:`last` and :attr:`history`).
        """
        seconds = time.perf_counter() - self._t0
        counted = False
        if self._live is not None:
            counter, figures, sig = self._live
            self._live = None
            counter.__exit__(None, None, None)
            self.cache[sig] = _figures(counter.report, figures)
            counted = True
        for sig, args, kwargs in self._pending:
            self._new = self._new or sig not in self.cache
            self.cache[sig] = self._shadow_count(args, kwargs)
            counted = True
        figs = [self.cache[s] for s in self._forwards if s in self.cache]
        flops = sum(f.counted_flops for f in figs)
        model = sum(f.model_flops for f in figs)
        hardware = sum(f.hardware_flops for f in figs)
        n_tokens = tokens if tokens is not None else self._tokens
        mfu = hfu = None
        if self.peak and seconds > 0:
            mfu, hfu = model / seconds / self.peak, hardware / seconds / self.peak
        stats = StepStats(self._step, n_tokens, seconds, flops, model, hardware, counted,
                          self._new, mfu, hfu)
        self._pending, self._step = [], self._step + 1
        self.last = stats
        self.history.append(stats)
        if self.log is not None:
            self.log(stats)
        return stats

    def abort(self) -> None:
        """Leave a step that raised (the live counter is closed, nothing is logged)."""
        if self._live is not None:
            counter = self._live[0]
            self._live = None
            counter.__exit__(None, None, None)
        self._pending = []

    @contextmanager
    def step(self, *args: Any, **kwargs: Any) -> Iterator[TrainingMonitor]:
        """``with monitor.step(batch): ...``: :meth:`begin` and :meth:`end` around the block.

        Args:
            *args: the step's inputs (they decide the signature and the token count).
            **kwargs: more inputs.

        Yields:
            The monitor.
        """
        self.begin(*args, **kwargs)
        try:
            yield self
        except BaseException:
            self.abort()
            raise
        self.end()


def _figures(report: Any, figures: AttentionFigures) -> _Figures:
    """Counted, model (no recomputation, visible attention) and hardware FLOPs of a report."""
    return _Figures(*report_flops(report, figures))
