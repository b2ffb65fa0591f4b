"""``flopscope.plan(..., mode="serve")``: which layout to serve a decoder with on N devices.

Every layout ``tp x pp x replicas = N`` (tensor-parallel degree dividing the heads, key/value
heads and MLP size; at most one stage per decoder layer; the replicas each serve their own
batch) is evaluated at the batch sizes asked for and at the largest batch that fits, from the
serving roles of :mod:`flopscope.plan.serving` (one tensor-parallel rank's decode loop,
simulated once per tensor-parallel degree and batch):

- **memory per device**: the fullest stage at the fuller of the prefill and the last decode step
  (weights, the KV cache of the whole generation, activations); one stage: the simulated peak;
  with stages, each stage's own weights and its layers' cache, plus the rank's activations at
  that peak (those of one layer at a time, and the logits: a bound for the stages that do not
  hold the head);
- **the largest batch that fits**: memory is affine in the batch (every tensor but the weights
  has a batch dimension), so the roles at batches 1 and 2 give the batch at which each stage
  reaches the budget; the role at that batch is simulated and, should it not fit, the largest
  batch that does is bisected between 1 and there;
- **time**: :func:`flopscope.plan.serve_time.serve_step_time` of the prefill and of the first and
  last decode steps (a decode step's time is linear in its context, so their mean is the mean
  decode step); their compute is the **prediction** where the profile has a calibration (a
  shipped GPU's reference one, ``flopscope calibrate``'s), each call predicted as a training
  step's calls are (the step's call records through the profile's predictor; on a GPU the
  longer of the host's sum and the device's, its all-reduces and sends included:
  :func:`flopscope.plan.serve_time.forward_parts`, :func:`~flopscope.plan.serve_time.serve_step_time`),
  with the roofline **bound**'s times and tokens/s beside; else the bound alone. The layouts
  rank by the tokens/s of the prediction. An eager decode step is host-bound on a GPU
  (thousands of small calls): the row says so (``host_bound``), with the step at the device's
  time alone beside (``latency_per_token_without_host_s``: what CUDA graphs or torch.compile
  approach), and the plan names the best layout for latency at that time
  (:attr:`ServePlan.best_latency_without_host`);
- **tokens/s** = replicas x batch x new tokens / (prefill + (new tokens - 1) x mean decode step),
  a batch of requests from its prompt to its last token (static batching); per device, over N;
  **latency per token** = the mean decode step; **time to first token** = the prefill;
- **pipeline stages** keep a micro-batch each in flight
  (:func:`~flopscope.plan.serve_time.micro_batch`): the times are the role's at
  ``ceil(batch / pp)`` sequences (a round, every sequence one token, is the model's forward at
  one micro-batch; the prefill gains the pipeline's fill), the memory every sequence's cache
  and one micro-batch's activations.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopscope.errors import UsageError
from flopscope.estimate import Hardware
from flopscope.plan.serve_memory import StageMemory, fits_budget, largest_batch, stage_memories
from flopscope.plan.serve_time import ServeTime, forward_parts, micro_batch, serve_step_time
from flopscope.plan.serving import ServeBuild, ServeRoles, ServeRun, ServeStep
from flopscope.plan.space import ModelShape, divisors, expert_degree
from flopscope.plan.time_words import compute_note, prediction_source, time_model
from flopscope.plan.timing import Links

__all__ = ["LATENCY_TIE", "MAX_BATCH", "ServeCandidate", "ServeLayout", "ServePlan",
           "serve_layouts", "serve_plan", "shortest"]

#: the largest batch a serving plan tries
MAX_BATCH = 4096


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
                **_bound_dict(self)}

    @property
    def host_bound(self) -> bool:
        """Whether the mean decode step waits for the host (a GPU's prediction whose host
        issues the calls slower than the device runs them)."""
        return self.decode.host_wait > 0


@dataclass(frozen=True)
class ServePlan:
    """A serving plan: every layout at its batches, those that fit ranked by throughput.

    Attributes:
        source: the model.
        gpus: devices.
        hardware: the device profile.
        gpus_per_node: devices per node.
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence.
        dtype: the weights' and activations' dtype.
        memory_budget: bytes per device.
        ranked: the (layout, batch) pairs that fit, most tokens/s first.
        dropped: those that do not, with the reason (a layout that fits no batch, a batch
            asked for that is too large).
        best_throughput: the most tokens/s.
        best_latency: the shortest latency per token (within :data:`LATENCY_TIE` of it, the
            most tokens/s: :func:`shortest`).
        roles: serving roles (tensor-parallel degree x batch) the plan used.
        simulations: roles simulated by this plan.
        seconds: how long planning took.
        notes: what the figures assume.
    """

    source: str
    gpus: int
    hardware: Hardware
    gpus_per_node: int
    prompt: int
    new_tokens: int
    dtype: str
    memory_budget: int
    ranked: tuple[ServeCandidate, ...]
    dropped: tuple[ServeCandidate, ...]
    best_throughput: ServeCandidate | None
    best_latency: ServeCandidate | None
    roles: int
    simulations: int
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> ServeCandidate | None:
        """The layout with the most tokens/s."""
        return self.best_throughput

    @property
    def best_latency_without_host(self) -> ServeCandidate | None:
        """Where the best layout for latency is host-bound, the best at the device's time
        alone (the shortest :attr:`~flopscope.plan.serve_time.ServeTime.device_only` decode step,
        within :data:`LATENCY_TIE` of it the most tokens/s: :func:`shortest`): the choice once CUDA graphs or torch.compile take the host's
        time per call away; ``None`` otherwise."""
        if self.best_latency is None or not self.best_latency.host_bound:
            return None
        return shortest(self.ranked, lambda c: c.decode.device_only)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``mode``: ``serve``)."""
        return {
            "mode": "serve", "source": self.source, "gpus": self.gpus,
            "hardware": self.hardware.name, "gpus_per_node": self.gpus_per_node,
            "seq_len": self.prompt, "max_new_tokens": self.new_tokens, "dtype": self.dtype,
            "memory_budget": self.memory_budget, "time_model": time_model(self.hardware),
            "prediction": prediction_source(self.hardware, serve=True),
            "ranked": [c.to_dict() for c in self.ranked],
            "dropped": [c.to_dict() for c in self.dropped],
            "best_throughput": self.best_throughput.label if self.best_throughput else None,
            "best_latency": self.best_latency.label if self.best_latency else None,
            "best_latency_without_host": (self.best_latency_without_host.label
                                          if self.best_latency_without_host else None),
            "roles": self.roles, "simulations": self.simulations, "seconds": self.seconds,
            "notes": list(self.notes)}


