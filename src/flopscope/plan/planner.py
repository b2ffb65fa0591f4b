"""``flopscope.plan``: which layout to train a decoder with on N devices, from the operators its
ranks run (simulated on torch's fake process group, shape-only).

For every layout of :func:`~flopscope.plan.space.enumerate_layouts`: the per-rank peak memory of
a training step (the memory tracker over the simulated rank, plus AdamW's two moments per
parameter shard, plus earlier microbatches' gradients when they accumulate), the step time
(:func:`~flopscope.plan.timing.step_time`), tokens per second per device and MFU (the unsharded
model's forward and backward FLOPs per step over the step time and the devices' dense peak for
the dtype). Layouts that do not fit the memory budget are dropped with the reason; the rest are
ranked by step time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopscope.distributed.layout import tp_plan_problem
from flopscope.errors import UsageError
from flopscope.estimate import Hardware, get_hardware
from flopscope.estimate.profile import compiled_hardware, dtype_key
from flopscope.execution.inputs import token_ids
from flopscope.plan.build import build_model, model_identity
from flopscope.plan.candidate import DP_COMM, Candidate, evaluate, pareto, why_it_wins
from flopscope.plan.checkpointing import CHECKPOINTING, SELECTIVE_NOTE
from flopscope.plan.confirm import Screening, confirm_best
from flopscope.plan.degrees import sharing_degrees
from flopscope.plan.experts import ExpertRoles, decoder_layouts
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.model_flops import model_flops
from flopscope.plan.options import decoder_note
from flopscope.plan.precision import mixed_precision, precision_words
from flopscope.plan.reuse import KeptRoles
from flopscope.plan.roles import RoleRun, Roles
from flopscope.plan.screen import Screen
from flopscope.plan.serve import ServePlan
from flopscope.plan.space import (
    DATA_PARALLEL,
    Choice,
    ModelShape,
    data_parallel_kinds,
    sequence_parallel_mode,
)
from flopscope.plan.time_words import compute_note, prediction_source, time_model
from flopscope.plan.timing import PART_NAMES, Links
from flopscope.plan.vision import (
    VisionRoles,
    check_vision_options,
    data_parallel_layouts,
    decoder_problem,
)
from flopscope.sources import DEFAULT_SEQ_LEN

__all__ = ["Plan", "plan"]


@dataclass(frozen=True)
class Plan:
    """A training plan: every layout evaluated, those that fit ranked by step time.

    Attributes:
        source: the model.
        gpus: devices.
        hardware: the device profile.
        gpus_per_node: devices per node.
        global_batch: sequences per step.
        seq_len: tokens per sequence.
        dtype: the parameters' and activations' dtype.
        memory_budget: bytes per device a layout may use.
        ranked: the layouts that fit, fastest first.
        dropped: those that do not, with the reason.
        pareto: the fitting layouts no other beats on both step time and memory, fastest first.
        model_flops: the unsharded model's forward + backward FLOPs per step (MFU's numerator).
        roles: distinct rank roles the layouts have (ranks doing the same work are one).
        simulations: roles simulated by this plan (the others were cached by an earlier one).
        seconds: how long planning took.
        notes: what the figures assume.
        unit: what a step processes: ``"tokens"`` (a decoder: sequences x sequence length)
            or ``"samples"`` (a vision model; ``seq_len`` is 1).
        param_dtype: the parameters' shards, their gradients and AdamW's moments (``None``:
            ``dtype``; mixed precision when it differs).
        reduce_dtype: the dtype gradients are reduced in (``None``: ``param_dtype``).
        sequence_parallel: tensor-parallel layouts without stages shard the norms' activations
            along the sequence (``True``), or each such layout was planned with and without
            (``"search"``; the layout's own: :attr:`Choice.sequence_parallel`).
        loss_parallel: tensor-parallel layouts shard the head's logits over the vocabulary
            (with stages, on the last), the cross-entropy computed on the shards.
        screening: a screened plan's screen (``None``: every layout simulated).
    """

    source: str
    gpus: int
    hardware: Hardware
    gpus_per_node: int
    global_batch: int
    seq_len: int
    dtype: str
    memory_budget: int
    ranked: tuple[Candidate, ...]
    dropped: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]
    model_flops: int
    roles: int
    simulations: int
    seconds: float
    notes: tuple[str, ...] = field(default=())
    unit: str = "tokens"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    sequence_parallel: bool | str = False
    loss_parallel: bool = False
    screening: Screening | None = None

    @property
    def precision(self) -> str:
        """The dtypes in words (:func:`flopscope.plan.precision.precision_words`)."""
        return precision_words(self.dtype, self.param_dtype, self.reduce_dtype)

    @property
    def best(self) -> Candidate | None:
        """The fastest layout that fits."""
        return self.ranked[0] if self.ranked else None

    def page_data(self) -> dict[str, Any]:
        """What the plan's HTML page draws: :meth:`to_dict` and ``"explain"``, the words the
        table uses: the parts of a step's time by name (``part_names``; the data-parallel
        part named for the kinds the layouts have, :data:`~flopscope.plan.candidate.DP_COMM`)
        and why the best layout wins (``why``, the lines of the text's "Why it wins",
        :func:`~flopscope.plan.candidate.why_it_wins`)."""
        why = [line.strip() for line in why_it_wins(self.ranked, self.unit)[2:]] if self.ranked else []
        held = {c.choice.data_parallel for c in (*self.ranked, *self.dropped)}
        kinds = [k for k in DATA_PARALLEL if k in held] or ["fsdp"]
        names = dict(PART_NAMES)
        names["fsdp_comm"] = names["fsdp_comm"].replace(
            DP_COMM["fsdp"], " or ".join(dict.fromkeys(DP_COMM[k] for k in kinds)))
        return {**self.to_dict(), "explain": {"part_names": names, "why": why}}

    def to_html(self) -> str:
        """The plan as one self-contained HTML page: the ranked layouts, the Pareto front of
        step time against peak memory per device, where the best layout's time goes, the
        dropped layouts and why (:meth:`page_data`, drawn by
        :func:`flopscope.render.html.render_plan_html`)."""
        from flopscope.render.html import render_plan_html

        return render_plan_html(self.page_data())

    def _repr_html_(self) -> str:  # Jupyter: the page in a frame of its own
        from flopscope.render.html import notebook_frame

        return notebook_frame(self.to_html())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mode": "train", "source": self.source, "gpus": self.gpus,
            "hardware": self.hardware.name,
            "gpus_per_node": self.gpus_per_node, "global_batch": self.global_batch,
            "seq_len": self.seq_len, "dtype": self.dtype,
            "param_dtype": self.param_dtype or self.dtype,
            "reduce_dtype": self.reduce_dtype or self.param_dtype or self.dtype,
            "precision": self.precision, "sequence_parallel": self.sequence_parallel,
            "loss_parallel": self.loss_parallel,
            "loss": "cross_entropy" if self.unit == "tokens" else "sum",
            "memory_budget": self.memory_budget,
            "model_flops_per_step": self.model_flops, "time_model": time_model(self.hardware),
            "prediction": prediction_source(self.hardware),
            "ranked": [c.to_dict() for c in self.ranked],
            "pareto": [c.choice.label for c in self.pareto],
            "dropped": [c.to_dict() for c in self.dropped],
            "roles": self.roles, "simulations": self.simulations, "seconds": self.seconds,
            "notes": list(self.notes), "unit": self.unit,
            "screening": self.screening.to_dict() if self.screening is not None else None,
        }


UNDERSTATED_NOTE = (
    "pipeline layouts with a stage whose peak is taken at fewer microbatches than the step's "
    "({} here: pipelines of more than 18 stages, at as many microbatches as stages): below the "
    "step's (each microbatch beyond leaves its input, and on the last stage its output, live "
    "to the step's end; docs/plan.md, 'More microbatches than stages')")


def plan(
    source: str,
    *,
    gpus: int,
    hardware: str | Hardware = "h100-sxm",
    gpus_per_node: int = 8,
    global_batch: int | None = None,
    seq_len: int | None = None,
    memory_budget: int | None = None,
    dtype: str = "bfloat16",
    config: Mapping[str, Any] | None = None,
    checkpointing: Sequence[str] = CHECKPOINTING,
    mode: str = "train",
    max_new_tokens: int | None = None,
    batches: Sequence[int] | None = None,
    batching: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    param_dtype: str | None = None,
    reduce_dtype: str | None = None,
    sequence_parallel: bool | str = False,
    loss_parallel: bool = True,
    screen: bool = False,
    confirm: int = 3,
    compiled: bool = False,
    data_parallel: str | None = None,
) -> Plan | ServePlan:
    """Plan a training step of ``source`` on ``gpus`` devices: every layout, its memory and
    time, those that fit ranked (see :mod:`flopscope.plan`); with ``mode="serve"``, serving it
    (:mod:`flopscope.plan.serve`).

    Args:
        source: a transformers decoder (``hf:llama``, ``hf:meta-llama/Llama-3.1-8B``; as
            ``flopscope count`` takes it).
        gpus: devices.
        hardware: the device profile (with link figures: ``h100-sxm``, ``h200``, ...).
        gpus_per_node: devices per node (collectives inside a node use NVLink).
        global_batch: sequences per step (default: one per device).
        seq_len: tokens per sequence (default: the source's).
        memory_budget: bytes per device (default: the profile's memory).
        dtype: the compute dtype: activations, and the parameters unless ``param_dtype``
            differs.
        config: overrides of the model's config (``{"num_hidden_layers": 8}``).
        checkpointing: the activation checkpointing choices to try.
        mode: ``"train"`` or ``"serve"``.
        max_new_tokens: serving: tokens generated per sequence (default 128).
        batches: serving: batch sizes per replica to evaluate besides the largest that fits
            (default 1).
        batching: serving: ``"static"`` (default: a batch from its prompts to its last
            tokens, continuous batching's tokens/s beside) or ``"continuous"`` (continuous
            batching with chunked prefill: each row's memory, largest batch, times and rank
            are its steady state's; :mod:`flopscope.plan.serve`).
        tp: only layouts of this tensor-parallel degree (``None``: every one that divides).
        pp: only layouts of this many pipeline stages.
        ep: only layouts of this expert-parallel degree (a mixture of experts; 1: none).
        param_dtype: training: the parameters' dtype, their gradients' and AdamW's moments'
            (``"float32"``; default ``dtype``). Where it differs from ``dtype`` the plan is of
            mixed precision: the model built in ``param_dtype`` and FSDP2's
            ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)`` on every
            ``fully_shard`` (:attr:`flopscope.distributed.Layout.mixed_precision`), as
            torchtitan trains.
        reduce_dtype: training: the dtype gradients are reduced in (default ``param_dtype``).
        sequence_parallel: training: tensor-parallel layouts without pipeline stages run
            sequence parallelism (the norms on sequence shards, all-gathers and
            reduce-scatters instead of all-reduces; torchtitan's and Megatron-LM's tensor
            parallelism; :attr:`flopscope.distributed.Layout.sequence_parallel`);
            ``"search"``: each such layout with and without it, the plan choosing
            (:attr:`Choice.sequence_parallel`, ``SP`` in its label).
        loss_parallel: training: tensor-parallel layouts shard the head over the vocabulary
            (with pipeline stages, the last stage's) and compute the loss (a decoder's
            cross-entropy, logits in float32) on the shards (:attr:`flopscope.distributed.Layout.loss_parallel`), as
            torchtitan and Megatron-LM do; ``False``: the head whole on every rank.
        screen: training a decoder: estimate every layout from a few small reference runs
            (:mod:`flopscope.plan.screen`), then simulate those that could win
            (:func:`flopscope.plan.confirm.confirm_best`); the other rows are estimates
            (:attr:`Candidate.screened`), the screen's error on the simulated ones in the notes.
        confirm: with ``screen``: simulated layouts that fit to reach before stopping.
        compiled: predict compiled steps (CUDA graphs, torch.compile, a serving engine's
            graphs): no host time per call, DTensor's dispatch included; the kernels as
            eager's (:func:`flopscope.estimate.profile.compiled_hardware`). Without a
            calibration the plan is at the bound either way.
        data_parallel: training: how the data-parallel ranks hold the model: ``"fsdp"``
            (FSDP2: parameters, gradients and AdamW's state sharded), ``"ddp"``
            (DistributedDataParallel: whole replicas, gradients all-reduced once a step;
            ``DDP`` in the label), ``"zero1"`` (DDP with AdamW's state and update sharded
            over the replicas, Megatron-LM's distributed optimizer; ``DDP4 Z1``), ``"zero2"``
            (FSDP2 keeping each layer's gathered parameters from its forward to its backward,
            ``reshard_after_forward=False``: no all-gather in backward; ``DP4 Z2``) or
            ``"search"`` (each layout with data parallelism every way, the plan choosing;
            DDP and ZeRO-1 share their simulations); ``None``: FSDP2 for a decoder, FSDP2 and
            DDP for a vision model. An expert-parallel layout's is FSDP2; a screened plan
            simulates its DDP, ZeRO-1 and ZeRO-2 layouts.

    Returns:
        The :class:`Plan` (training) or :class:`~flopscope.plan.serve.ServePlan` (serving).

    Raises:
        UsageError: bad sizes, a profile without link figures or memory, a source that is not
            a transformers decoder, or no layout that divides the model and the devices;
            mixed precision where it is not built (serving, vision models, experts).
    """
    start = time.perf_counter()
    if mode not in ("train", "serve"):
        raise UsageError(f"plan(): mode must be 'train' or 'serve', got {mode!r}")
    if mode == "serve" and screen:
        raise UsageError("plan(): screen applies to training plans (mode='train'); a serving "
                         "plan simulates its roles")
    if not isinstance(confirm, int) or confirm < 1:
        raise UsageError(f"plan(): confirm must be a whole number >= 1, got {confirm!r}")
    if mode == "serve" and data_parallel is not None:
        raise UsageError("plan(mode='serve') does not take data_parallel: a serving layout's "
                         "replicas share nothing (DP in its label)")
    decoder_kinds = data_parallel_kinds(data_parallel)  # checked before the model is built
    if mode == "train" and (max_new_tokens is not None or batches is not None
                            or batching is not None):
        raise UsageError("plan(): max_new_tokens, batches and batching are serving options "
                         "(mode='serve'); a training plan takes global_batch")
    for name, value in (("gpus", gpus), ("gpus_per_node", gpus_per_node),
                        ("global_batch", global_batch), ("seq_len", seq_len),
                        ("memory_budget", memory_budget), ("tp", tp), ("pp", pp), ("ep", ep)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UsageError(f"plan(): {name} must be a whole number >= 1, got {value!r}")
    # a shipped GPU's with its reference calibration: predictions
    hw = compiled_hardware(get_hardware(hardware), compiled)
    links = Links.of(hw, gpus_per_node, gpus)
    budget = memory_budget if memory_budget is not None else hw.memory_bytes
    if budget is None:
        raise UsageError(f"hardware {hw.name!r} has no memory capacity: give a memory budget "
                         "(--memory-budget 80GiB)")
    sp_mode = sequence_parallel_mode(sequence_parallel)
    if mode == "serve":
        if param_dtype is not None or reduce_dtype is not None or sp_mode != "off":
            raise UsageError("plan(mode='serve') does not take param_dtype, reduce_dtype or "
                             "sequence_parallel: serving keeps the weights in --dtype and "
                             "runs plain tensor parallelism")
        if ep not in (None, 1):
            raise UsageError("plan(mode='serve') does not take ep: a serving layout shards a "
                             "mixture of experts' experts over its tensor-parallel ranks "
                             "(ep = tp); choose the degree with tp")
        return _serve(source, gpus, hw, links, gpus_per_node, budget, seq_len, dtype, config,
                      max_new_tokens, batches, {"global_batch": global_batch,
                                                "checkpointing": None if checkpointing
                                                is CHECKPOINTING else checkpointing}, tp, pp,
                      batching or "static")
    batch = global_batch if global_batch is not None else gpus
    stored, mixed = mixed_precision(dtype, param_dtype, reduce_dtype)
    build = build_model(source, seq_len, stored, config)
    probe, args, kwargs = build(1, "none")
    # a transformers model that is not a Llama-style decoder is planned data parallel, and
    # the plan says why
    why = decoder_problem(probe) if hasattr(probe, "config") else None
    decoder = hasattr(probe, "config") and why is None
    ids = token_ids(args, kwargs)
    seq = int(ids.shape[-1]) if ids is not None and decoder else (seq_len or 1)
    compute_dtype = next(probe.parameters()).dtype if mixed is None else getattr(torch, mixed[0])
    identity = model_identity(source, seq_len, stored, config)
    if sp_mode != "off" and not decoder:
        raise UsageError(f"{source}: sequence parallelism needs tensor parallelism; a vision "
                         "model is planned data parallel only")
    if mixed is not None and not decoder:
        raise UsageError(f"{source}: mixed precision (--param-dtype, --reduce-dtype) is planned "
                         "for transformers decoders only; plan a vision model in one --dtype")
    if decoder:
        shape = ModelShape.from_config(getattr(probe, "config", None))
        experts = shape.experts
        del probe
        if experts and sp_mode != "off":
            raise UsageError(f"{source} is a mixture of experts: sequence parallelism is not "
                             "built for its layers; drop --sequence-parallel")
        if experts and mixed is not None and ep != 1:
            raise UsageError(f"{source} is a mixture of experts: mixed precision is not built "
                             "with expert parallelism; add --ep 1 (or plan in one --dtype)")
        if not experts and ep not in (None, 1):
            raise UsageError(f"{source} has no experts: --ep {ep} applies to a mixture of "
                             "experts (Mixtral, Qwen2-MoE)")
        choices = decoder_layouts(gpus, shape, batch, checkpointing, sp_mode, tp=tp, pp=pp,
                                  ep=ep, data_parallel=decoder_kinds)
        if not choices:
            raise UsageError(
                f"no layout of {gpus} devices divides this model ({shape.heads} heads, "
                f"{shape.kv_heads} key/value heads, {shape.layers} layers) and a global batch "
                f"of {batch}" + _restricted(tp, pp, ep) + ": change --gpus or --global-batch")
        # a screened plan keeps its small runs: a confirmation reuses its reference's
        roles = (KeptRoles if screen else Roles)(build, hw, identity,
                                                 repeat_degrees=sharing_degrees())
        expert_roles = ExpertRoles(build, hw, identity)

        def runs_of(choice: Choice) -> list[RoleRun]:
            if choice.ep > 1:
                return expert_roles.runs(choice)
            return [roles.get(key)
                    for key in roles_of(choice, shape.layers, mixed, loss_parallel)]
    else:
        del probe
        check_vision_options(source, checkpointing, checkpointing is not CHECKPOINTING, tp, pp,
                             ep, why)
        choices = data_parallel_layouts(gpus, batch, data_parallel_kinds(data_parallel, False))
        if not choices:
            raise UsageError(f"a global batch of {batch} does not split over {gpus} devices: "
                             f"{source} is planned data parallel only (DDP or FSDP2 over the "
                             "batch); give a --global-batch that is a multiple of --gpus")
        vision = VisionRoles(build, hw, identity)
        runs_of = vision.runs
    flops = model_flops(build, batch)
    peak = hw.peak(dtype_key(compute_dtype) or "fp32", matrix=True)
    param_dtype_of = getattr(torch, stored)  # the update's and accumulation's dtype
    understated = 0

    def simulated(choice: Choice) -> Candidate:
        nonlocal understated
        runs = runs_of(choice)
        understated += any(r.understated for r in runs)
        return evaluate(choice, runs, links, budget=budget, tokens=batch * seq, flops=flops,
                        peak=peak, param_dtype=param_dtype_of)

    screening = None
    if screen and decoder:
        scr = Screen(roles, build, gpus)

        def screened(choice: Choice) -> Candidate:
            # the screen's references are FSDP2's, resharded after forward
            if choice.ep > 1 or choice.replicas or choice.keeps_gathered:
                return simulated(choice)
            keys = roles_of(choice, shape.layers, mixed, loss_parallel)
            return evaluate(choice, [scr.run(k) for k in keys], links, budget=budget,
                            tokens=batch * seq, flops=flops, peak=peak,
                            screened=any(scr.estimates(k) for k in keys),
                            param_dtype=param_dtype_of)

        every_one, screening = confirm_best(choices, screened, simulated, budget, confirm,
                                            lambda: scr.references)
    else:
        every_one = [simulated(c) for c in choices]
    fitting = [c for c in every_one if c.fits]
    dropped = [c for c in every_one if not c.fits]
    fitting.sort(key=lambda c: (c.time.total, c.memory_bytes))
    notes = (f"step times: compute from {compute_note(hw)}, plus communication at the links' alpha-beta "
             f"({links.source}); MFU against the dense "
             f"{dtype_key(compute_dtype)} peak of {hw.name}",
             decoder_note(stored, mixed, sp_mode, loss_parallel,
                          any(c.sequence_parallel for c in choices),
                          decoder_kinds) if decoder else
             "data parallel only: FSDP2 (fully_shard per block and the root) or DDP (DP/DDP in "
             "the label; whole parameters, gradients all-reduced by block); optimizer AdamW "
             "(two moments per parameter, in the parameters' dtype); tokens/s are samples/s"
             + (f" (tensor and pipeline layouts are built for Llama-style decoders: {why})"
                if why else ""),
             *((SELECTIVE_NOTE,) if any(c.startswith("selective") for c in checkpointing)
               else ()),
             *((UNDERSTATED_NOTE.format(understated),) if understated else ()),
             *((screening.note(),) if screening is not None else ()))
    used_roles, simulations = ((roles.used + expert_roles.used,
                                roles.simulations + expert_roles.simulations) if decoder
                               else (vision.used, vision.simulations))
    return Plan(source, gpus, hw, gpus_per_node, batch, seq, str(compute_dtype).replace(
        "torch.", ""), budget, tuple(fitting), tuple(dropped), pareto(fitting), flops,
        used_roles, simulations, time.perf_counter() - start, notes,
        "tokens" if decoder else "samples", None if mixed is None else stored,
        None if mixed is None else mixed[1], "search" if sp_mode == "search" else sp_mode == "on",
        loss_parallel and decoder,
        screening)


def _restricted(tp: int | None, pp: int | None, ep: int | None) -> str:
    """`` with tp 2 and pp 1`` (the degrees asked for), or nothing."""
    asked = [f"{n} {v}" for n, v in (("tp", tp), ("pp", pp), ("ep", ep)) if v is not None]
    return f" with {' and '.join(asked)}" if asked else ""


def _serve(source: str, gpus: int, hw: Hardware, links: Links, gpus_per_node: int, budget: int,
           seq_len: int | None, dtype: str, config: Mapping[str, Any] | None,
           max_new_tokens: int | None, batches: Sequence[int] | None,
           training: Mapping[str, Any], tp: int | None, pp: int | None,
           batching: str) -> ServePlan:
    """``plan(mode="serve")``: the model built for generation, then
    :func:`flopscope.plan.serve.serve_plan`."""
    from flopscope.plan.serve import check_serve_options, serve_plan

    check_serve_options(max_new_tokens, batches, training, batching)
    build = build_model(source, seq_len, dtype, config)
    probe, args, kwargs = build(1, "none")
    shape = ModelShape.from_config(getattr(probe, "config", None))
    ids = token_ids(args, kwargs)
    prompt = int(ids.shape[-1]) if ids is not None else (seq_len or DEFAULT_SEQ_LEN)
    param_dtype = str(next(probe.parameters()).dtype).replace("torch.", "")
    no_tensor_parallel = tp_plan_problem(probe)
    del probe

    def model() -> nn.Module:
        built, _, _ = build(1, "none")
        return built.eval()

    identity = ("serve", *model_identity(source, seq_len, dtype, config))
    return serve_plan(source, model, shape, identity=identity, gpus=gpus, hardware=hw,
                      links=links, prompt=prompt, new_tokens=max_new_tokens or 128,
                      budget=budget, dtype=param_dtype, batches=tuple(batches or (1,)),
                      gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                      no_tensor_parallel=no_tensor_parallel, batching=batching)
