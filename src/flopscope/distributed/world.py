"""The fake world a simulated rank runs in: torch's fake process group standing in for a job of
any size on one process, and what DTensor caches per world forgotten when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from flopscope.distributed.layout import Layout
from flopscope.errors import UsageError

__all__ = ["fake_world", "shared_world", "world_of"]


@contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """A default process group of ``world_size`` ranks in which this process is ``rank``, backed
    by torch's fake process group (collectives return at once; nothing is sent); destroyed on exit.

    Args:
        world_size: ranks to simulate.
        rank: the rank this process plays.

    Yields:
        Nothing; ``torch.distributed`` is initialized inside the block.

    Raises:
        UsageError: a process group is already initialized.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UsageError("torch.distributed is already initialized: a simulated rank needs its own "
                         "(fake) process group; count the real job's ranks instead")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_meshes()


#: (world size, rank) of the fake world that the small runs of one simulate() share
_SHARED: list[tuple[int, int]] = []


@contextmanager
def shared_world(layout: Layout) -> Iterator[None]:
    """Let the ranks counted inside run in the fake world already made for ``layout`` (entered
    just before): DTensor's sharding decisions, cached per world, are then made once for all of
    them.

    Args:
        layout: the layout whose world is shared.

    Yields:
        Nothing.
    """
    _SHARED.append((layout.world_size, layout.rank))
    try:
        yield
    finally:
        _SHARED.pop()


@contextmanager
def world_of(layout: Layout) -> Iterator[None]:
    """The fake world of ``layout``: the shared one when it is made (:func:`shared_world`),
    else a new one (:func:`fake_world`).

    Args:
        layout: the layout.

    Yields:
        Nothing; ``torch.distributed`` is initialized inside the block.
    """
    if _SHARED and _SHARED[-1] == (layout.world_size, layout.rank):
        yield
        return
    with fake_world(layout.world_size, layout.rank):
        yield


def _forget_meshes() -> None:
    """Clear DTensor's caches keyed by device meshes.

    A mesh equals any mesh of the same shape and names, so a cached sharding decision from an
    earlier (destroyed) world would hand back that world's mesh, whose process groups no longer
    resolve (a simulated rank of another stage in the same process fails with "Could not
    resolve the process group")."""
    try:
        from torch.distributed.tensor import DTensor, _redistribute
    except ImportError:  # torch built without distributed
        return
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:  # the C++ dispatch fast path's cache
        clear_native()
    propagator = DTensor._op_dispatcher.sharding_propagator
    cached = getattr(getattr(propagator, "propagate_op_sharding", None), "cache", None)
    if cached is not None:
        cached.cache_clear()
    for name in ("_gen_transform_infos",):
        fn = getattr(_redistribute, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()
    clear = getattr(_redistribute, "clear_redistribute_planner_cache", None)
    if clear is not None:
        clear()