def _reason(memory: StageMemory, budget: int, batch: int) -> str:
    from flopscope.render.units import human_bytes

    category, size = max(memory.at.items(), key=lambda kv: kv[1])
    return (f"batch {batch}: peak {human_bytes(memory.total)} is "
            f"{human_bytes(memory.total - budget)} over the {human_bytes(budget)} budget, at "
            f"{memory.where}; largest: {category.replace('_', ' ')} {human_bytes(size)}")


#: latencies per token within this share of the shortest are a tie (broken by tokens/s): the
#: predictions' error bars are tens of percent, and a host-bound step's host sum moves by a
#: few tenths of a percent with the batch (the calibration's chain factor)
LATENCY_TIE = 0.01


def shortest(candidates: Sequence[ServeCandidate],
             latency: Callable[[ServeCandidate], float]) -> ServeCandidate | None:
    """The best for latency: among the candidates whose ``latency`` is within
    :data:`LATENCY_TIE` of the shortest, the most tokens/s (then the shorter latency).

    Args:
        candidates: the rows that fit.
        latency: a row's latency per token (its decode step, or the device's part of it).

    Returns:
        The row, or ``None`` without rows.
    """
    if not candidates:
        return None
    least = min(latency(c) for c in candidates)
    return max((c for c in candidates if latency(c) <= least * (1 + LATENCY_TIE)),
               key=lambda c: (c.tokens_per_s, -latency(c)))


