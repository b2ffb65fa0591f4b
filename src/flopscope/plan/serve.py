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
  and one micro-batch's activations;
- **continuous batching** beside (:class:`~flopscope.plan.serve_rows.Continuous`): the same
  layout and batch in a steady state of chunked prefill, tokens/s = replicas x batch / the
  serving role's mixed step (:func:`~flopscope.plan.serving.mixed_chunk` tokens per
  sequence); checked against the same memory (a paged cache and chunked prefill need less:
  not planned), and the plan names its best (:attr:`ServePlan.best_continuous`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopscope.errors import UsageError
from flopscope.estimate import Hardware
from flopscope.plan.serve_memory import BATCHING, fits_budget, largest_batch
from flopscope.plan.serve_rows import ServeCandidate, ServeLayout, evaluate, serve_layouts
from flopscope.plan.serve_time import micro_batch
from flopscope.plan.serving import ServeBuild, ServeRoles, mixed_chunk
from flopscope.plan.space import ModelShape
from flopscope.plan.time_words import compute_note, prediction_source, time_model
from flopscope.plan.timing import Links

__all__ = ["LATENCY_TIE", "MAX_BATCH", "ServePlan", "serve_plan", "shortest"]

#: the largest batch a serving plan tries
MAX_BATCH = 4096


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
        batching: ``static`` or ``continuous`` (:data:`~flopscope.plan.serve_memory.BATCHING`):
            what the rows' memory, times and ranking are of.
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
    batching: str = "static"

    @property
    def best(self) -> ServeCandidate | None:
        """The layout with the most tokens/s."""
        return self.best_throughput

    @property
    def best_continuous(self) -> ServeCandidate | None:
        """The layout and batch with the most tokens/s with continuous batching
        (:attr:`ServeCandidate.continuous`; ``None`` without those figures)."""
        rows = [c for c in self.ranked if c.continuous is not None]
        return max(rows, key=lambda c: (c.tokens_per_s_continuous, -c.memory_bytes),
                   default=None)

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
            "mode": "serve", "batching": self.batching, "source": self.source,
            "gpus": self.gpus,
            "hardware": self.hardware.name, "gpus_per_node": self.gpus_per_node,
            "seq_len": self.prompt, "max_new_tokens": self.new_tokens, "dtype": self.dtype,
            "memory_budget": self.memory_budget, "time_model": time_model(self.hardware),
            "prediction": prediction_source(self.hardware, serve=True),
            "ranked": [c.to_dict() for c in self.ranked],
            "dropped": [c.to_dict() for c in self.dropped],
            "best_throughput": self.best_throughput.label if self.best_throughput else None,
            "best_latency": self.best_latency.label if self.best_latency else None,
            "best_continuous": self.best_continuous.label if self.best_continuous else None,
            "continuous_chunk_tokens": mixed_chunk(self.prompt, self.new_tokens),
            "best_latency_without_host": (self.best_latency_without_host.label
                                          if self.best_latency_without_host else None),
            "roles": self.roles, "simulations": self.simulations, "seconds": self.seconds,
            "notes": list(self.notes)}



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
    batching: str = "static",
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
        batching: ``static`` (default) or ``continuous``
            (:data:`~flopscope.plan.serve_memory.BATCHING`): with ``continuous`` each row's
            memory, largest batch, times and rank are continuous batching's
            (:func:`~flopscope.plan.serve_rows.evaluate`).

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
            return evaluate(roles.get(layout.tp, batch),
                            roles.get(layout.tp, micro_batch(batch, layout.pp)), layout,
                            links, budget, gpus, largest, batching)

        one = roles.get(layout.tp, 1)
        first = candidate(1, False)
        if not first.fits:
            dropped.append(first)
            continue
        largest = max(1, min(max_batch, largest_batch(one, roles.get(layout.tp, 2),
                                                       layout.pp, budget, max_batch, batching)))

        def fits(batch: int, layout: ServeLayout = layout) -> bool:
            return fits_budget(roles.get(layout.tp, batch),
                               roles.get(layout.tp, micro_batch(batch, layout.pp)), layout.pp,
                               budget, batching)

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
    notes = (f"compute: {compute_note(hardware, serve=True)}; communication at the links' "
             f"bandwidth; {_batching_note(batching, mixed_chunk(prompt, new_tokens))}",
             "with pipeline stages a replica keeps one micro-batch per stage in flight "
             "(ceil(batch / stages) sequences each): a round in which every sequence gains a "
             "token takes the model's forward at one micro-batch"
             + (", the first token the micro-batch's prefill and the pipeline's fill"
                if batching == "static" else "")
             + "; each stage is charged every sequence's cache and the rank's activations at "
             "its peak at one micro-batch",
             *((f"served without tensor parallelism: {no_tensor_parallel}",)
               if no_tensor_parallel else ()))
    return ServePlan(source, gpus, hardware, gpus_per_node, prompt, new_tokens, dtype, budget,
                     tuple(fitting), tuple(dropped), fitting[0] if fitting else None, latency,
                     roles.used, roles.simulations, time.perf_counter() - start, notes,
                     batching)


def _batching_note(batching: str, chunk: int) -> str:
    """What a plan's rows assume of the server's batching."""
    if batching == "static":
        return ("tokens/s for a batch of requests from prompt to last token (static batching), "
                "latency per token the mean decode step; continuous batching (chunked "
                "prefill) beside: the steady state of each row's batch, every step one token "
                "for each sequence and the prompts of the requests that replace the finished "
                f"ones ({chunk} tokens per sequence per step), its memory checked as static "
                "batching's (every sequence's whole cache, the prefill's activations; "
                "--batching continuous plans its own)")
    return ("continuous batching with chunked prefill, in its steady state: every step one "
            "token for each of the batch's sequences and the prompts of the requests that "
            f"replace the finished ones ({chunk} tokens per sequence per step, one forward); "
            "tokens/s = replicas x batch / a step, latency per token a step, the first token "
            "after the steps a prompt's prefill needs at the step's share of prompt tokens "
            "(first come, first served, the wait for a free place not counted); memory: "
            "every sequence's cache at the generation's middle (a paged cache holds what its "
            "sequences have written) and one step's activations")


def check_serve_options(new_tokens: int | None, batches: Sequence[int] | None,
                        extra: Mapping[str, Any], batching: str = "static") -> None:
    """Refuse the training options a serving plan does not take.

    Args:
        new_tokens: tokens to generate.
        batches: batch sizes.
        extra: training options given (name -> value, ``None`` when not given).
        batching: the server's batching (:data:`~flopscope.plan.serve_memory.BATCHING`).

    Raises:
        UsageError: a training option, bad sizes, or a batching not known.
    """
    if batching not in BATCHING:
        raise UsageError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
    given = [k for k, v in extra.items() if v is not None]
    if given:
        raise UsageError(f"plan(mode='serve') does not take {given[0]}: it is a training "
                         "option (serving plans batch sizes, --batch, and --max-new-tokens)")
    if new_tokens is not None and (not isinstance(new_tokens, int) or new_tokens < 1):
        raise UsageError(f"max_new_tokens must be a whole number >= 1, got {new_tokens!r}")
    for b in batches or ():
        if not isinstance(b, int) or b < 1:
            raise UsageError(f"batch sizes must be whole numbers >= 1, got {b!r}")
