"""Data-parallel plans of models that are not transformers decoders (torchvision, timm): the
batch split over N devices, each device one rank of DDP or FSDP2, nothing else.

A vision model has no heads or layers to split by tensor or pipeline parallelism here, so its
layouts are ``dp = N`` with a micro-batch (:func:`data_parallel_layouts`), each in two kinds:

- **FSDP2**: ``fully_shard`` on every block (each module with parameters directly inside an
  ``nn.Sequential`` or ``nn.ModuleList``, through nested containers: a ResNet's bottlenecks, a
  ViT's encoder blocks) and on the root, over the N ranks: parameters gathered in forward and in
  backward, gradients reduce-scattered;
- **DDP**: the same calls with a mesh of N replicas of one shard (FSDP2's hybrid sharding with
  shard size 1): every rank keeps whole parameters and gradients, and the gradients are
  all-reduced in backward, bucketed by block, as ``DistributedDataParallel`` does.

Each layout's rank is simulated once (:class:`VisionRoles`, a :class:`flopscope.plan.sharded.OneRole`,
which runs :func:`flopscope.plan.sharded.simulate_sharded`): on torch's fake process group, shape-only,
forward and backward from the sum of the outputs, with the memory tracker and the roofline log
watching, as a decoder's roles are (:mod:`flopscope.plan.roles`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

from torch import nn

from flopscope.distributed.fsdp_units import fully_shard_units
from flopscope.distributed.layout import tp_plan_problem
from flopscope.errors import UsageError
from flopscope.estimate import Hardware
from flopscope.plan.roles import RoleKey, RoleRun
from flopscope.plan.sharded import OneRole, Shard
from flopscope.plan.space import Choice, data_parallel_kinds, divisors

__all__ = ["VisionRoles", "blocks", "check_vision_options", "data_parallel_layouts",
           "decoder_problem", "is_decoder", "remember", "vision_role_key", "vision_variant"]


def decoder_problem(model: nn.Module) -> str | None:
    """Why ``model`` is not planned as a Llama-style decoder (tensor, pipeline and expert
    layouts) but data parallel only, or ``None`` where it is: a transformers model whose config
    gives the layers, heads and MLP size and whose decoder layers take the standard
    tensor-parallel plan (:func:`~flopscope.distributed.layout.tp_plan_problem`).

    Args:
        model: the model (a torchvision model has no ``config``).

    Returns:
        The reason, or ``None``.
    """
    config = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} is not a transformers model"
    missing = [n for n in ("num_hidden_layers", "num_attention_heads", "intermediate_size")
               if getattr(config, n, None) is None]
    if missing:
        return f"{type(model).__name__}'s config has no {missing[0]}"
    return tp_plan_problem(model)


def is_decoder(model: nn.Module) -> bool:
    """Whether ``model`` is planned as a Llama-style decoder (:func:`decoder_problem`).

    Args:
        model: the model.

    Returns:
        ``True`` for a decoder the tensor and pipeline layouts apply to.
    """
    return decoder_problem(model) is None


def blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP2 wraps one by one: every module with parameters directly inside an
    ``nn.Sequential`` or ``nn.ModuleList``, looking through nested containers.

    Args:
        model: the model.

    Returns:
        The blocks, in model order (empty when the model has no such container).
    """
    found: list[nn.Module] = []
    container = isinstance(model, (nn.Sequential, nn.ModuleList))
    for child in model.children():
        if isinstance(child, (nn.Sequential, nn.ModuleList)):
            found += blocks(child)
        elif container and any(True for _ in child.parameters()):
            found.append(child)
        else:
            found += blocks(child)
    return found