def _times(timed_run: ServeRun, batch: int, layout: ServeLayout, links: Links, bound: bool
           ) -> tuple[ServeTime, ServeTime, float]:
    """The prefill (time to first token), the mean decode step (a round in which every
    sequence gains a token) and the tokens/s of every replica serving ``batch`` sequences:
    predicted, or at the roofline bound with ``bound`` (or a profile without a calibration).
    ``timed_run`` is the role at the micro-batch
    (:func:`~flopscope.plan.serve_time.micro_batch`): with ``pp`` stages,
    ``pp`` micro-batches are in flight, each stage runs its layers for each of them in turn,
    so a round takes the whole model's forward at one micro-batch; the last micro-batch's
    first token comes a stage-prefill after the one before it (``m - 1`` of them for ``m``
    micro-batches)."""

    def timed(step: ServeStep) -> ServeTime:
        kind = "prediction" if step.estimate.calibrated and not bound else "bound"
        compute, host = forward_parts(step.estimate, bound=bound)
        return serve_step_time(compute, step.communication, step.boundary_bytes, layout.tp,
                               layout.pp, links, kind, host=host,
                               calls=step.estimate.total.calls)

    in_flight = -(-batch // timed_run.batch)  # micro-batches: at most pp
    prefill = timed(timed_run.prefill).scaled(1 + (in_flight - 1) / layout.pp)
    decode = ServeTime.mean(timed(timed_run.first), timed(timed_run.last))
    request = prefill.total + (timed_run.new_tokens - 1) * decode.total
    return prefill, decode, (layout.replicas * batch * timed_run.new_tokens / request
                             if request else 0.0)


def _candidate(run: ServeRun, timed_run: ServeRun, layout: ServeLayout, links: Links,
               budget: int, gpus: int, largest: bool) -> ServeCandidate:
    """``run`` (the role at the batch) gives the memory, ``timed_run`` (at the micro-batch:
    :func:`_times`) the times."""
    memory = max(stage_memories(run, layout.pp, timed_run), key=lambda m: m.total)
    prefill, decode, total = _times(timed_run, run.batch, layout, links, False)
    beside: tuple[ServeTime | None, ServeTime | None, float | None] = (None, None, None)
    if decode.kind == "prediction":  # the bound beside: the most the layout can reach
        beside = _times(timed_run, run.batch, layout, links, True)
    fits = memory.total <= budget
    return ServeCandidate(layout, run.batch, largest, memory.total, memory.weights, memory.kv,
                          memory.where, prefill, decode, total, total / gpus, fits,
                          None if fits else _reason(memory, budget, run.batch), *beside,
                          None if beside[2] is None else beside[2] / gpus)


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


def serve_plan(
    source: str,
    build: ServeBuild,
    shape: ModelShape,
    *,
    identity: Any,
    gpus: int,
    hardware: Hardware,
    links: Links,
    prompt: int,
    new_tokens: int,
    budget: int,
    dtype: str,
    batches: Sequence[int] = (1,),
    max_batch: int = MAX_BATCH,
    gpus_per_node: int = 8,
    tp: int | None = None,
    pp: int | None = None,
    no_tensor_parallel: str | None = None,
) -> ServePlan:
    """Plan serving ``source`` on ``gpus`` devices (see the module's docstring); what
    :func:`flopscope.plan.plan` runs with ``mode="serve"``.

    Args:
        source: the SOURCE string (for the plan's header).
        build: makes the model on ``meta`` (:data:`~flopscope.plan.serving.ServeBuild`).
        shape: the model's shape.
        identity: what ``build`` builds (the roles' cache key).
        gpus: devices.
        hardware: the profile.
        links: its links.
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence.
        budget: bytes per device.
        dtype: the dtype's name (for the header).
        batches: batch sizes to evaluate besides the largest that fits.
        max_batch: the largest batch tried.
        gpus_per_node: devices per node.
        tp: only layouts of this tensor-parallel degree.
        pp: only layouts of this many stages.
        no_tensor_parallel: why the model's layers do not take the standard tensor-parallel
            plan (:func:`~flopscope.distributed.layout.tp_plan_problem`): ``tp = 1`` only, and
            the plan says why; ``None``: every ``tp``.

    Returns:
        The :class:`ServePlan`.

    Raises:
        UsageError: no layout divides the model and the devices.
    """
    start = time.perf_counter()
    if no_tensor_parallel and tp not in (None, 1):
        raise UsageError(f"{source} is served without tensor parallelism: --tp {tp} does not "
                         f"apply ({no_tensor_parallel}); leave it out")
    layouts = [s for s in serve_layouts(gpus, shape, not no_tensor_parallel)
               if tp in (None, s.tp) and pp in (None, s.pp)]
    if not layouts:
        asked = "".join(f", {n} {v}" for n, v in (("tp", tp), ("pp", pp)) if v is not None)
        raise UsageError(f"no serving layout of {gpus} devices divides this model "
                         f"({shape.heads} heads, {shape.kv_heads} key/value heads, "
                         + (f"{shape.experts} experts, " if shape.experts else "")
                         + f"{shape.layers} layers{asked}): change --gpus, --tp or --pp")
    roles = ServeRoles(build, hardware, identity, prompt, new_tokens)
    fitting: list[ServeCandidate] = []
    dropped: list[ServeCandidate] = []
    for layout in layouts:

        def candidate(batch: int, largest: bool, layout: ServeLayout = layout) -> ServeCandidate:
            return _candidate(roles.get(layout.tp, batch),
                              roles.get(layout.tp, micro_batch(batch, layout.pp)), layout,
                              links, budget, gpus, largest)

        one = roles.get(layout.tp, 1)
        first = candidate(1, False)
        if not first.fits:
            dropped.append(first)
            continue
        largest = max(1, min(max_batch, largest_batch(one, roles.get(layout.tp, 2),
                                                       layout.pp, budget, max_batch)))
        def fits(batch: int, layout: ServeLayout = layout) -> bool:
            return fits_budget(roles.get(layout.tp, batch),
                               roles.get(layout.tp, micro_batch(batch, layout.pp)), layout.pp,
                               budget)

        if not fits(largest):
            # memory grew faster than affine: bisect between 1 and there
            low, high = 1, largest
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if fits(mid) else (low, mid)
            largest = low
        best = dataclasses.replace(first, largest=True) if largest == 1 else candidate(
            largest, True)
        for batch in sorted(set(batches)):
            if batch == largest:
                continue
            cand = first if batch == 1 else candidate(batch, False)
            (fitting if cand.fits else dropped).append(cand)
        fitting.append(best)
    fitting.sort(key=lambda c: (-c.tokens_per_s, c.memory_bytes))
    latency = shortest(fitting, lambda c: c.decode.total)
    notes = (f"compute: {compute_note(hardware, serve=True)}; communication at the links' bandwidth; "
             "tokens/s for a batch of requests from prompt to last token (static batching), "
             "latency per token the mean decode step",
             "with pipeline stages a replica keeps one micro-batch per stage in flight "
             "(ceil(batch / stages) sequences each): a round in which every sequence gains a "
             "token takes the model's forward at one micro-batch, the first token the "
             "micro-batch's prefill and the pipeline's fill; each stage is charged every "
             "sequence's cache and the rank's activations at its peak at one micro-batch",
             *((f"served without tensor parallelism: {no_tensor_parallel}",)
               if no_tensor_parallel else ()))
    return ServePlan(source, gpus, hardware, gpus_per_node, prompt, new_tokens, dtype, budget,
                     tuple(fitting), tuple(dropped), fitting[0] if fitting else None, latency,
                     roles.used, roles.simulations, time.perf_counter() - start, notes)


def check_serve_options(new_tokens: int | None, batches: Sequence[int] | None,
                        extra: Mapping[str, Any]) -> None:
    """Refuse the training options a serving plan does not take.

    Args:
        new_tokens: tokens to generate.
        batches: batch sizes.
        extra: training options given (name -> value, ``None`` when not given).

    Raises:
        UsageError: a training option, or bad sizes.
    """
    given = [k for k, v in extra.items() if v is not None]
    if given:
        raise UsageError(f"plan(mode='serve') does not take {given[0]}: it is a training "
                         "option (serving plans batch sizes, --batch, and --max-new-tokens)")
    if new_tokens is not None and (not isinstance(new_tokens, int) or new_tokens < 1):
        raise UsageError(f"max_new_tokens must be a whole number >= 1, got {new_tokens!r}")
    for b in batches or ():
        if not isinstance(b, int) or b < 1:
            raise UsageError(f"batch sizes must be whole numbers >= 1, got {b!r}")
