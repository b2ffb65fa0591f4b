"""The host time of PyTorch's parallelism frameworks, measured for a calibration
(:func:`framework_costs`): what DTensor spends per operator on DTensors (and per point-wise
operator on like-sharded DTensors) and FSDP2 per collective, in Python, beyond the operators they
run.

Eager tensor parallelism runs every operator on a sharded weight through DTensor's dispatch
(sharding propagation, redistribution decisions, wrapping the local result), and FSDP2 runs
hooks around every sharded module (gathering, registering and freeing the unsharded parameters,
reducing the gradients). Neither is an operator, so the per-operator host times of a calibration
do not see them; on this machine they cost about 75 us per DTensor operator of a tensor-parallel
block, 11 us per point-wise operator on like-sharded DTensors (an optimizer's update on FSDP2's or
TP's shards: DTensor reuses the sharding it propagated for the same placements) and 0.3 ms per
FSDP2 collective, more than the local work of a small model's layers. They are measured on
tiny tensors, whose arithmetic is negligible, on a fake process group of 2 ranks (no
communication), each the time of some work on DTensors less that of the same work on the local
tensors, over the number of DTensor operators it ran (seen by :class:`~flopscope.Counter`'s
``on_dtensor_call``) or of FSDP2's collectives (counted by
:class:`torch.distributed.tensor.debug.CommDebugMode`):

- point-wise: AdamW's for-loop operators (``mul_``, ``lerp_``, ``addcmul_``, ``sqrt``,
  ``add_``, ``addcdiv_``) over 8 parameters sharded alike;
- any other operator: 8 blocks of two linear layers, colwise then rowwise parallel, forward and
  backward, against the same layers at the local widths, less the blocks' point-wise operators
  at the point-wise figure;
- FSDP2: the same blocks, each and the whole sharded, forward and backward, against the
  unsharded blocks.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["framework_costs"]

_BLOCKS, _WIDTH = 8, 16


def _blocks(middle: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(_WIDTH, middle), nn.ReLU(),
                                         nn.Linear(middle, _WIDTH)) for _ in range(_BLOCKS)])


def _time_s(step: Callable[[], object], now: Callable[[], float], samples: int) -> float:
    """The median time of ``step`` over ``samples`` runs after 3 warm-up runs."""
    for _ in range(3):
        step()
    times = []
    for _ in range(samples):
        start = now()
        step()
        times.append(now() - start)
    return statistics.median(times)


def _step_s(model: nn.Module, x: torch.Tensor, now: Callable[[], float], samples: int) -> float:
    return _time_s(lambda: model(x).sum().backward(), now, samples)


class _DTensorCalls:
    def __init__(self) -> None:
        self.calls = self.pointwise = 0

    def on_call(self, *_: Any) -> None:
        pass

    def on_dtensor_call(self, path: str, phase: Any, op: str, pointwise: bool) -> None:
        self.calls += 1
        self.pointwise += pointwise


def _update(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
            ms: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]) -> None:
    """AdamW's for-loop operators, once per parameter (their constants are immaterial)."""
    for p, g, m, v in zip(params, grads, ms, vs, strict=True):
        p.mul_(0.99)
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m, v.sqrt().add_(1e-8), value=-1e-3)


def framework_costs(now: Callable[[], float], *,
                    samples: int = 21) -> tuple[float, float, float]:
    """(DTensor's host seconds per operator on DTensors, the same per point-wise operator on
    like-sharded DTensors, FSDP2's host seconds per all-gather or reduce-scatter), each beyond
    the operators it runs (see the module docstring).

    Args:
        now: the calibration's clock (:func:`flopscope.estimate.timers.clock`).
        samples: timed steps of each model.

    Returns:
        The three costs; ``(0.0, 0.0, 0.0)`` where they cannot be measured here: without
        ``torch.distributed``, or inside a process group already initialised (a fake one would
        replace it).
    """
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return 0.0, 0.0, 0.0
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from flopscope.core.counter import Counter
    from flopscope.distributed.world import fake_world
    from flopscope.run import count

    with fake_world(2, 0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mesh = init_device_mesh("cpu", (2,))
            x = torch.randn(4, _WIDTH, generator=torch.Generator().manual_seed(0))
            plain, local = _blocks(_WIDTH), _blocks(_WIDTH // 2)
            tp, fsdp = _blocks(_WIDTH), _blocks(_WIDTH)
            for block in tp:
                parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            for block in fsdp:
                fully_shard(block, mesh=mesh)
            fully_shard(fsdp, mesh=mesh)
            shards = [[distribute_tensor(torch.randn(8, _WIDTH), mesh, [Shard(0)])
                       for _ in range(_BLOCKS)] for _ in range(4)]
            locals_ = [[t.to_local() for t in ts] for ts in shards]
            seen, updates = _DTensorCalls(), _DTensorCalls()
            count(tp, x, backward=True, observers=[seen], warn=False)
            with Counter(observers=[updates]):
                _update(*shards)
            with CommDebugMode() as comm:
                fsdp(x).sum().backward()
            collectives = sum(n for op, n in comm.get_comm_counts().items()
                              if "gather" in str(op) or "reduce_scatter" in str(op))
            local_s, tp_s = _step_s(local, x, now, samples), _step_s(tp, x, now, samples)
            plain_s, fsdp_s = _step_s(plain, x, now, samples), _step_s(fsdp, x, now, samples)
            sharded_s = _time_s(lambda: _update(*shards), now, samples)
            unsharded_s = _time_s(lambda: _update(*locals_), now, samples)
    pointwise = (max(sharded_s - unsharded_s, 0.0) / updates.calls
                 if updates.calls == updates.pointwise > 0 else 0.0)
    others = seen.calls - seen.pointwise
    dtensor = (max(tp_s - local_s - seen.pointwise * pointwise, 0.0) / others
               if others else 0.0)
    per_collective = max(fsdp_s - plain_s, 0.0) / collectives if collectives else 0.0
    return dtensor, pointwise, per_collective