def data_parallel_layouts(gpus: int, global_batch: int,
                          kinds: Iterable[str] | None = None) -> list[Choice]:
    """The data-parallel layouts of ``gpus`` devices for a step of ``global_batch`` samples:
    ``dp = gpus``, each micro-batch dividing a rank's ``global_batch / gpus`` samples.

    Args:
        gpus: devices.
        global_batch: samples per step.
        kinds: of :data:`~flopscope.plan.space.DATA_PARALLEL` (``None``: a vision model's
            default, :func:`~flopscope.plan.space.data_parallel_kinds`).

    Returns:
        The layouts (none when the batch does not split over the devices).
    """
    if global_batch % gpus:
        return []
    per_rank = global_batch // gpus
    return [Choice(1, 1, gpus, micro, per_rank // micro, "none", kind)
            for micro in divisors(per_rank)
            for kind in (data_parallel_kinds(None, False) if kinds is None else kinds)]


def vision_variant(choice: Choice) -> str:
    """How a vision layout's rank is simulated (:class:`VisionRoles`' variant): ``ddp`` for
    whole replicas (DDP, and ZeRO-1, which shares DDP's simulation), ``zero2`` for FSDP2 keeping
    its gathered parameters, else ``fsdp``."""
    return "ddp" if choice.replicas else "zero2" if choice.keeps_gathered else "fsdp"


def vision_role_key(choice: Choice) -> RoleKey:
    """The role of a vision model's data-parallel rank (every rank does the same work); with
    ``choice.data_parallel``, what :class:`VisionRoles` simulates.

    Args:
        choice: a data-parallel layout.

    Returns:
        Its role.
    """
    return RoleKey(1, 1, 0, choice.dp, choice.micro_batch, 1, "none")


class VisionRoles(OneRole[str]):
    """Data-parallel ranks of a vision model, each role simulated once per process (every rank
    runs the same shapes); the variant is ``fsdp``, ``ddp`` or ``zero2``.
    """

    cache: ClassVar[dict[tuple[Hashable, str, Any, RoleKey], RoleRun]] = {}

    def role(self, choice: Choice) -> tuple[str, RoleKey, int]:
        """See :meth:`OneRole.role`."""
        return vision_variant(choice), vision_role_key(choice), choice.dp

    def shard(self, variant: str, key: RoleKey) -> Shard:
        """See :meth:`OneRole.shard`."""

        def shard(model: nn.Module) -> None:
            from torch.distributed.device_mesh import init_device_mesh

            if variant == "ddp":  # N replicas of one shard: whole parameters, all-reduced grads
                mesh = init_device_mesh("cpu", (key.dp, 1), mesh_dim_names=("replicate", "shard"))
            else:
                mesh = init_device_mesh("cpu", (key.dp,), mesh_dim_names=("dp",))
            fully_shard_units(model, blocks(model), mesh, replicate=variant == "ddp",
                              keep_gathered=variant == "zero2")

        return shard


def remember(identity: Hashable, hardware: Hardware, data_parallel: str, run: RoleRun) -> None:
    """Keep a vision role simulated elsewhere (a worker process, a Ray task): a later
    :meth:`VisionRoles.runs` of the same model, hardware and layout finds it.

    Args:
        identity: what the role's model is (as :class:`VisionRoles` is given it).
        hardware: the profile its estimate is for.
        data_parallel: ``fsdp`` or ``ddp``.
        run: the simulated role.
    """
    VisionRoles.remember(identity, hardware, data_parallel, run)


def check_vision_options(source: str, checkpointing: Iterable[str], asked: bool,
                         tp: int | None = None, pp: int | None = None,
                         ep: int | None = None, why: str | None = None) -> None:
    """Refuse what a data-parallel plan of a vision model (or of another model that is not a
    Llama-style decoder) does not take.

    Args:
        source: the SOURCE (for the message).
        checkpointing: the checkpointing choices.
        asked: whether the caller chose them (the default is ignored).
        tp: a tensor-parallel degree asked for.
        pp: pipeline stages asked for.
        ep: an expert-parallel degree asked for.
        why: a transformers model's reason (:func:`decoder_problem`), for the message.

    Raises:
        UsageError: block checkpointing, tensor, pipeline or expert parallelism asked for.
    """
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep)):
        if value is not None and value > 1:
            raise UsageError(f"{source} is planned data parallel only: --{name} {value} does "
                             "not apply (tensor and pipeline layouts are built for transformers "
                             "decoders' heads and layers, Llama-style"
                             + (f"; {why}" if why else "") + "); leave it out")
    if asked and any(c != "none" for c in checkpointing):
        raise UsageError(f"{source} is planned data parallel only (DDP or FSDP2 over the "
                         "batch): activation checkpointing (per block or selective) is built for "
                         "transformers decoders; leave --checkpointing out")
