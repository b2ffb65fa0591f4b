"""What a training step does after its microbatches' backwards, counted by running it: the
optimizer's update of a rank's parameter shards, and the gradients' accumulation between the
microbatches of a layout without stages.

A rank's roles are simulated forward and backward (:mod:`flopscope.plan.roles`); what follows
is counted here by running torch's own code on fake tensors:

- **the update** (:func:`update_estimate`): torch's ``AdamW`` (the plan's optimizer), its
  second ``step()`` (the first makes the moments), in the implementation torch picks for the
  planned device: ``foreach`` on a GPU (each operator once over the list of shards) and the
  for-loop on a CPU (``AdamW``'s default where the parameters are not on a GPU: each
  operator once per parameter); both move 84 bytes per float32 element
  (``tests/plan/test_update.py`` has the arithmetic). ``foreach`` is counted over one flat
  tensor of the rank's shards: its calls are one per operator whatever the shards. It also
  reads each parameter's step counter twice (``item()``: the bias corrections), a CPU scalar
  in torch's default ``AdamW``, so host work without a launch that a GPU profile's host times
  (each a launched call's) would overprice: those are left out (not measured on a GPU). On
  DTensor parameters (tensor parallelism, FSDP2) the update runs on DTensors, whose
  outermost calls a calibrated profile gives DTensor's host time (its element-wise operators:
  :func:`flopscope.estimate.framework.framework_costs`' point-wise figure);
- **the accumulation** (:func:`accumulation_estimate`): autograd stores the first
  microbatch's gradient of each parameter and adds each later one in place (FSDP2 adds the
  reduced shard to the local tensor of the sharded gradient: no DTensor dispatch; tensor
  parallelism without FSDP2 adds its DTensor gradients through DTensor's dispatch), ``m - 1``
  in-place adds of each gradient shard a step. A pipeline stage's are in its simulated
  microbatches already (:func:`flopscope.plan.reference.accumulated`).

The for-loop update and the accumulation are counted over ``tensors`` shards of ``elements``
in all without making a tensor per shard (a 70B rank holds hundreds): the calls over one flat
tensor of every element, plus ``tensors - 1`` times what one more shard adds at the same
elements (two shards of one element each, less one shard of two, both counted): its calls,
and their bytes beyond the elements' (a step counter's). Each call is affine in the number of
shards at a fixed size, so the calls and bytes are exact. Their time is approximate: a
for-loop's call takes its own shard's time, and shards differ in size (a norm's weight, a
projection's); here every element is timed in the flat tensor's calls (streamed, as most of a
large model's shards are) and each further shard's calls at the smallest size (their host
time, and a tiny call's device time).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from flopscope.estimate import Estimate, Hardware
from flopscope.estimate.bound import Row
from flopscope.plan.degrees import hardware_key
from flopscope.plan.reference import lin
from flopscope.report.records import CommRecord

__all__ = ["accumulation_estimate", "foreach", "update_collectives", "update_estimate"]

#: estimates by (what, shard sizes, dtype, foreach, DTensors, profile): they depend on nothing
#: else
_CACHE: dict[tuple[str, tuple[int, ...], torch.dtype, bool, bool, str], Estimate] = {}


def foreach(hardware: Hardware) -> bool:
    """Whether ``AdamW`` runs its ``foreach`` implementation on ``hardware``: torch's default
    where the parameters are on a GPU; the for-loop on a CPU, which a profile says by its
    calibration's device or by being measured here (``this-machine``) without one. (A
    datasheet CPU profile without a calibration is taken as ``foreach``: at its bound, the only
    time it gives, both move the same bytes.)

    Args:
        hardware: the planned device.

    Returns:
        ``True`` for ``foreach``.
    """
    cal = hardware.calibration
    if cal is not None:
        return cal.device.startswith("cuda")
    return not hardware.measured


def update_estimate(elements: int, dtype: torch.dtype, hardware: Hardware,
                    tensors: int = 1, dtensor: bool = False) -> Estimate:
    """AdamW's update of ``tensors`` parameter shards of ``elements`` in all, counted (one flat
    tensor where the implementation is ``foreach``: the module docstring).

    Args:
        elements: the rank's parameter shards' elements.
        dtype: the parameters' dtype (and their gradients' and moments').
        hardware: the profile the calls are timed on; it also picks the implementation
            (:func:`foreach`).
        tensors: the rank's parameter shards (each parameter is one, sharded or not).
        dtensor: the parameters are DTensors (tensor parallelism, FSDP2): each call on them
            passes DTensor's dispatch, counted (its host time where the profile measured it).

    Returns:
        The :class:`~flopscope.estimate.Estimate` of the second ``step()`` (phase
        ``optimizer``; its total, phases and hardware only).
    """
    return _over_shards("update", elements, tensors, dtype, hardware, dtensor)


def update_collectives(tensors: int, elements: int, dtype: torch.dtype, hardware: Hardware,
                       group_size: int) -> tuple[CommRecord, ...]:
    """The collectives of AdamW's update over ``tensors`` replicated parameters whose
    gradients are partial (:func:`flopscope.plan.roles.shards`: sequence parallelism's norms),
    counted: nothing reduces such a gradient before the optimizer, and each of AdamW's
    operators that reads it with the replicated moments all-reduces it over the
    tensor-parallel group (torch's DTensor: three per parameter in ``AdamW``'s for-loop and in
    ``foreach``, each of the whole gradient).

    Counted by running the update's second ``step()`` on one such parameter of ``elements``
    on a fake group of two; the calls are per parameter (``tensors`` x that parameter's: a
    call's count does not depend on its size), the payload per element (one parameter of
    every element: exact, each call moves its own gradient).

    Args:
        tensors: the parameters with partial gradients.
        elements: their gradients' elements, in all.
        dtype: the gradients' dtype.
        hardware: the profile (it picks the implementation: :func:`foreach`).
        group_size: the tensor-parallel degree the gradients are partial over.

    Returns:
        The records (group ``tp``, phase ``optimizer``, bus bytes at ``group_size``); none
        without such parameters.
    """
    from flopscope.rules.collectives import BUS_FACTORS

    if tensors <= 0 or elements <= 0 or group_size <= 1:
        return ()
    out = []
    for r in _partial_update(elements, dtype, foreach(hardware)):
        out.append(CommRecord("", r.phase, r.kind, group_size, r.calls * tensors,
                              r.payload_bytes,
                              int(r.payload_bytes * BUS_FACTORS[r.kind](group_size)), "tp"))
    return tuple(out)


_PARTIAL: dict[tuple[int, torch.dtype, bool], tuple[CommRecord, ...]] = {}


def _partial_update(elements: int, dtype: torch.dtype, many: bool) -> tuple[CommRecord, ...]:
    """The communication of AdamW's second step on one replicated DTensor parameter of
    ``elements`` with a partial gradient, on a fake group of two (sorted by kind)."""
    key = (elements, dtype, many)
    found = _PARTIAL.get(key)
    if found is not None:
        return found
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, Partial, Replicate

    with _world() as mesh, FakeTensorMode():
        p = torch.nn.Parameter(DTensor.from_local(torch.empty(elements, dtype=dtype), mesh,
                                                  [Replicate()], run_check=False))
        p.grad = DTensor.from_local(torch.empty(elements, dtype=dtype), mesh, [Partial()],
                                    run_check=False)
        counter = _second_step([p], many)
        found = tuple(sorted(counter.report.communication, key=lambda r: r.kind))
    _PARTIAL[key] = found
    return found


def _second_step(params: list[torch.nn.Parameter], many: bool,
                 observers: tuple[Any, ...] = ()) -> Any:
    """AdamW's second ``step()`` over ``params`` (their gradients set), counted: the first
    makes the moments, not a step's work. Returns the :class:`~flopscope.core.counter.Counter`."""
    from flopscope.core.counter import Counter

    opt = torch.optim.AdamW(params, foreach=many)
    opt.step()
    with Counter(warn=False, observers=list(observers)) as counter:
        opt.step()
    return counter


def accumulation_estimate(elements: int, dtype: torch.dtype, hardware: Hardware,
                          tensors: int = 1, dtensor: bool = False) -> Estimate:
    """One microbatch's gradients added in place into the accumulated ones, one ``add_`` per
    shard, counted.

    Args:
        elements: the rank's gradient shards' elements.
        dtype: the gradients' dtype.
        hardware: the profile the calls are timed on.
        tensors: the rank's gradient shards.
        dtensor: the gradients are DTensors.

    Returns:
        The :class:`~flopscope.estimate.Estimate` of the ``add_`` calls.
    """
    return _over_shards("accumulation", elements, tensors, dtype, hardware, dtensor)


def _over_shards(what: str, elements: int, tensors: int, dtype: torch.dtype,
                 hardware: Hardware, dtensor: bool) -> Estimate:
    """The flat tensor's calls plus ``tensors - 1`` times one more shard's (module docstring)."""
    flat = _counted(what, (elements,), dtype, hardware, dtensor)
    if tensors <= 1 or (what == "update" and foreach(hardware)):
        return flat
    more = _counted(what, (1, 1), dtype, hardware, dtensor)
    less = _counted(what, (2,), dtype, hardware, dtensor)
    n = tensors - 1

    def row(f: Row, m: Row, s: Row) -> Row:
        return lin([(1, f), (n, m), (-n, s)])

    phases = {p: row(*(e.by_phase.get(p, Row()) for e in (flat, more, less)))
              for p in {*flat.by_phase, *more.by_phase, *less.by_phase}}
    return Estimate(flat.hardware, flat.tf32, row(flat.total, more.total, less.total), phases,
                    tf32_convolution=flat.tf32_convolution)


def _counted(what: str, sizes: tuple[int, ...], dtype: torch.dtype, hardware: Hardware,
             dtensor: bool) -> Estimate:
    many = what == "update" and foreach(hardware)
    key = (what, sizes, dtype, many, dtensor, hardware_key(hardware))
    found = _CACHE.get(key)
    if found is None:
        if not dtensor:
            found = _run(what, sizes, dtype, hardware, many, None)
        else:
            with _world() as mesh:
                found = _run(what, sizes, dtype, hardware, many, mesh)
        _CACHE[key] = found
    return found


@contextmanager
def _world() -> Iterator[Any]:
    """A one-dimensional device mesh over the process group in place, or over a fake one of
    two ranks (the shards' placement changes no local call)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from flopscope.distributed.world import fake_world

    if dist.is_initialized():
        yield init_device_mesh("cpu", (dist.get_world_size(),))
        return
    with fake_world(2, 0):
        yield init_device_mesh("cpu", (2,))


def _run(what: str, sizes: tuple[int, ...], dtype: torch.dtype, hardware: Hardware,
         many: bool, mesh: Any) -> Estimate:
    """The calls counted on fake tensors of ``sizes`` (DTensor shards on ``mesh``, if any)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, Shard

    from flopscope.core.counter import Counter
    from flopscope.estimate.roofline import CallLog

    def make(n: int) -> torch.Tensor:
        t = torch.empty(n, dtype=dtype)
        return t if mesh is None else DTensor.from_local(t, mesh, [Shard(0)], run_check=False)

    log = CallLog()
    with FakeTensorMode():
        params = [torch.nn.Parameter(make(n)) for n in sizes]
        grads = [make(n) for n in sizes]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if what == "update":
            _second_step(params, many, (log,))
        else:
            more = [make(n) for n in sizes]
            with Counter(warn=False, observers=[log]):
                for g, m in zip(grads, more, strict=True):
                    g.add_(m)
    return log.estimate(hardware)
