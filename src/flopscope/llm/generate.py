"""Generation, step by step: what each forward of a decode loop costs.

A *step* is one call of the model's top module (``model(...)``), delimited by a forward pre-hook
and a forward hook on it; the step's cost is the sum of the costed calls the Counter saw between
the two (through its observer hook), nothing estimated by hand. Work between steps (logits
processing, sampling, stopping criteria of ``generate()``) is kept apart as ``between``.

The first step, or any step that starts without a cache, is the *prefill*; the others are
*decode* steps. With ``transformers``' ``generate(max_new_tokens=N)`` there are N forwards: the
prefill, which yields the first new token, and N - 1 decode steps; decode step j (j = 1..N-1)
feeds one token per sequence and attends to P + j keys.

KV-cache bytes are read from the cache the step returns (a transformers ``Cache``, or tuples of
(key, value) tensors; found by what it is, whatever the keyword: ``past_key_values`` or
``cache``): *read* = every layer's keys and values after the step (what attention reads, the
new entries included), *written* = the entries the step added
(its tokens' keys and values, per layer). For a DynamicCache: read = 2 x layers x kv_heads x
head_dim x (P + j) x dtype size x batch, written = the same with the step's token count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopscope.core.counter import Counter
from flopscope.core.observers import CallObserver
from flopscope.cost import Cost, OpCall, Phase, tensor_bytes
from flopscope.errors import UsageError
from flopscope.execution.how import on_meta
from flopscope.llm.attention import AttentionFigures
from flopscope.llm.kv_cache import (
    cache_keyword,
    cache_layers,
    find_cache,
    starts_with_cache,
    tokens_of,
)
from flopscope.llm.steps import GenerationReport, Step
from flopscope.rules.user import RulesArg

__all__ = ["StepCounter", "StepLogs", "count_generation",
           "weight_bytes"]


class StepCounter:
    """Count a generation loop step by step: ``model.generate(...)`` or your own decode loop.

    Example::

        with StepCounter(model) as steps:
            model.generate(ids, max_new_tokens=16)
        print(steps.result.table())

    Args:
        model: the model whose top-level calls are the steps.
        rules: extra rules, as for :class:`flopscope.Counter`.
        warn: warn on exit about uncounted operators.
        observers: more observers of every call (:class:`StepLogs` keeps a roofline log per
            step).

    Raises:
        UsageError: ``model`` is not an ``nn.Module``.
    """

    def __init__(self, model: nn.Module, *, rules: RulesArg = None, warn: bool = True,
                 observers: Sequence[CallObserver] = ()) -> None:
        if not isinstance(model, nn.Module):
            raise UsageError(f"StepCounter takes an nn.Module, not {type(model).__name__}")
        self.model = model
        self.attention = AttentionFigures(on_call_hook=self._on_attention)
        self.counter = Counter(model, rules=rules, warn=warn,
                               observers=[self, self.attention, *observers])
        self._depth = 0
        self._steps: list[Step] = []
        self._cur = Cost()
        self._attn = [0, 0, 0]
        self._between = Cost()
        self._shape = (1, 0)
        self._had_cache = False
        self._handles: list[Any] = []
        self._result: GenerationReport | None = None

    # -- observer ------------------------------------------------------------------------------
    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call: added to the running step, or to ``between``."""
        if self._depth:
            self._cur += cost
        else:
            self._between += cost

    def reset(self) -> None:
        """Start again (an abandoned attempt)."""
        self._steps.clear()
        self._cur, self._between, self._attn = Cost(), Cost(), [0, 0, 0]

    def _on_attention(self, phase: Phase, counted: Cost, executed: Cost, model: Cost) -> None:
        if self._depth:
            self._attn[0] += counted.flops
            self._attn[1] += executed.flops
            self._attn[2] += model.flops

    # -- hooks ---------------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._depth == 0:
            self._cur, self._attn = Cost(), [0, 0, 0]
            self._shape = tokens_of(args, kwargs)
            self._had_cache = starts_with_cache(args, kwargs)
        self._depth += 1

    def _post(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> None:
        self._depth -= 1
        if self._depth:
            return
        batch, new = self._shape
        layers = cache_layers(find_cache(output, kwargs, args))
        read = written = context = 0
        for k, v in layers:
            length = int(k.shape[-2])
            layer_bytes = int(tensor_bytes(k) + tensor_bytes(v))
            read += layer_bytes
            if length:
                written += layer_bytes * min(new, length) // length
            context = max(context, length)
        kind = "decode" if self._had_cache else "prefill"
        self._steps.append(Step(len(self._steps), kind, batch * new, context, self._cur, read,
                                written, *self._attn))

    def __enter__(self) -> StepCounter:
        self._handles = [
            self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.model.register_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]
        try:
            self.counter.__enter__()
        except BaseException:
            self._remove()
            raise
        return self

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.counter.__exit__(exc_type, exc, tb)
        finally:
            self._remove()
            self._depth = 0
        if exc_type is None:
            totals = self.attention.total()
            self._result = GenerationReport(tuple(self._steps), self._between,
                                            self.counter.report, tuple(sorted(totals.notes)),
                                            totals.exact)

    @property
    def result(self) -> GenerationReport:
        """The :class:`GenerationReport` (after the ``with`` block).

        Raises:
            UsageError: the block has not finished.
        """
        if self._result is None:
            raise UsageError("StepCounter.result is ready when its `with` block has finished")
        return self._result


@dataclass
class _Loop:
    model: nn.Module
    batch: int
    prompt_len: int
    new_tokens: int
    device: torch.device
    kwargs: dict[str, Any] = field(default_factory=dict)

    def steps(self) -> Iterator[None]:
        """Prefill then new_tokens - 1 decode steps with a growing DynamicCache; token ids are
        zeros (their values do not change shapes)."""
        from transformers import DynamicCache

        config = getattr(self.model, "config", None)
        cache = DynamicCache(config=config)
        keyword = cache_keyword(self.model)
        ids = torch.zeros(self.batch, self.prompt_len, dtype=torch.long, device=self.device)
        with torch.no_grad():
            for step in range(self.new_tokens):
                if step:
                    ids = torch.zeros(self.batch, 1, dtype=torch.long, device=self.device)
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                                 **{keyword: cache}, **self.kwargs)
                cache = find_cache(out) or cache
                yield None


