"""The roles of a layout: which ranks of its pipeline group do the same work, so that each role
is simulated once (:class:`flopscope.plan.roles.Roles`)."""

from __future__ import annotations

from flopscope.plan.layers import UNIT_SMALL
from flopscope.plan.roles import RoleKey
from flopscope.plan.space import Choice

__all__ = ["roles_of"]


def roles_of(choice: Choice, layers: int, mixed_precision: tuple[str, str] | None = None,
             loss_parallel: bool = False, loss: str = "cross_entropy") -> list[RoleKey]:
    """The role of each rank of a layout's pipeline group, in stage order (one stage without
    pipelining: every rank runs the same shapes).

    A stage is simulated over the step's microbatches up to ``pp + 2`` (1F1B keeps at most
    ``pp`` in flight, but from ``pp + 1`` on forwards run while the gradients exist, and each
    microbatch leaves its input, and on the last stage its output, live to the step's end);
    with more, its peak is taken at the step's count (:attr:`RoleKey.peak_microbatches`) and
    :func:`~flopscope.plan.timing.step_time` scales its work. A pipeline of more than 18
    stages is simulated over ``pp`` (its stages put together from small pipelines of as
    many). Middle stages (neither the first, with the embedding, nor the last, with the head) that hold as many layers run the same shapes per microbatch; the
    earliest of them keeps the most microbatches in flight (``pp - stage``), so its peak is
    theirs: they share its role. A pipeline has at most four roles: the first stage, the
    last, and the earliest middle stage of each layer count (``split_layers`` gives the first
    ``layers % pp`` stages one layer more). Sequence parallelism is the layout's own
    (:attr:`Choice.sequence_parallel`, where it applies: tensor parallelism without stages);
    loss parallelism is the stage's that holds the head (the last, or the only one).

    Args:
        choice: the layout.
        layers: the model's decoder layers.
        mixed_precision: FSDP2's mixed precision (:attr:`RoleKey.mixed_precision`).
        loss_parallel: loss parallelism where it applies: tensor parallelism, on the stage
            with the head (:attr:`RoleKey.loss_parallel`).
        loss: the roles' loss (:attr:`RoleKey.loss`; a plan's: the cross-entropy).

    Returns:
        One role per stage (middle stages may share one).
    """
    from flopscope.distributed.pipeline import split_layers

    simulated = peak = 1
    if choice.pp > 1:
        deep = choice.pp > sum(UNIT_SMALL)
        simulated = choice.pp if deep else min(choice.microbatches, choice.pp + 2)
        peak = choice.microbatches
    sp = choice.sequence_parallel and choice.tp > 1 and choice.pp == 1
    sizes = [len(r) for r in split_layers(layers, choice.pp)]
    out = []
    for s in range(choice.pp):
        stage = s
        if 0 < s < choice.pp - 1:
            stage = next(t for t in range(1, s + 1) if sizes[t] == sizes[s])
        out.append(RoleKey(choice.tp, choice.pp, stage, choice.dp, choice.micro_batch,
                           simulated, choice.checkpoint, mixed_precision, sp,
                           loss_parallel and choice.tp > 1 and s == choice.pp - 1, loss,
                           peak if peak > simulated else 0,
                           choice.replicas, choice.keeps_gathered))
    return out
