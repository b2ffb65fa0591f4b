"""One rank of a layout that a sharding function builds, simulated as a plan's roles are.

The decoder layouts of :mod:`flopscope.plan.roles` go through
:func:`flopscope.distributed.simulate`; the data-parallel layouts of a vision model
(:mod:`flopscope.plan.vision`) and the expert-parallel layouts of a mixture of experts
(:mod:`flopscope.plan.experts`) shard the model their own way. :func:`simulate_sharded` runs such
a rank the same way: on torch's fake process group of ``world`` ranks, the model built on
``meta``, sharded by ``shard``, its shards made fake CPU tensors (the simulated ranks' shape-only
mode: :func:`flopscope.distributed.shape_only.shape_only_rank`, repeated calls answered from
memory), forward and backward from the
loss (the sum of the outputs; a decoder's cross-entropy), with the memory tracker (parameters,
buffers and inputs registered, the gradients relabelled after backward) and the roofline log
watching.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from flopscope.distributed.shape_only import fake_tree, shape_only_rank
from flopscope.distributed.simulate import count_rank, fake_world
from flopscope.estimate import CallLog, Hardware, MemoryTracker
from flopscope.plan.degrees import hardware_key
from flopscope.plan.roles import Build, RoleKey, RoleRun, local_tensor, shards
from flopscope.plan.space import Choice

__all__ = ["OneRole", "Shard", "simulate_sharded"]

#: what, besides the role key, tells two layouts' roles apart (an ``ep`` degree, ``fsdp``/``ddp``)
V = TypeVar("V", bound=Hashable)

#: shards the model in place inside the fake world (called with the model on ``meta``)
Shard = Callable[[nn.Module], None]


def simulate_sharded(build: Build, key: RoleKey, world: int, shard: Shard,
                     hardware: Hardware, loss: str = "sum") -> RoleRun:
    """Simulate rank 0 of a ``world``-rank layout that ``shard`` builds, one training step of
    ``key.micro_batch`` sequences (samples).

    Args:
        build: makes the model and its batch (:data:`~flopscope.plan.roles.Build`).
        key: the role (its micro-batch and checkpointing are used).
        world: ranks in the job.
        shard: shards the model (FSDP2, DDP, expert parallelism ...).
        hardware: the profile the roofline estimate is for.
        loss: what backward runs from (:func:`~flopscope.distributed.simulate.count_rank`).

    Returns:
        The :class:`~flopscope.plan.roles.RoleRun`.
    """
    start = time.perf_counter()
    tracker, log = MemoryTracker(), CallLog()
    with fake_world(world, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, args, kwargs = build(key.micro_batch, key.checkpoint)
        shard(model)
        with shape_only_rank(model) as mode:
            fake_args, fake_kwargs = fake_tree(mode, (args, kwargs))
            tracker.register((local_tensor(p) for p in model.parameters()), "parameters")
            tracker.register((local_tensor(b) for b in model.buffers()), "buffers")
            tracker.register(_tensors(fake_args, fake_kwargs), "inputs")
            report = count_rank(model, fake_args, fake_kwargs, backward=True, loss=loss,
                                observers=[tracker, log], warn=False)
            params = list(model.parameters())
            memory = tracker.profile(relabel={"gradients": [
                local_tensor(p.grad) for p in params if p.grad is not None]})
            parameter_bytes, tensors, dtensor, partial, partial_elements = shards(params)
        del model, params
    return RoleRun(key, report, memory, log.estimate(hardware), parameter_bytes,
                   time.perf_counter() - start, parameter_tensors=tensors,
                   parameters_dtensor=dtensor, partial_tensors=partial,
                   partial_elements=partial_elements)


class OneRole(Generic[V]):
    """Layouts whose ranks all run the same shapes (one role each), every role simulated once
    per process: the base of :class:`~flopscope.plan.experts.ExpertRoles` and
    :class:`~flopscope.plan.vision.VisionRoles`. A subclass says which role a layout has
    (:meth:`role`) and how its rank is sharded (:meth:`shard`); its roles are cached in its own
    class-level ``cache``, by (model identity, hardware, variant, role key).

    Args:
        build: makes the model (on ``meta``, train mode) and a batch (:data:`Build`).
        hardware: the profile the roofline estimate is for.
        identity: what ``build`` builds.

    Attributes:
        simulations: simulations run (cache misses).
    """

    cache: ClassVar[dict[tuple[Hashable, str, Any, RoleKey], RoleRun]]
    #: what backward runs from (a decoder's: ``"cross_entropy"``)
    loss: ClassVar[str] = "sum"

    def __init__(self, build: Build, hardware: Hardware, identity: Hashable) -> None:
        self._build = build
        self._hardware = hardware
        self._identity = identity
        self._used: set[tuple[V, RoleKey]] = set()
        self.simulations = 0

    @property
    def used(self) -> int:
        """Distinct roles asked for."""
        return len(self._used)

    def role(self, choice: Choice) -> tuple[V, RoleKey, int]:
        """The layout's role.

        Args:
            choice: a layout.

        Returns:
            ``(variant, role key, ranks in the job)``.
        """
        raise NotImplementedError

    def shard(self, variant: V, key: RoleKey) -> Shard:
        """How a rank of the role shards the model.

        Args:
            variant: the role's variant.
            key: the role.

        Returns:
            The sharding function.
        """
        raise NotImplementedError

    def runs(self, choice: Choice) -> list[RoleRun]:
        """The layout's one role, simulated on first use.

        Args:
            choice: a layout.

        Returns:
            ``[its RoleRun]``.
        """
        variant, key, world = self.role(choice)
        self._used.add((variant, key))
        full = (self._identity, hardware_key(self._hardware), variant, key)
        found = self.cache.get(full)
        if found is None:
            found = self.cache[full] = simulate_sharded(
                self._build, key, world, self.shard(variant, key), self._hardware, self.loss)
            self.simulations += 1
        return [found]

    @classmethod
    def remember(cls, identity: Hashable, hardware: Hardware, variant: V, run: RoleRun) -> None:
        """Keep a role simulated elsewhere (a worker process, a Ray task): a later
        :meth:`runs` of the same model, hardware and layout finds it.

        Args:
            identity: what the role's model is (as the class is given it).
            hardware: the profile its estimate is for.
            variant: the role's variant.
            run: the simulated role.
        """
        cls.cache[(identity, hardware_key(hardware), variant, run.key)] = run


def _tensors(args: Iterable[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    return [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
