"""Simulated ranks: PyTorch's fake process group stands in for a job of any size on one process
(no network, no devices), so one rank's program (its shards, its collectives) runs and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope.cost import Cost, Phase
from flopscope.counter import Counter
from flopscope.distributed.layout import Layout, apply_layout
from flopscope.errors import UsageError
from flopscope.report import Report
from flopscope.run import Inputs, count

__all__ = ["count_rank", "fake_world", "simulate"]


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


def count_rank(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = False,
    **counter_kwargs: Any,
) -> Report:
    """Count this rank's forward (and backward) of a sharded model: the same program on a real
    job (``torchrun``) and on a simulated rank, so the two reports compare exactly.

    Backward runs from the sum of every floating-point output that requires grad (one
    ``ones_like`` per output, as ``sum().backward()`` does).

    Args:
        model: the model, sharded (DTensor parameters, ``fully_shard``).
        args: its positional inputs (this rank's local batch).
        kwargs: its keyword inputs.
        backward: also count backward.
        **counter_kwargs: options of :class:`flopscope.Counter` (``rules``, ``strict``, ``warn``).

    Returns:
        The rank's report.
    """
    kwargs = kwargs or {}
    with Counter(model, **counter_kwargs) as counter:
        out = model(*args, **kwargs)
        if backward:
            roots = [t for t in tree_iter(out) if isinstance(t, torch.Tensor)
                     and t.is_floating_point() and t.requires_grad]
            if not roots:
                raise UsageError("backward=True, but no floating-point output requires grad")
            torch.autograd.backward([t.sum() for t in roots])
    return counter.report


@contextmanager
def _eager_collectives() -> Iterator[None]:
    """Functional collectives as in an eager job under a fake tensor mode.

    A functional collective that sees a fake tensor mode assumes it is being traced and waits at
    once (``wait_tensor`` where it is issued); eagerly it returns an ``AsyncCollectiveTensor``
    that waits where the result is first used (``_wrap_tensor_autograd``, then ``wait_tensor``
    in the consumer's module). A shape-only rank runs the eager program, so that its report
    equals a real rank's record for record.
    """
    from torch.distributed import _functional_collectives as fc

    saved = fc._are_we_tracing
    fc._are_we_tracing = torch.compiler.is_compiling
    try:
        yield
    finally:
        fc._are_we_tracing = saved


def _fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    """An input as a fake CPU tensor (a ``meta`` one too)."""
    if t.is_meta:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return mode.from_tensor(t)


def simulate(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    backward: bool = False,
    shape_only: bool = True,
    logical: bool = True,
    **count_kwargs: Any,
) -> Report:
    """Count one rank of a sharded model: build it, shard it with ``layout`` (the standard
    tensor-parallel plan and FSDP2, see :func:`~flopscope.distributed.layout.apply_layout`) on a
    fake process group of ``layout.world_size`` ranks, and count ``layout.rank``'s forward (and
    backward).

    Only the simulated rank's shards exist: memory and time do not grow with the world size
    beyond the process groups themselves. The report's ``logical`` records are those of the same
    model unsharded on the same inputs (built again with ``build``), and ``replicated`` (with
    tensor parallelism) the rank's records that equal their unsharded counterpart: work every rank
    of a tensor-parallel group does in full (embedding, norms, the head, the loss).

    Args:
        build: returns ``(model, args, kwargs)``: the model (build it on the ``meta`` device for
            large models) and the rank's own inputs (its local batch).
        layout: world size, tensor-parallel and FSDP2 degrees, the rank.
        backward: also count backward.
        shape_only: count on fake/meta tensors (no arithmetic).
        logical: also count the unsharded model for ``logical`` and ``replicated`` (about doubles
            the time).
        **count_kwargs: options of :class:`flopscope.Counter` (``rules``, ``strict``, ``warn``).

    Returns:
        The rank's :class:`~flopscope.Report` (``communication``, ``logical``, ``replicated``,
        ``rank``, ``world_size`` set).

    Raises:
        UsageError: a bad layout, or torch.distributed already initialized.
    """
    with fake_world(layout.world_size, layout.rank):
        model, args, kwargs = build()
        apply_layout(model, layout, layout.mesh())
        if not shape_only:
            report = count_rank(model, args, kwargs, backward=backward, **count_kwargs)
        else:
            # FSDP2 refuses meta parameters: the rank's shards become fake CPU tensors (no memory)
            with FakeTensorMode(allow_non_fake_inputs=True) as mode, _eager_collectives():
                model.to_empty(device="cpu")
                fake = tree_map_only(torch.Tensor, lambda t: _fake(mode, t), (args, kwargs))
                report = count_rank(model, *fake, backward=backward, **count_kwargs)
        del model
    if not logical:
        return dataclasses.replace(report, shape_only=shape_only)
    # the logical figure: the same model unsharded, on the same (local) inputs
    model, args, kwargs = build()
    whole = count(model, Inputs(*args, **kwargs), backward=backward, shape_only=shape_only,
                  warn=False)
    local: dict[tuple[str, str, Phase], Cost] = {}
    for r in report.records:
        local[(r.module, r.op, r.phase)] = local.get((r.module, r.op, r.phase), Cost()) + r.cost
    unsharded: dict[tuple[str, str, Phase], Cost] = {}
    for r in whole.records:
        key = (r.module, r.op, r.phase)
        unsharded[key] = unsharded.get(key, Cost()) + r.cost
    replicated = tuple(r for r in report.records if layout.tp > 1 and r.cost.flops
                       and local[(r.module, r.op, r.phase)] == unsharded.get((r.module, r.op, r.phase)))
    return dataclasses.replace(report, shape_only=shape_only, logical=whole.records,
                               replicated=replicated)
