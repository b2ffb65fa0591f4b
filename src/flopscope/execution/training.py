"""A training step, run once for every feature that sizes one (peak memory; a count of a step).

:func:`training_step` runs a steady-state step of a model on the tensors of a :class:`How`
(the ladder of :mod:`flopscope.execution.how`: real tensors; or meta kernels, then fake CPU
tensors where meta kernels cannot run the model): ``zero_grad(set_to_none=True)``,
``loss_fn(model(*args)).backward()`` (the output is released before ``step()``, as in
``loss_fn(model(x)).backward()``), ``step()``. An untracked warm-up step runs first when there is
an optimizer, so that its state exists, as in every step but the first. The model is left as it
was: training flags, ``.grad``, parameter and buffer values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope.core.counter import Counter
from flopscope.errors import FlopscopeError, UsageError
from flopscope.execution.copies import converted_copy, meta_input, meta_twin, to_fake
from flopscope.execution.how import How, ladder, on_meta
from flopscope.execution.meta import ShapeOnlyFakeMode, sdpa_as_cpu

__all__ = ["OptimizerArg", "Step", "causal_lm_loss", "default_loss", "optimizer_by_name",
           "tensors", "training_step"]

OptimizerArg = str | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None


def optimizer_by_name(spec: OptimizerArg, params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    """The optimizer a step runs.

    Args:
        spec: ``"sgd"`` (momentum 0.9, as usually trained: one state tensor per parameter),
            ``"adam"``, ``"adamw"``, ``None`` (no optimizer), or a function from the parameter
            list to an optimizer.
        params: the parameters to optimize.

    Returns:
        The optimizer, or ``None``.

    Raises:
        UsageError: an unknown name.
    """
    if spec is None:
        return None
    if callable(spec):
        return spec(params)
    name = spec.lower()
    if name == "sgd":
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


def causal_lm_loss(out: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """A causal language model's training loss, as transformers computes it
    (``ForCausalLMLoss``): the logits upcast to float32, the labels the input ids shifted one
    token left (the last position ignored, ``-100``), the mean cross-entropy over the tokens.
    On vocabulary-sharded logits (a DTensor, ``Shard(-1)``) under torch's ``loss_parallel()``
    the same calls run on the shards.

    Args:
        out: the model's output (``.logits``) or the logits, (batch, sequence, vocabulary).
        input_ids: the token ids, (batch, sequence).

    Returns:
        A scalar tensor.
    """
    logits = getattr(out, "logits", out)
    labels = torch.nn.functional.pad(input_ids, (0, 1), value=-100)[..., 1:].contiguous()
    flat = logits.float().view(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, labels.view(-1), ignore_index=-100)


def tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in a pytree."""
    return [t for t in tree_iter(tree) if isinstance(t, torch.Tensor)]


class Step:
    """What a driver of :func:`training_step` sees of the step it runs.

    Attributes:
        how: the tensors it runs on.
        model: the model it runs (the caller's, or a copy on meta or fake tensors).
        args: the model's positional arguments, as run.
        kwargs: its keyword arguments, as run.
        optimizer: the optimizer (``None``: forward and backward only).
        params: the parameters that require grad.
    """

    def __init__(self, how: How, model: nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any], optimizer: torch.optim.Optimizer | None,
                 params: list[nn.Parameter]) -> None:
        self.how = how
        self.model = model
        self.args = args
        self.kwargs = kwargs
        self.optimizer = optimizer
        self.params = params

    def optimizer_state(self) -> list[torch.Tensor]:
        """The optimizer's state tensors now."""
        opt = self.optimizer
        return tensors([list(s.values()) for s in opt.state.values()]) if opt else []


def training_step(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
    optimizer: OptimizerArg, loss_fn: Callable[[Any], torch.Tensor], shape_only: bool,
    counter: Callable[[Step], Counter], after: Callable[[Step], Any],
    on_retry: Callable[[], None],
) -> tuple[Counter, Any, How]:
    """Run one counted steady-state step (see the module docstring), walking the ladder.

    Args:
        model: the model.
        args: its positional arguments.
        kwargs: its keyword arguments.
        optimizer: see :func:`optimizer_by_name`.
        loss_fn: output -> scalar loss.
        shape_only: no arithmetic (a real model is copied to ``meta`` first; its weights are not).
        counter: makes the Counter of the counted step, once the warm-up has run (register
            what the step starts with there).
        after: called after the counted step, before anything is put back; its result is
            returned.
        on_retry: called when an attempt is abandoned for the next rung of the ladder.

    Returns:
        The Counter, what ``after`` returned, and how the step ran.

    Raises:
        UsageError: the model has no parameter that requires grad, or bad arguments.
    """
    run_model = model
    meta = on_meta(model.modules())
    if shape_only and not meta:
        run_model, meta = meta_twin(model), True
    ways = ladder(list(run_model.modules()), shape_only=shape_only, meta=meta)
    for i, how in enumerate(ways):
        last = i + 1 == len(ways)
        try:
            if how is How.FAKE:
                mode = ShapeOnlyFakeMode(allow_non_fake_inputs=True)
                fake = functools.partial(to_fake, mode)
                fake_args, fake_kwargs = tree_map_only(torch.Tensor, fake, (args, kwargs))
                fake_model = converted_copy(run_model, fake)
                return _step(how, fake_model, fake_args, fake_kwargs, optimizer, loss_fn,
                             counter, after, mode)
            if how is How.META:
                meta_args, meta_kwargs = tree_map_only(torch.Tensor, meta_input, (args, kwargs))
                return _step(how, run_model, meta_args, meta_kwargs, optimizer, loss_fn,
                             counter, after, None)
            return _step(how, run_model, args, kwargs, optimizer, loss_fn, counter, after, None)
        except FlopscopeError:
            raise
        except Exception:  # noqa: BLE001 - it cannot run this way: the next rung
            if last:
                raise
            on_retry()
    raise AssertionError("unreachable: the ladder is never empty")


def _step(how: How, run_model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
          optimizer: OptimizerArg, loss_fn: Callable[[Any], torch.Tensor],
          counter: Callable[[Step], Counter], after: Callable[[Step], Any],
          fake_mode: Any) -> tuple[Counter, Any, How]:
    """One counted step of ``run_model`` (a warm-up step first); the model's flags, gradients
    and values are put back."""
    params = [p for p in run_model.parameters() if p.requires_grad]
    if not params:
        raise UsageError("train=True, but the model has no parameter that requires grad")
    modes = [(m, m.training) for m in run_model.modules()]
    grads = [(p, p.grad) for p in run_model.parameters()]
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if how is How.REAL:  # the warm-up and the step change parameters and buffers: copy them back
        with torch.no_grad():
            saved = [(t, t.detach().clone())
                     for t in [*run_model.parameters(), *run_model.buffers()]]
    try:
        run_model.train(True)
        with ExitStack() as stack:
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            elif how is How.META:
                stack.enter_context(sdpa_as_cpu())
            opt = optimizer_by_name(optimizer, params)
            step = Step(how, run_model, args, kwargs, opt, params)

            def run() -> None:
                # the output and loss are released before step(), as in
                # loss_fn(model(x)).backward(): the logits of a language model are large
                loss_fn(run_model(*args, **kwargs)).backward()
                if opt is not None:
                    opt.step()

            if opt is not None:  # warm-up: the optimizer's state exists from the second step
                run()
                opt.zero_grad(set_to_none=True)
            for p in params:
                p.grad = None
            with counter(step) as counting:
                run()
            result = after(step)
    finally:
        for m, mode in modes:
            m.training = mode
        for p, g in grads:
            p.grad = g
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)
    return counting, result, how
