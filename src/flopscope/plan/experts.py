"""Expert-parallel layouts of a mixture of experts (Mixtral, Qwen2-MoE style) in a training plan.

Besides the layouts every decoder gets (:func:`~flopscope.plan.space.enumerate_layouts`, where
the experts are FSDP2-sharded like any weight), a model with experts gets its experts sharded
over ``ep`` ranks (:func:`expert_layouts`), as :class:`flopscope.distributed.Layout` builds it
with transformers' own expert-parallel styles (:mod:`flopscope.distributed.experts`; tokens
dispatched to their experts' ranks and combined with all-to-alls, routing assumed balanced
shape-only):

- without tensor parallelism, ``ep`` any divisor of N that divides the experts: expert groups of
  ``ep`` neighbouring ranks (``ep = N``: one group), the other parameters FSDP2-sharded over
  the N ranks, each expert's shard FSDP2-sharded over its ``N / ep`` copies;
- with tensor parallelism (attention only), ``ep = N`` (N dividing the experts): the
  tensor-parallel group shares a batch and each of its ranks dispatches a slice, the other
  parameters FSDP2-sharded over the ``N / tp`` data-parallel ranks;
- no pipeline stages (pipelining with experts is not built).

``ep`` divides the experts: every rank holds ``experts / ep`` whole experts. Each layout's rank
is simulated once (:class:`ExpertRoles`, a :class:`flopscope.plan.sharded.OneRole`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from torch import nn

from flopscope.distributed import Layout, apply_layout
from flopscope.estimate import Hardware
from flopscope.plan.checkpointing import CHECKPOINTING
from flopscope.plan.roles import RoleKey, RoleRun
from flopscope.plan.sharded import OneRole, Shard
from flopscope.plan.space import Choice, ModelShape, divisors, enumerate_layouts

__all__ = ["ExpertRoles", "decoder_layouts", "expert_layouts", "expert_role_key", "remember"]


def expert_layouts(gpus: int, shape: ModelShape, experts: int, global_batch: int,
                   checkpointing: Sequence[str] = CHECKPOINTING) -> list[Choice]:
    """The expert-parallel layouts (``ep`` > 1) of ``gpus`` devices (see the module's
    docstring).

    Args:
        gpus: devices.
        shape: the model's shape (the attention heads bound the tensor-parallel degree).
        experts: experts per MoE layer.
        global_batch: sequences per step.
        checkpointing: the checkpointing choices.

    Returns:
        The layouts, by tp, ep, micro-batch, checkpointing.
    """
    out: list[Choice] = []
    for tp in divisors(gpus):
        if shape.heads % tp or shape.kv_heads % tp:
            continue
        dp = gpus // tp
        if global_batch % dp:
            continue
        eps = [e for e in divisors(gpus) if e > 1 and experts % e == 0] if tp == 1 else (
            [gpus] if experts % gpus == 0 and gpus > 1 else [])
        per_rank = global_batch // dp
        for ep in eps:
            for micro in divisors(per_rank):
                out += [Choice(tp, 1, dp, micro, per_rank // micro, c, "fsdp", ep)
                        for c in checkpointing]
    return out


def decoder_layouts(gpus: int, shape: ModelShape, global_batch: int,
                    checkpointing: Sequence[str], sequence_parallel: str, *,
                    tp: int | None = None, pp: int | None = None,
                    ep: int | None = None,
                    data_parallel: Sequence[str] = ("fsdp",)) -> list[Choice]:
    """Every layout a decoder's training plan weighs: those of
    :func:`~flopscope.plan.space.enumerate_layouts` and, for a mixture of experts, its
    expert-parallel ones (:func:`expert_layouts`), kept where they have the degrees asked for.

    Args:
        gpus: devices.
        shape: the model's shape (:attr:`~flopscope.plan.space.ModelShape.experts`).
        global_batch: sequences per step.
        checkpointing: activation checkpointing choices.
        sequence_parallel: ``"off"``, ``"on"`` or ``"search"``
            (:func:`~flopscope.plan.space.sequence_parallel_mode`).
        tp: only this tensor-parallel degree.
        pp: only this many stages.
        ep: only this expert-parallel degree (1: the layouts without).
        data_parallel: the data-parallel kinds of the layouts without expert parallelism
            (an expert-parallel layout's data parallelism is FSDP2).

    Returns:
        The layouts.
    """
    every = enumerate_layouts(gpus, shape, global_batch, checkpointing, sequence_parallel,
                              data_parallel)
    if shape.experts:
        every += expert_layouts(gpus, shape, shape.experts, global_batch, checkpointing)
    return [c for c in every if tp in (None, c.tp) and pp in (None, c.pp) and ep in (None, c.ep)]


def expert_role_key(choice: Choice) -> RoleKey:
    """The role of an expert-parallel layout's rank (every rank does the same work under
    balanced routing); with ``choice.ep``, what :class:`ExpertRoles` simulates.

    Args:
        choice: an expert-parallel layout.

    Returns:
        Its role.
    """
    return RoleKey(choice.tp, 1, 0, choice.dp, choice.micro_batch, 1, choice.checkpoint,
                   loss=ExpertRoles.loss)


class ExpertRoles(OneRole[int]):
    """Expert-parallel ranks of a mixture of experts, each role simulated once per process
    (rank 0; every rank runs the same shapes under balanced routing); the variant is ``ep``.
    """

    cache: ClassVar[dict[tuple[Hashable, str, Any, RoleKey], RoleRun]] = {}
    loss: ClassVar[str] = "cross_entropy"

    def role(self, choice: Choice) -> tuple[int, RoleKey, int]:
        """See :meth:`OneRole.role`."""
        return choice.ep, expert_role_key(choice), choice.tp * choice.dp

    def shard(self, variant: int, key: RoleKey) -> Shard:
        """See :meth:`OneRole.shard`."""
        layout = Layout(key.tp * key.dp, tp=key.tp, fsdp=key.dp, ep=variant)

        def shard(model: nn.Module) -> None:
            apply_layout(model, layout, layout.mesh())

        return shard


def remember(identity: Hashable, hardware: Hardware, ep: int, run: RoleRun) -> None:
    """Keep an expert-parallel role simulated elsewhere (a worker process, a Ray task).

    Args:
        identity: what the role's model is (as :class:`ExpertRoles` is given it).
        hardware: the profile its estimate is for.
        ep: the expert-parallel degree.
        run: the simulated role.
    """
    ExpertRoles.remember(identity, hardware, ep, run)