class StepLogs:
    """An observer that keeps a roofline :class:`~flopscope.estimate.CallLog` per step (per call
    of the model's top module): what :meth:`estimates` turns into each step's lower bound on
    time on a hardware profile.

    Example::

        logs = StepLogs()
        result = count_generation(model, prompt_len=512, new_tokens=8, observers=[logs])
        per_step = logs.estimates(get_hardware("h100-sxm"))
    """

    def __init__(self) -> None:
        from flopscope.estimate.roofline import CallLog

        self._new = CallLog
        self.logs: list[Any] = []
        self._depth = 0

    def on_module_enter(self, path: str, phase: Phase) -> None:
        """The model's top module starts: a new step (a nested call of it is the same step)."""
        if path == "":
            if not self._depth:
                self.logs.append(self._new())
            self._depth += 1

    def on_module_exit(self, path: str, phase: Phase) -> None:
        """The model's top module returns."""
        if path == "" and self._depth:
            self._depth -= 1

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """A call inside a step goes to its log."""
        if self._depth:
            self.logs[-1].on_call(path, phase, op, call, cost)

    def reset(self) -> None:
        """Forget an abandoned attempt."""
        self.logs.clear()
        self._depth = 0

    def estimates(self, hardware: Any, *, tf32: bool | None = None) -> list[Any]:
        """Each step's :class:`~flopscope.estimate.Estimate` (a lower bound on its time).

        Args:
            hardware: a :class:`~flopscope.estimate.Hardware` profile.
            tf32: float32 products as TF32 (``None``: as torch is set).

        Returns:
            One estimate per step, in order.
        """
        return [log.estimate(hardware, tf32=tf32) for log in self.logs]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters, a tied (shared) weight once: what a decode step reads.

    Args:
        model: the model.

    Returns:
        The bytes.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters())


