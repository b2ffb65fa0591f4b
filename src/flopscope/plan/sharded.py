"""One rank of a layout that a sharding function builds, simulated as a plan's roles are.

The decoder layouts of :mod:`flopscope.plan.roles` go through
:func:`flopscope.distributed.simulate`; the data-parallel layouts of a vision model
(:mod:`flopscope.plan.vision`) and the expert-parallel layouts of a mixture of experts
(:mod:`flopscope.plan.experts`) shard the model their own way. :func:`simulate_sharded` runs such
a rank the same way: on torch's fake process group of ``world`` ranks, the model built on
``meta``, sharded by ``shard``, its shards made fake CPU tensors, forward and backward from the
sum of the outputs, with the memory tracker (parameters, buffers and inputs registered, the
gradients relabelled after backward) and the roofline log watching.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from flopscope.distributed.simulate import count_rank, fake_world
from flopscope.estimate import CallLog, Hardware, MemoryTracker
from flopscope.execution.copies import to_fake
from flopscope.execution.meta import ShapeOnlyFakeMode
from flopscope.plan.roles import Build, RoleKey, RoleRun, local_tensor

__all__ = ["Shard", "simulate_sharded"]

#: shards the model in place inside the fake world (called with the model on ``meta``)
Shard = Callable[[nn.Module], None]


def simulate_sharded(build: Build, key: RoleKey, world: int, shard: Shard,
                     hardware: Hardware) -> RoleRun:
    """Simulate rank 0 of a ``world``-rank layout that ``shard`` builds, one training step of
    ``key.micro_batch`` sequences (samples).

    Args:
        build: makes the model and its batch (:data:`~flopscope.plan.roles.Build`).
        key: the role (its micro-batch and checkpointing are used).
        world: ranks in the job.
        shard: shards the model (FSDP2, DDP, expert parallelism ...).
        hardware: the profile the roofline estimate is for.

    Returns:
        The :class:`~flopscope.plan.roles.RoleRun`.
    """
    start = time.perf_counter()
    tracker, log = MemoryTracker(), CallLog()
    with fake_world(world, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, args, kwargs = build(key.micro_batch, key.checkpoint)
        shard(model)
        with ShapeOnlyFakeMode(allow_non_fake_inputs=True) as mode:
            model.to_empty(device="cpu")
            fake_args, fake_kwargs = tree_map_only(torch.Tensor, lambda t: to_fake(mode, t),
                                                   (args, kwargs))
            tracker.register((local_tensor(p) for p in model.parameters()), "parameters")
            tracker.register((local_tensor(b) for b in model.buffers()), "buffers")
            tracker.register(_tensors(fake_args, fake_kwargs), "inputs")
            report = count_rank(model, fake_args, fake_kwargs, backward=True,
                                observers=[tracker, log], warn=False)
            params = list(model.parameters())
            memory = tracker.profile(relabel={"gradients": [
                local_tensor(p.grad) for p in params if p.grad is not None]})
            parameter_bytes = sum(local_tensor(p).untyped_storage().nbytes() for p in params)
        del model, params
    return RoleRun(key, report, memory, log.estimate(hardware), parameter_bytes,
                   time.perf_counter() - start)


def _tensors(args: Iterable[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    return [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
