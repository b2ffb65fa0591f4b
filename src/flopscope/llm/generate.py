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
from flopscope.llm.flops import Utilization
from flopscope.llm.kv_cache import (
    cache_keyword,
    cache_layers,
    find_cache,
    starts_with_cache,
    tokens_of,
)
from flopscope.report.report import Report
from flopscope.rules.user import RulesArg

__all__ = ["GenerationReport", "Step", "StepCounter", "StepLogs", "count_generation",
           "weight_bytes"]


@dataclass(frozen=True)
class Step:
    """One forward of a generation loop.

    Attributes:
        index: 0 for the first forward.
        kind: ``"prefill"`` or ``"decode"``.
        tokens: query tokens processed (batch x new positions).
        context: keys attended per sequence at the end of the step (the cache length); 0 when
            the model returned no cache.
        cost: MACs, FLOPs and bytes of every operator of the step (attention as counted).
        kv_read: KV-cache bytes read (every layer's keys and values after the step).
        kv_written: KV-cache bytes the step added.
        attention_counted_flops: attention FLOPs as the report counts them (dense).
        attention_executed_flops: attention FLOPs the kernels computed.
        attention_model_flops: attention FLOPs of the visible query-key pairs.
    """

    index: int
    kind: str
    tokens: int
    context: int
    cost: Cost
    kv_read: int = 0
    kv_written: int = 0
    attention_counted_flops: int = 0
    attention_executed_flops: int = 0
    attention_model_flops: int = 0

    @property
    def model_flops(self) -> int:
        """The step's FLOPs with attention read as model FLOPs."""
        return self.cost.flops - self.attention_counted_flops + self.attention_model_flops

    @property
    def executed_flops(self) -> int:
        """The step's FLOPs with attention read as executed FLOPs."""
        return self.cost.flops - self.attention_counted_flops + self.attention_executed_flops

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``tokens``, ``macs``, ``flops``, ``bytes_read``, ``bytes_written``, ..."""
        return {"index": self.index, "kind": self.kind, "tokens": self.tokens,
                "context": self.context, **self.cost.to_dict(), "kv_read": self.kv_read,
                "kv_written": self.kv_written, "model_flops": self.model_flops,
                "executed_flops": self.executed_flops,
                "attention": {"counted_flops": self.attention_counted_flops,
                              "executed_flops": self.attention_executed_flops,
                              "model_flops": self.attention_model_flops}}


@dataclass(frozen=True)
class GenerationReport:
    """Per-step costs of a generation loop.

    Attributes:
        steps: one :class:`Step` per forward, in order.
        between: work outside the model's forwards (sampling, logits processing).
        report: the whole run's :class:`~flopscope.Report`.
        notes: approximations met (attention masks without values, ...).
        attention_exact: whether every attention call's visible pairs were known (masks that
            could be read); ``False``: the model figures are the dense ones.
    """

    steps: tuple[Step, ...]
    between: Cost
    report: Report
    notes: tuple[str, ...] = ()
    attention_exact: bool = True

    @property
    def prefill(self) -> tuple[Step, ...]:
        """The prefill step(s)."""
        return tuple(s for s in self.steps if s.kind == "prefill")

    @property
    def decode(self) -> tuple[Step, ...]:
        """The decode steps."""
        return tuple(s for s in self.steps if s.kind == "decode")

    def summary(self) -> dict[str, Any]:
        """Prefill and decode totals, per-token averages and growth over the context.

        Returns:
            ``prefill`` / ``decode``: tokens, MACs, FLOPs, model FLOPs, bytes, KV bytes and per
            token averages; ``growth``: per extra key of context, the change of a decode step's
            FLOPs and KV bytes read (first to last decode step).
        """
        out: dict[str, Any] = {}
        for name, steps in (("prefill", self.prefill), ("decode", self.decode)):
            tokens = sum(s.tokens for s in steps)
            total = sum((s.cost for s in steps), Cost())
            part: dict[str, Any] = {"steps": len(steps), "tokens": tokens, **total.to_dict(),
                    "model_flops": sum(s.model_flops for s in steps),
                    "kv_read": sum(s.kv_read for s in steps),
                    "kv_written": sum(s.kv_written for s in steps)}
            if tokens:
                part["per_token"] = {k: part[k] / tokens for k in
                                     ("macs", "flops", "model_flops", "bytes_read",
                                      "bytes_written", "kv_read")}
            out[name] = part
        dec = self.decode
        if len(dec) >= 2 and dec[-1].context != dec[0].context:
            span = dec[-1].context - dec[0].context
            out["growth"] = {
                "per_context_token_flops": (dec[-1].cost.flops - dec[0].cost.flops) / span,
                "per_context_token_kv_read": (dec[-1].kv_read - dec[0].kv_read) / span,
                "first_decode_flops": dec[0].cost.flops, "last_decode_flops": dec[-1].cost.flops,
            }
        out["between"] = self.between.to_dict()
        return out

    def utilization(self, peak: tuple[float, str, float | None], *,
                    prefill_seconds: float | None = None,
                    decode_seconds: float | None = None,
                    weights: int = 0) -> list[Utilization]:
        """MFU (and MBU) of a measured generation: the prefill from its time (time to first
        token), the decode steps from their mean time each (time per output token).

        Decode: seconds = steps x ``decode_seconds``; model FLOPs = the decode steps' sum
        (attention as visible pairs), hardware FLOPs = as executed; tokens = the steps' tokens;
        bytes for MBU = steps x ``weights`` + the KV cache read and written (every step reads
        all its weights and the whole cache, and writes its new entries).

        Args:
            peak: ``(peak FLOP/s, name, memory bandwidth or None)`` (see
                :func:`flopscope.llm.flops.resolve_peak`).
            prefill_seconds: measured prefill time, or ``None``.
            decode_seconds: measured mean time of one decode step, or ``None``.
            weights: bytes of the weights a decode step reads (:func:`weight_bytes`); 0: no MBU.

        Returns:
            One :class:`Utilization` per time given: the prefill's, then the decode's.
        """
        out = []
        peak_flops, name, bandwidth = peak
        if prefill_seconds is not None and self.prefill:
            steps = self.prefill
            out.append(Utilization(
                "prefill", prefill_seconds, sum(s.model_flops for s in steps),
                sum(s.executed_flops for s in steps), peak_flops, name,
                sum(s.tokens for s in steps)))
        if decode_seconds is not None and self.decode:
            steps = self.decode
            moved = len(steps) * weights + sum(s.kv_read + s.kv_written for s in steps)
            out.append(Utilization(
                f"decode ({len(steps)} x {decode_seconds:g} s)", len(steps) * decode_seconds,
                sum(s.model_flops for s in steps), sum(s.executed_flops for s in steps),
                peak_flops, name, sum(s.tokens for s in steps),
                moved if weights else None, bandwidth))
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{"steps": [...], "summary": {...}, "notes": [...], "report": {...}}``."""
        return {"steps": [s.to_dict() for s in self.steps], "summary": self.summary(),
                "notes": list(self.notes), "report": self.report.to_dict()}

    def table(self, *, max_rows: int = 12,
              columns: Sequence[tuple[str, Sequence[str]]] = ()) -> str:
        """A plain-text table of the steps (the first and last ones when there are many).

        Args:
            max_rows: steps shown at most.
            columns: extra columns: (header, one cell per step).

        Returns:
            The table and a summary, as text.
        """
        from flopscope.render.units import human

        head = ("step", "kind", "tokens", "context", "MACs", "FLOPs", "model FLOPs", "bytes",
                "KV read", "KV written", *(h for h, _ in columns))
        rows: list[tuple[str, ...]] = [head]
        steps = list(self.steps)
        shown: list[Step | None] = list(steps)
        if len(steps) > max_rows:
            half = max_rows // 2
            shown = [*steps[:half], None, *steps[-half:]]
        for s in shown:
            if s is None:
                rows.append(("...",) + ("",) * (len(head) - 1))
                continue
            rows.append((str(s.index), s.kind, str(s.tokens), str(s.context), human(s.cost.macs),
                         human(s.cost.flops), human(s.model_flops), human(s.cost.bytes, "B"),
                         human(s.kv_read, "B"), human(s.kv_written, "B"),
                         *(cells[s.index] for _, cells in columns)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        summ = self.summary()
        for name in ("prefill", "decode"):
            part = summ[name]
            if part.get("per_token"):
                pt = part["per_token"]
                lines.append(f"{name}: {part['steps']} step(s), {part['tokens']} tokens, "
                             f"{human(part['flops'])}FLOPs; per token {human(int(pt['flops']))}"
                             f"FLOPs ({human(int(pt['model_flops']))}FLOPs model), "
                             f"{human(int(pt['bytes_read']), 'B')} read, "
                             f"KV read {human(int(pt['kv_read']), 'B')}")
        if "growth" in summ:
            g = summ["growth"]
            lines.append(f"decode growth per key of context: {g['per_context_token_flops']:.0f} "
                         f"FLOPs, {g['per_context_token_kv_read']:.0f} KV bytes read")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


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
