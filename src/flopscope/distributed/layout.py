"""Parallel layouts: a world of ranks split into pipeline stages x data (FSDP2) x tensor
parallel, the device mesh for it, and the standard plans applied with PyTorch's own APIs
(``parallelize_module``, ``fully_shard``; pipelining in :mod:`flopscope.distributed.pipeline`,
experts in :mod:`flopscope.distributed.experts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from flopscope.distributed.fsdp_units import fully_shard_units
from flopscope.errors import UsageError

__all__ = ["Layout", "apply_layout", "head_plan", "llama_tp_plan", "named_mesh",
           "sequence_parallel_model_plan", "tp_plan_problem"]


@dataclass(frozen=True)
class Layout:
    """How ``world_size`` ranks are split: ``pp`` pipeline stages x ``fsdp`` data-parallel
    (FSDP2) shards x ``tp`` tensor-parallel ranks (``world_size = pp * fsdp * tp``; tensor-parallel
    ranks are neighbours, pipeline stages the outermost dimension: rank
    ``(stage * fsdp + d) * tp + t``). Expert parallelism (``ep``) shards a mixture of experts'
    experts over the ranks (torchtitan's layouts): over the whole world (``ep = world_size``;
    the other parameters replicated, or FSDP2-sharded over the data-parallel ranks with
    ``fsdp = world_size // tp``; with ``tp`` > 1 attention is tensor-parallel, shape-only
    counts only), or in groups of ``ep`` neighbouring ranks with ``fsdp = world_size`` and no
    tensor parallelism (each expert's shard FSDP2-sharded over its ``world_size / ep``
    copies). Not combined with pipeline stages or sequence parallelism.

    Attributes:
        world_size: ranks in the job.
        tp: tensor-parallel degree (innermost mesh dimension).
        fsdp: FSDP2 degree; ``None``: ``world_size // (tp * pp)``.
        sequence_parallel: shard the norms' activations along the sequence (SequenceParallel;
            :func:`llama_tp_plan` and :func:`sequence_parallel_model_plan`).
        rank: the rank to describe.
        pp: pipeline-parallel degree (stages, one per rank of a pipeline group).
        ep: expert-parallel degree (1, the world size, or a divisor of it with
            ``fsdp = world_size``).
        mixed_precision: ``(compute dtype, reduce dtype)`` names (``("bfloat16", "float32")``):
            FSDP2's :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` (``param_dtype``,
            ``reduce_dtype``) on every ``fully_shard``: the shards and their gradients stay in
            the model's dtype, the gathered parameters are cast to the compute dtype, gradients
            reduced in the reduce dtype; also over a data-parallel group of one (FSDP2 then
            casts without a collective); not with ``ep`` > 1. ``None``: the model's dtype.
        replicate: DDP instead of FSDP2 shards: whole parameters on every data-parallel
            rank, gradients all-reduced unit by unit in backward (``fully_shard`` over ``dp``
            replicas of one shard, hybrid sharding: on each layer, each other module holding
            parameters, :mod:`~flopscope.distributed.fsdp_units`, and the root); not with
            ``ep`` > 1.
        keep_gathered: FSDP2 keeps each layer's gathered parameters from its forward to its
            backward (``reshard_after_forward=False``: no all-gather in backward; torchtitan's
            choice with pipeline stages); not built with ``ep`` > 1.
        loss_parallel: the head column-wise over the vocabulary, its logits left sharded
            (``Shard(-1)``, no gather) and the loss computed on the shards under torch's
            :func:`~torch.distributed.tensor.parallel.loss_parallel` (torchtitan's and
            Megatron-LM's tensor parallelism); needs ``tp`` >= 2, not built with pipeline
            stages or expert parallelism.

    Raises:
        UsageError: the degrees do not multiply to the world size, the rank is out of range, or
            an expert-parallel layout that is not built.
    """

    world_size: int
    tp: int = 1
    fsdp: int | None = None
    sequence_parallel: bool = False
    rank: int = 0
    pp: int = 1
    ep: int = 1
    mixed_precision: tuple[str, str] | None = None
    loss_parallel: bool = False
    replicate: bool = False
    keep_gathered: bool = False

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if self.world_size % (self.tp * self.pp):
            raise UsageError(f"world size {self.world_size} is not a multiple of tp x pp = "
                             f"{self.tp} x {self.pp}")
        if self.fsdp is not None and self.fsdp * self.tp * self.pp != self.world_size:
            raise UsageError(
                f"pp x fsdp x tp = {self.pp} x {self.fsdp} x {self.tp} = "
                f"{self.pp * self.fsdp * self.tp}, not the world size {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        dp = self.world_size // (self.tp * self.pp)
        # expert groups of ep ranks (torchtitan's dp_shard_in_ep), each expert FSDP-sharded over
        # its world / ep copies (dp_shard_mod_ep)
        groups = (self.ep < self.world_size and self.world_size % self.ep == 0 and self.tp == 1
                  and self.fsdp == self.world_size)
        if self.ep > 1 and ((self.ep != self.world_size and not groups) or self.pp > 1
                            or self.fsdp not in (None, dp) or self.sequence_parallel):
            raise UsageError(
                f"--ep {self.ep}: expert parallelism is built over the whole world here "
                f"(--ep = --world-size = {self.world_size}; optionally --tp for attention and "
                f"--fsdp {dp} for FSDP2 on the non-expert parameters), or in groups of --ep "
                "ranks that divide the world with --fsdp = --world-size and no --tp (every "
                "expert FSDP-sharded over its world / ep copies); not combined with --pp or "
                "--sequence-parallel: pipeline stages with experts are not built")
        if (self.replicate or self.keep_gathered) and self.ep > 1:
            raise UsageError("DDP and FSDP2 keeping gathered parameters are not built with "
                             "expert parallelism: use --ep 1 or FSDP2's default")
        if self.replicate and self.keep_gathered:
            raise UsageError("keep_gathered is FSDP2's: DDP's parameters are whole already")
        if self.loss_parallel and (self.tp < 2 or self.ep > 1):
            raise UsageError("loss parallelism shards the logits over the tensor-parallel ranks: "
                             "it needs --tp >= 2 and is not built with --ep")
        if self.mixed_precision is not None:
            if self.ep > 1:
                raise UsageError("mixed precision (FSDP2's MixedPrecisionPolicy) is not built "
                                 "with expert parallelism: use --ep 1 or one dtype")
            self.policy()  # the dtype names are checked here

    def policy(self) -> Any:
        """FSDP2's mixed precision policy for :attr:`mixed_precision` (``None`` without).

        Returns:
            A :class:`torch.distributed.fsdp.MixedPrecisionPolicy`, or ``None``.

        Raises:
            UsageError: a name that is not a floating-point dtype.
        """
        if self.mixed_precision is None:
            return None
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtypes = []
        for name in self.mixed_precision:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise UsageError(f"mixed precision: {name!r} is not a floating-point dtype "
                                 "(bfloat16, float16, float32)")
            dtypes.append(dtype)
        return MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1])

    @property
    def dp(self) -> int:
        """The data-parallel (FSDP2) degree."""
        return self.fsdp if self.fsdp is not None else self.world_size // (self.tp * self.pp)

    @property
    def sequence_shards(self) -> int:
        """How many sequence shards a pipeline stage boundary carries: the tensor-parallel
        degree with sequence parallelism, else 1."""
        return self.tp if self.sequence_parallel else 1

    @property
    def stage(self) -> int:
        """The pipeline stage of :attr:`rank`."""
        return self.rank // (self.dp * self.tp)

    def stage_ranks(self) -> list[int]:
        """The ranks of :attr:`rank`'s pipeline group, in stage order."""
        inner = self.rank % (self.dp * self.tp)
        return [s * self.dp * self.tp + inner for s in range(self.pp)]

    def mesh(self) -> Any:
        """The CPU :class:`~torch.distributed.device_mesh.DeviceMesh`: (``dp``, ``tp``), or
        (``pp``, ``dp``, ``tp``) with pipeline stages (dimensions of size 1 kept); with
        :attr:`replicate` a ``shard`` dimension of size 1 after ``dp`` (FSDP2's hybrid sharding:
        ``dp`` replicas of one shard)."""
        if self.ep > 1 and self.tp == 1 and self.ep == self.world_size:
            return named_mesh((self.ep, 1), ("ep", "tp"))
        if self.ep > 1 and self.tp == 1:
            return named_mesh((self.world_size // self.ep, self.ep, 1), ("efsdp", "ep", "tp"))
        shape: tuple[int, ...] = (self.dp, self.tp)
        names: tuple[str, ...] = ("dp", "tp")
        if self.replicate:
            shape, names = (self.dp, 1, self.tp), ("dp", "shard", "tp")
        if self.pp > 1:
            shape, names = (self.pp, *shape), ("pp", *names)
        return named_mesh(shape, names)

    def data_mesh(self, mesh: Any) -> Any:
        """The part of :meth:`mesh` that ``fully_shard`` takes: ``dp``, or with
        :attr:`replicate` the (``dp``, ``shard``) pair of hybrid sharding."""
        return mesh["dp", "shard"] if self.replicate else mesh["dp"]


def named_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A CPU device mesh whose every dimension has a process group of its own, described
    ``mesh_<name>`` (a collective's record names its group by it: :mod:`flopscope.core.comm`):
    ``init_device_mesh`` hands a dimension that spans the whole world the default group unless
    its backend is given, so it is given (the default group's).

    Args:
        shape: the mesh's shape.
        names: its dimensions' names.

    Returns:
        A :class:`torch.distributed.device_mesh.DeviceMesh`.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    backend = str(dist.get_backend())
    return init_device_mesh("cpu", shape, mesh_dim_names=names,
                            backend_override={n: backend for n in names})


def llama_tp_plan(layer: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
    """The standard tensor-parallel plan of one Llama-style decoder layer: column-wise q/k/v and
    gate/up projections, row-wise o and down projections (one all-reduce after attention and one
    after the MLP in forward, the same in backward for the input gradients); with
    ``sequence_parallel`` the two norms run on sequence shards (all-gather / reduce-scatter
    instead of all-reduce).

    Args:
        layer: a decoder layer with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``.
        sequence_parallel: shard the norms along the sequence.

    Returns:
        A plan for :func:`torch.distributed.tensor.parallel.parallelize_module`.

    Raises:
        UsageError: the layer does not have those projections.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    moe = _has(layer, "mlp.experts") and _has(layer, "mlp.gate")
    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             *([] if moe else ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])]
    missing = [n for n in names if not _has(layer, n)]
    if missing:
        raise UsageError(
            f"{type(layer).__name__} has no {', '.join(missing)}: the standard tensor-parallel "
            "plan is written for Llama-style layers (q/k/v/o, gate/up/down projections)")
    if moe and sequence_parallel:
        raise UsageError("sequence parallelism is not built for mixture-of-experts layers")
    if moe:  # attention only: the experts are sharded by expert parallelism, the router runs
        # replicated on the tensor-parallel group's shared batch; a shared expert (Qwen2-MoE's
        # shared_expert, DeepSeek's shared_experts) is a dense MLP on that batch, sharded as one
        shared = next((f"mlp.{n}" for n in ("shared_expert", "shared_experts")
                       if _has(layer, f"mlp.{n}.gate_proj")), None)
        return {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            **({f"{shared}.gate_proj": ColwiseParallel(), f"{shared}.up_proj": ColwiseParallel(),
                f"{shared}.down_proj": RowwiseParallel()} if shared else {}),
        }
    if not sequence_parallel:
        return {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
    seq = Shard(1)
    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=seq),
    }


def sequence_parallel_model_plan(model: nn.Module, loss_parallel: bool = False
                                 ) -> dict[str, Any]:
    """The model-level half of the sequence-parallel plan (torchtitan's layout): the first decoder
    layer takes the (replicated) embedding output and keeps its own sequence shard (a local
    slice, nothing sent); the final norm runs on sequence shards; the head's input is
    all-gathered along the sequence and the head runs replicated, as without sequence
    parallelism.

    The embedding and the rotary embedding's cos/sin table stay replicated and full length, so
    attention (which sees the whole sequence after the all-gather before q/k/v) gets positions
    for every token: sharding the embedding's output instead would hand the rotary embedding a
    shard's positions (transformers computes them from ``inputs_embeds.shape[1]``) and break
    attention with a broadcast error.

    On a pipeline stage (:class:`~flopscope.distributed.pipeline.DecoderStage`) each part is
    where the stage has it: the first stage's first layer takes the embedding's output as
    above; a later stage's first layer takes the sequence shards the stage before it sent
    (its boundary carries shards, ``1 / tp`` of the activations, as Megatron-LM's does); the
    last stage's norm and head as above.

    Args:
        model: a transformers decoder LM (``model.layers``, ``model.norm``, ``lm_head``), or a
            pipeline stage of one.
        loss_parallel: the head column-wise over the vocabulary (:func:`head_plan`) instead.

    Returns:
        A plan for :func:`torch.distributed.tensor.parallel.parallelize_module` on ``model``.

    Raises:
        UsageError: the model lacks those modules.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    layers = getattr(getattr(model, "model", None), "layers", None)
    first = next(iter(layers.keys()), None) if isinstance(layers, nn.ModuleDict) else "0"
    embeds = _has(model, "model.embed_tokens")  # a pipeline's first stage, or the whole model
    needed = ["model.norm", "lm_head"] if not isinstance(layers, nn.ModuleDict) else []
    names = [f"model.layers.{first}", *needed]
    missing = [n for n in names if not _has(model, n)]
    if missing:
        raise UsageError(
            f"{type(model).__name__} has no {', '.join(missing)}: the sequence-parallel plan is "
            "written for transformers decoder LMs (model.layers, model.norm, lm_head)")
    seq = Shard(1)
    plan: dict[str, Any] = {}
    if embeds:  # a later stage receives its first layer's input as sequence shards already
        plan[f"model.layers.{first}"] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(seq,), use_local_output=True)
    if _has(model, "model.norm"):  # the last stage's
        plan["model.norm"] = SequenceParallel()
        plan["lm_head"] = head_plan(model, seq)["lm_head"] if loss_parallel else (
            PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                               use_local_output=True))
    return plan


def head_plan(model: nn.Module, input_layout: Any = None) -> dict[str, Any]:
    """Loss parallelism's head (torchtitan's plan of its output layer): ``lm_head`` column-wise
    over the vocabulary, its logits left as vocabulary shards (a DTensor, ``Shard(-1)``: no
    gather), for a loss computed on the shards under torch's
    :func:`~torch.distributed.tensor.parallel.loss_parallel`.

    Args:
        model: a transformers decoder LM (``lm_head``).
        input_layout: the head's input placement (``Shard(1)``: sequence shards, gathered
            first); ``None``: replicated.

    Returns:
        A plan for :func:`torch.distributed.tensor.parallel.parallelize_module` on ``model``.

    Raises:
        UsageError: the model has no ``lm_head``.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    if not _has(model, "lm_head"):
        raise UsageError(f"{type(model).__name__} has no lm_head: loss parallelism shards a "
                         "transformers causal LM's head")
    return {"lm_head": ColwiseParallel(input_layouts=input_layout or Replicate(),
                                       output_layouts=Shard(-1), use_local_output=False)}


def tp_plan_problem(model: nn.Module) -> str | None:
    """Why the standard tensor-parallel plan (:func:`llama_tp_plan`) does not apply to
    ``model``, or ``None`` where it does: its decoder layers are found and the first has the
    Llama-style projections (or a mixture of experts' attention and experts). A plan lays such
    a model out data parallel only (training) or without tensor parallelism (serving).

    Args:
        model: the model.

    Returns:
        The reason, or ``None``.
    """
    try:
        layers = _decoder_layers(model)
        if not layers:
            return f"{type(model).__name__} has no decoder layers"
        llama_tp_plan(layers[0])
    except UsageError as e:
        return str(e)
    return None


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM (``model.model.layers``) or base model
    (a pipeline stage holds its layers in a ``ModuleDict`` keyed by their indices)."""
    from flopscope.distributed.repeat import layer_list, layers_in

    found = layer_list(model)
    if found is not None:
        return layers_in(found[1])
    raise UsageError(
        f"{type(model).__name__} has no list of decoder layers (model.layers): parallel layouts "
        "are applied to transformers decoder models (Llama, Mistral, Qwen2 ...)")


def _expert_layout(model: nn.Module, layout: Layout, mesh: Any) -> nn.Module:
    """Expert parallelism over the whole world, with tensor parallelism on attention (the
    tensor-parallel group shares a batch; transformers' dispatch slices it) and FSDP2 on the
    non-expert parameters where asked."""
    from flopscope.distributed.experts import apply_expert_parallel, moe_blocks

    layers = _decoder_layers(model)
    # every group a mesh dimension of its own, so each collective's record names it
    # (CommRecord.group: ``ep`` for the all-to-alls, ``dp`` for FSDP2 on the rest, ``efsdp`` for
    # the experts' copies); a dimension spanning the world would otherwise be ``world``
    dp_mesh = None
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        for layer in layers:
            parallelize_module(layer, mesh["tp"], llama_tp_plan(layer))
        apply_expert_parallel(model, {"ep": named_mesh((layout.ep,), ("ep",)), "tp": mesh["tp"]})
        dp_mesh = mesh["dp"]
    elif layout.ep < layout.world_size:  # expert groups: each expert has world / ep copies
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        apply_expert_parallel(model, mesh)
        blocks = moe_blocks(model)
        # fewer local experts than copies (world > experts): shard each expert's weights along
        # dimension 1, as torchtitan does, instead of padding the expert dimension
        along = None
        if layout.world_size > int(blocks[0][1].gate.num_experts):
            def along(p: nn.Parameter) -> Shard:
                return Shard(1)
        for _, block in blocks:
            fully_shard(block.experts, mesh=mesh["efsdp"], shard_placement_fn=along)
    else:
        apply_expert_parallel(model, mesh)
    if layout.fsdp is not None and layout.fsdp > 1:
        # torchtitan's layout at ep = dp_shard x tp: the experts sharded by expert parallelism
        # only (each on one rank, nothing to reduce), the rest by FSDP2 over the data-parallel
        # ranks
        from torch.distributed.fsdp import fully_shard

        if dp_mesh is None:  # the non-expert parameters over every rank (fsdp = world size)
            dp_mesh = named_mesh((layout.world_size,), ("dp",))
        experts = {p for _, b in moe_blocks(model) for p in b.experts.parameters()}
        for layer in layers:
            fully_shard(layer, mesh=dp_mesh, ignored_params=experts)
        fully_shard(model, mesh=dp_mesh, ignored_params=experts)
    return model


def apply_layout(model: nn.Module, layout: Layout, mesh: Any) -> nn.Module:
    """Shard ``model`` in place: the standard tensor-parallel plan on every decoder layer over the
    mesh's ``tp`` dimension (when tp > 1), then FSDP2 (``fully_shard``) on every decoder layer and
    on the root over the ``dp`` dimension (when dp > 1, or with :attr:`Layout.mixed_precision`,
    whose policy each ``fully_shard`` gets; with :attr:`Layout.replicate` also on each module
    with parameters outside the layers, :mod:`flopscope.distributed.fsdp_units`); with ``ep`` >
    1 instead the experts of
    every MoE block over the ranks (:func:`~flopscope.distributed.experts.apply_expert_parallel`),
    and with ``fsdp = ep`` FSDP2 on every decoder layer and the root over the same ranks, the
    experts' parameters left out (``ignored_params``: each expert lives on one rank, so its
    gradient has nothing to reduce).

    Args:
        model: a transformers decoder model (on the ``meta`` device for a simulation).
        layout: the layout.
        mesh: its mesh (:meth:`Layout.mesh`).

    Returns:
        ``model``.

    Raises:
        UsageError: the model is not a decoder with Llama-style projections.
    """
    if layout.ep > 1:
        return _expert_layout(model, layout, mesh)
    layers = _decoder_layers(model)
    if layout.sequence_parallel and layout.tp < 2:
        raise UsageError("sequence parallelism shards activations over the tensor-parallel "
                         "ranks: it needs tp >= 2")
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        for layer in layers:
            parallelize_module(layer, mesh["tp"], llama_tp_plan(layer, layout.sequence_parallel))
        if layout.sequence_parallel:
            parallelize_module(model, mesh["tp"],
                               sequence_parallel_model_plan(model, layout.loss_parallel))
        elif layout.loss_parallel and _has(model, "lm_head"):  # a pipeline's last stage
            parallelize_module(model, mesh["tp"], head_plan(model))
    if layout.dp > 1 or layout.mixed_precision is not None:
        fully_shard_units(model, layers, layout.data_mesh(mesh), replicate=layout.replicate,
                          keep_gathered=layout.keep_gathered, mp_policy=layout.policy())
    return model
