"""A serving layout at one batch size, evaluated: its memory per device (the fullest pipeline
stage, :mod:`flopscope.plan.serve_memory`) and its times (:mod:`flopscope.plan.serve_time`)
with static batching and with continuous batching, from its serving roles
(:mod:`flopscope.plan.serving`); the rows :func:`flopscope.plan.serve.serve_plan` ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flopscope.estimate.bound import Row
from flopscope.plan.serve_memory import StageMemory, stage_memories
from flopscope.plan.serve_time import (
    ServeTime,
    forward_parts,
    micro_batch,
    row_seconds,
    serve_step_time,
)
from flopscope.plan.serving import ServeRun, ServeStep, mixed_chunk, on_stages
from flopscope.plan.space import ModelShape, divisors, expert_degree
from flopscope.plan.timing import Links

__all__ = ["Continuous", "ServeCandidate", "ServeLayout", "evaluate", "serve_layouts"]


@dataclass(frozen=True)
class ServeLayout:
    """A serving layout: ``tp`` x ``pp`` devices per replica, ``replicas`` of them.

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline stages.
        replicas: copies of the model, each serving its own batch.
        ep: a mixture of experts' expert-parallel degree: its experts sharded over the
            tensor-parallel ranks (:func:`~flopscope.plan.space.expert_degree`; 1: none).
    """

    tp: int
    pp: int
    replicas: int
    ep: int = 1

    @property
    def label(self) -> str:
        """``TP2 PP1 DP4`` (DP: the replicas); ``TP2 PP1 DP4 EP2`` with the experts sharded
        (as a training layout's label says it)."""
        experts = f" EP{self.ep}" if self.ep > 1 else ""
        return f"TP{self.tp} PP{self.pp} DP{self.replicas}{experts}"


def serve_layouts(gpus: int, shape: ModelShape, tensor_parallel: bool = True
                  ) -> list[ServeLayout]:
    """Every serving layout of ``gpus`` devices: ``tp`` divides the heads, key/value heads and
    MLP size (and a mixture of experts' experts, sharded over the tensor-parallel ranks:
    :func:`~flopscope.plan.space.expert_degree`); ``pp`` is at most the layers; the rest are
    replicas.

    Args:
        gpus: devices.
        shape: the model's shape.
        tensor_parallel: ``False`` for a model whose layers do not take the standard
            tensor-parallel plan (:func:`~flopscope.distributed.layout.tp_plan_problem`):
            ``tp = 1`` only.

    Returns:
        The layouts, by tp then pp.
    """
    out = []
    for tp in divisors(gpus) if tensor_parallel else [1]:
        ep = expert_degree(shape.experts, tp)
        if shape.heads % tp or shape.kv_heads % tp or shape.intermediate % tp or ep is None:
            continue
        out += [ServeLayout(tp, pp, gpus // (tp * pp), ep) for pp in divisors(gpus // tp)
                if pp <= shape.layers]
    return out


@dataclass(frozen=True)
class Continuous:
    """A serving row with continuous batching and chunked prefill (vLLM's and SGLang's
    scheduling), in its steady state: ``batch`` sequences always running, a finished one's
    place taken at once by a new request whose prompt is prefilled in chunks beside the other
    sequences' decode steps. Each step gives every sequence a token and prefills ``batch x
    prompt / new_tokens`` prompt tokens, one forward of ``chunk`` tokens per sequence
    (:func:`~flopscope.plan.serving.mixed_chunk`; the serving role's mixed step): the prompts'
    compute rides on the weights each decode step reads anyway.

    Attributes:
        chunk: tokens per sequence per step.
        step: the mean step (latency per token): the prediction, or the bound
            (``step.kind``).
        tokens_per_s: ``replicas x batch / step``, every replica.
        step_bound: where :attr:`step` is a prediction, the step at the roofline bound
            (``None`` otherwise).
        tokens_per_s_bound: likewise the tokens/s.
    """

    chunk: int
    step: ServeTime
    tokens_per_s: float
    step_bound: ServeTime | None = None
    tokens_per_s_bound: float | None = None

    def to_dict(self, gpus: int) -> dict[str, Any]:
        """A JSON-ready dict (seconds; tokens/s every replica and per device of ``gpus``)."""
        bound = self.step_bound
        return {"chunk_tokens": self.chunk, "step_s": self.step.to_dict(),
                "latency_per_token_s": self.step.total, "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s / gpus,
                "time_kind": self.step.kind, "host_bound": self.step.host_wait > 0,
                "step_bound_s": bound.to_dict() if bound else None,
                "latency_per_token_bound_s": bound.total if bound else None,
                "tokens_per_s_bound": self.tokens_per_s_bound}


@dataclass(frozen=True)
class ServeCandidate:
    """One serving layout at one batch size, evaluated.

    Attributes:
        layout: the layout.
        batch: sequences per replica.
        largest: whether this is the largest batch that fits the layout.
        memory_bytes: peak bytes per device (the fullest stage).
        weights_bytes: that stage's weights.
        kv_cache_bytes: that stage's KV cache at the end of the generation.
        peak_where: ``module (prefill|decode)``, and the stage.
        prefill: the prefill's time (time to first token): the prediction, or the bound
            (``prefill.kind``).
        decode: the mean decode step's time (latency per token), likewise.
        tokens_per_s: generated tokens per second, every replica.
        tokens_per_s_per_gpu: the same per device.
        fits: within the budget.
        reason: why it was dropped (``None`` when it fits).
        prefill_bound: where the times are predictions, the prefill at the roofline bound
            (``None`` otherwise: :attr:`prefill` is the bound).
        decode_bound: likewise the mean decode step.
        tokens_per_s_bound: likewise the tokens/s (every replica): the most the layout can
            reach.
        tokens_per_s_per_gpu_bound: the same per device.
        continuous: the same layout and batch with continuous batching (:class:`Continuous`;
            ``None``: a role without its mixed step).
        gpus: the plan's devices (the per-device figures' denominator).
    """

    layout: ServeLayout
    batch: int
    largest: bool
    memory_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    peak_where: str
    prefill: ServeTime
    decode: ServeTime
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    fits: bool
    reason: str | None = None
    prefill_bound: ServeTime | None = None
    decode_bound: ServeTime | None = None
    tokens_per_s_bound: float | None = None
    tokens_per_s_per_gpu_bound: float | None = None
    continuous: Continuous | None = None
    gpus: int = 1

    @property
    def label(self) -> str:
        """``TP2 PP1 DP4 batch 32``."""
        return f"{self.layout.label} batch {self.batch}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes, seconds)."""
        return {"layout": self.layout.label, "tp": self.layout.tp, "pp": self.layout.pp,
                "replicas": self.layout.replicas, "ep": self.layout.ep,
                "micro_batch": micro_batch(self.batch, self.layout.pp), "batch": self.batch,
                "largest_batch": self.largest, "memory_bytes": self.memory_bytes,
                "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "peak_where": self.peak_where, "prefill_s": self.prefill.to_dict(),
                "decode_step_s": self.decode.to_dict(),
                "time_to_first_token_s": self.prefill.total,
                "latency_per_token_s": self.decode.total, "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "fits": self.fits,
                "reason": self.reason, "time_kind": self.decode.kind,
                "decode_calls": self.decode.calls, "host_bound": self.host_bound,
                "latency_per_token_without_host_s": self.decode.device_only,
                **_bound_dict(self),
                "continuous_batching": (self.continuous.to_dict(self.gpus)
                                        if self.continuous else None)}

    @property
    def tokens_per_s_continuous(self) -> float:
        """Tokens/s with continuous batching (0 without its figures)."""
        return self.continuous.tokens_per_s if self.continuous else 0.0

    @property
    def host_bound(self) -> bool:
        """Whether the mean decode step waits for the host (a GPU's prediction whose host
        issues the calls slower than the device runs them)."""
        return self.decode.host_wait > 0


def _reason(memory: StageMemory, budget: int, batch: int) -> str:
    from flopscope.render.units import human_bytes

    category, size = max(memory.at.items(), key=lambda kv: kv[1])
    return (f"batch {batch}: peak {human_bytes(memory.total)} is "
            f"{human_bytes(memory.total - budget)} over the {human_bytes(budget)} budget, at "
            f"{memory.where}; largest: {category.replace('_', ' ')} {human_bytes(size)}")


def _timed(step: ServeStep, layout: ServeLayout, links: Links, bound: bool) -> ServeTime:
    """One forward of the decode loop on ``layout``: predicted, or at the roofline bound with
    ``bound`` (or a profile without a calibration)."""
    kind = "prediction" if step.estimate.calibrated and not bound else "bound"
    compute, host = forward_parts(step.estimate, bound=bound)
    return serve_step_time(compute, step.communication, step.boundary_bytes, layout.tp,
                           layout.pp, links, kind, host=host, calls=step.estimate.total.calls)


def _pace(step: ServeStep, pp: int, bound: bool) -> float:
    """How much longer than the whole forward a pipeline's round of ``pp`` micro-batches takes:
    ``pp x`` the slowest stage's time over the stages' sum (each stage runs every micro-batch
    in turn, so the slowest sets the pace; 1 for stages of equal time). A stage's time is its
    calls' (:func:`~flopscope.plan.serve_time.row_seconds`: the prediction, or the bound): its
    parts (:func:`~flopscope.plan.serving.on_stages` of :attr:`ServeStep.parts`: its layers,
    the first stage's the embedding too, the last stage's the norm and the head)."""
    if pp == 1 or not step.parts:
        return 1.0
    times = []
    for parts in on_stages(step.parts, pp):
        row = Row()
        for part in parts:
            row.add(part)
        times.append(row_seconds(row, step.estimate, bound=bound))
    return pp * max(times) / sum(times) if sum(times) else 1.0


def _round(step: ServeStep, layout: ServeLayout, links: Links, bound: bool) -> ServeTime:
    """A round of ``layout``'s micro-batches in flight through ``step`` (a decode or mixed
    step): the forward (:func:`_timed`) at the slowest stage's pace (:func:`_pace`)."""
    return _timed(step, layout, links, bound).scaled(_pace(step, layout.pp, bound))


def _times(timed_run: ServeRun, batch: int, layout: ServeLayout, links: Links, bound: bool
           ) -> tuple[ServeTime, ServeTime, float]:
    """The prefill (time to first token), the mean decode step (a round in which every
    sequence gains a token) and the tokens/s of every replica serving ``batch`` sequences
    with static batching: predicted, or at the roofline bound with ``bound`` (:func:`_timed`).
    ``timed_run`` is the role at the micro-batch
    (:func:`~flopscope.plan.serve_time.micro_batch`): with ``pp`` stages,
    ``pp`` micro-batches are in flight, each stage runs its layers for each of them in turn,
    so a round takes the whole model's forward at one micro-batch, times the slowest stage's
    pace (:func:`_pace`); the last micro-batch's first token comes a slowest stage's prefill
    after the one before it (``m - 1`` of them for ``m`` micro-batches)."""
    in_flight = -(-batch // timed_run.batch)  # micro-batches: at most pp
    pp = layout.pp
    prefill = _timed(timed_run.prefill, layout, links, bound).scaled(
        1 + (in_flight - 1) * _pace(timed_run.prefill, pp, bound) / pp)
    decode = ServeTime.mean(*(_round(step, layout, links, bound)
                              for step in (timed_run.first, timed_run.last)))
    request = prefill.total + (timed_run.new_tokens - 1) * decode.total
    return prefill, decode, (layout.replicas * batch * timed_run.new_tokens / request
                             if request else 0.0)


def _continuous(timed_run: ServeRun, batch: int, layout: ServeLayout, links: Links
                ) -> Continuous | None:
    """Continuous batching's figures (:class:`Continuous`, :func:`_continuous_row`) beside a
    static row (``None`` for a role without its mixed step)."""
    if timed_run.mixed is None:
        return None
    _, step, rate = _continuous_row(timed_run, batch, layout, links, False)
    beside = (_continuous_row(timed_run, batch, layout, links, True)
              if step.kind == "prediction" else None)
    return Continuous(mixed_chunk(timed_run.prompt, timed_run.new_tokens), step, rate,
                      beside[1] if beside else None, beside[2] if beside else None)


def _continuous_row(timed_run: ServeRun, batch: int, layout: ServeLayout, links: Links,
                    bound: bool) -> tuple[ServeTime, ServeTime, float]:
    """A row of a plan with continuous batching as (time to first token, step, tokens/s):
    the step is the mixed step (latency per token; tokens/s ``replicas x batch / step``;
    with stages, a round, every sequence one step further, is the model's forward at one
    micro-batch at the slowest stage's pace, as a static decode round is); a new request's
    prompt takes the steps its prefill needs at the step's share of prompt tokens, ``batch x
    prompt / new_tokens`` a step, so ``max(1, ceil(new_tokens / batch))`` steps (first come,
    first served; the time it waits for a free place not counted)."""
    assert timed_run.mixed is not None  # continuous batching plans roles with one
    step = _round(timed_run.mixed, layout, links, bound)
    ttft = step.scaled(max(1, -(-timed_run.new_tokens // batch)))
    return ttft, step, layout.replicas * batch / step.total if step.total else 0.0


def evaluate(run: ServeRun, timed_run: ServeRun, layout: ServeLayout, links: Links,
             budget: int, gpus: int, largest: bool, batching: str = "static"
             ) -> ServeCandidate:
    """One serving layout at one batch, evaluated.

    Args:
        run: the serving role at the batch: the memory (every sequence's cache).
        timed_run: the role at the micro-batch (:func:`~flopscope.plan.serve_time.micro_batch`;
            ``run`` without stages): the times.
        layout: the layout.
        links: the collectives' links.
        budget: bytes per device.
        gpus: the plan's devices.
        largest: whether the batch is the largest that fits.
        batching: ``static`` (the prefill, the decode steps; continuous batching's figures
            beside, :class:`Continuous`) or ``continuous`` (the row is continuous batching's:
            :attr:`ServeCandidate.prefill` the time to first token, ``decode`` the step, the
            memory at the mixed step).

    Returns:
        The :class:`ServeCandidate`.
    """
    memory = max(stage_memories(run, layout.pp, timed_run, batching), key=lambda m: m.total)
    times = _times if batching == "static" else _continuous_row
    prefill, decode, total = times(timed_run, run.batch, layout, links, False)
    beside: tuple[ServeTime | None, ServeTime | None, float | None] = (None, None, None)
    if decode.kind == "prediction":  # the bound beside: the most the layout can reach
        beside = times(timed_run, run.batch, layout, links, True)
    fits = memory.total <= budget
    return ServeCandidate(layout, run.batch, largest, memory.total, memory.weights, memory.kv,
                          memory.where, prefill, decode, total, total / gpus, fits,
                          None if fits else _reason(memory, budget, run.batch), *beside,
                          None if beside[2] is None else beside[2] / gpus,
                          _continuous(timed_run, run.batch, layout, links)
                          if batching == "static" else None, gpus)


def _bound_dict(c: ServeCandidate) -> dict[str, Any]:
    """A row's bound beside its predicted times (JSON; ``None`` where the times are the
    bound)."""
    pb, db = c.prefill_bound, c.decode_bound
    return {"prefill_bound_s": pb.to_dict() if pb else None,
            "decode_step_bound_s": db.to_dict() if db else None,
            "time_to_first_token_bound_s": pb.total if pb else None,
            "latency_per_token_bound_s": db.total if db else None,
            "tokens_per_s_bound": c.tokens_per_s_bound,
            "tokens_per_s_per_gpu_bound": c.tokens_per_s_per_gpu_bound}

