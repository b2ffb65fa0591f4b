"""FSDP2's units of a sharded model: ``fully_shard`` on every repeated block and the root, and,
for DDP simulated with FSDP2's hybrid sharding over shards of one, on each module outside the
blocks that holds parameters.

FSDP2 over a shard of one still copies each unit's parameters into a buffer of their own when
the unit runs (its "all-gather"), and keeps the root unit's copy from forward to backward.
torch's ``DistributedDataParallel`` computes on the parameters themselves. Giving every module
outside the blocks that holds parameters (an embedding, a final norm, a head, a stem) a unit of
its own frees its copy after its forward, as a block's is, so that no copy of them is held
through the step; their gradients are all-reduced unit by unit, as a block's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

__all__ = ["fully_shard_units", "outside_units"]


def fully_shard_units(model: nn.Module, blocks: Sequence[nn.Module], mesh: Any, *,
                      replicate: bool = False, keep_gathered: bool = False,
                      mp_policy: Any = None) -> None:
    """``fully_shard`` every block, then (with ``replicate``) every :func:`outside_units`
    module, then the root, all over ``mesh`` with the same options.

    Args:
        model: the model (or a pipeline stage).
        blocks: its repeated blocks (decoder layers, residual blocks).
        mesh: the data-parallel mesh (with ``replicate``, FSDP2's hybrid pair of ``dp``
            replicas of a shard of one).
        replicate: the mesh is DDP's replicas.
        keep_gathered: keep each unit's gathered parameters from its forward to its backward
            (``reshard_after_forward=False``).
        mp_policy: FSDP2's :class:`~torch.distributed.fsdp.MixedPrecisionPolicy`, or ``None``.
    """
    from torch.distributed.fsdp import fully_shard

    options: dict[str, Any] = {} if mp_policy is None else {"mp_policy": mp_policy}
    if keep_gathered:
        options["reshard_after_forward"] = False
    for block in blocks:
        fully_shard(block, mesh=mesh, **options)
    for unit in outside_units(model, blocks) if replicate else ():
        fully_shard(unit, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)


def outside_units(model: nn.Module, blocks: Iterable[nn.Module]) -> list[nn.Module]:
    """The modules of ``model`` outside ``blocks`` (and not ``model`` itself) that hold
    parameters of their own, children before their parents (the order ``fully_shard`` takes
    nested units in). A module with a parameter that another module holds too (a head tied to
    the embedding) is left to the root's unit.

    Args:
        model: the model (or a pipeline stage).
        blocks: the modules wrapped one by one (decoder layers, residual blocks).

    Returns:
        The modules, in reverse model order.
    """
    inside = {id(m) for b in blocks for m in b.modules()}
    held = [(m, list(m.parameters(recurse=False))) for m in model.modules()
            if m is not model and id(m) not in inside]
    owners = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    return [m for m, own in reversed(held) if own and all(owners[id(p)] == 1 for p in own)]