def count_generation(
    model: nn.Module,
    *,
    prompt_len: int,
    new_tokens: int,
    batch: int = 1,
    shape_only: bool | None = None,
    rules: RulesArg = None,
    warn: bool = False,
    observers: Sequence[CallObserver] = (),
) -> GenerationReport:
    """Count a transformers causal LM generating ``new_tokens`` after a ``prompt_len`` prompt.

    A model on the ``meta`` device (or ``shape_only=True``, which needs one) runs a prefill and
    ``new_tokens - 1`` decode steps on meta tensors with a growing ``DynamicCache``, with the
    CPU's attention kernels replayed (no arithmetic: a 70B model at 32k context in seconds). A
    real model runs ``model.generate(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
    do_sample=False)`` on random prompt ids. Both compute logits of the last position only
    (``logits_to_keep=1``), as ``generate()`` does.

    Args:
        model: a transformers ``*ForCausalLM`` (or any model whose forward takes ``input_ids``,
            a cache (``cache`` or ``past_key_values``), ``use_cache`` and ``logits_to_keep``).
        prompt_len: prompt tokens per sequence (P).
        new_tokens: tokens to generate (N): 1 prefill + N - 1 decode steps.
        batch: sequences (B).
        shape_only: ``None``: shape-only exactly when the model is on ``meta``.
        rules: extra rules, as for :func:`flopscope.count`.
        warn: warn about uncounted operators.
        observers: more observers of every call (:class:`StepLogs` for each step's roofline).

    Returns:
        The :class:`GenerationReport`.

    Raises:
        UsageError: bad lengths, ``shape_only=True`` for a model that is not on ``meta``, or a
            model that cannot decode (transformers says it cannot generate, or no step returned
            a key/value cache).
    """
    if prompt_len < 1 or new_tokens < 1 or batch < 1:
        raise UsageError(f"prompt_len, new_tokens and batch must be at least 1 "
                         f"(got {prompt_len}, {new_tokens}, {batch})")
    can_generate = getattr(model, "can_generate", None)
    if not callable(can_generate) and not callable(getattr(model, "generate", None)):
        raise UsageError(
            f"{type(model).__name__} is not a generation model (it has no generate()): "
            "count_generation runs transformers' generate(); for a decode loop of your own, "
            "count it with flopscope.llm.StepCounter")
    if callable(can_generate) and not can_generate():
        raise UsageError(
            f"{type(model).__name__} cannot generate: it is not a causal language model "
            "(transformers' can_generate() is False), so it has no decode step to count; give "
            "a decoder with a key/value cache (an hf: causal LM such as hf:llama or hf:gpt2)")
    result = _count_generation(model, prompt_len, new_tokens, batch, shape_only, rules, warn,
                               observers)
    prefill = result.steps[0] if result.steps else None
    if (prefill is not None and prompt_len > 1 and result.attention_exact
            and prefill.attention_counted_flops
            and prefill.attention_model_flops >= prefill.attention_counted_flops):
        raise UsageError(
            f"{type(model).__name__} attends to every token of the prompt from every token "
            "(its attention is not causal: an encoder such as BERT, or a decoder not configured "
            "as one), so a new token changes every earlier key and a decode step with a "
            "key/value cache does not describe it; count it with `flopscope count` instead")
    if new_tokens >= 2 and not result.decode:
        raise UsageError(
            f"{type(model).__name__} returned no key/value cache, so every forward of the loop "
            "started from nothing and none was a decode step: generation needs a decoder that "
            "takes and returns a cache (past_key_values / cache)")
    return result


def _count_generation(model: nn.Module, prompt_len: int, new_tokens: int, batch: int,
                      shape_only: bool | None, rules: RulesArg, warn: bool,
                      observers: Sequence[CallObserver]) -> GenerationReport:
    meta = on_meta(model.modules())
    if shape_only is None:
        shape_only = meta
    if shape_only and not meta:
        raise UsageError("shape-only generation runs on a model built on the meta device: build "
                         "it under `with torch.device('meta'):` (flopscope.sources.load_model("
                         "..., shape_only=True) does)")
    was_training = model.training
    model.eval()
    try:
        if shape_only:
            from flopscope.execution.meta import sdpa_as_cpu

            with sdpa_as_cpu(), StepCounter(model, rules=rules, warn=warn,
                                            observers=observers) as counter:
                for _ in _Loop(model, batch, prompt_len, new_tokens, torch.device("meta")).steps():
                    pass
            return counter.result
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 2) or 2)
        device = next(model.parameters()).device
        ids = torch.randint(0, vocab, (batch, prompt_len), device=device)
        with StepCounter(model, rules=rules, warn=warn,
                         observers=observers) as counter, torch.no_grad():
            model.generate(  # type: ignore[operator]
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return counter.result
    finally:
        model.train(was_training)
