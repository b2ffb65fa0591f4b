"""DTensor accounting for the counter.

An operator on DTensors is left to DTensor: its work on the local shards, and the collectives it
runs to redistribute, reach the counter as the rank's work. Beside that, the counter keeps

- the rank's work inside DTensor operators apart, split into operators whose DTensor arguments
  are all replicated (``Report.replicated``: every rank repeats it) and the rest;
- the logical cost of each outermost DTensor operator, costed once more at its global shapes
  (``Report.logical``: the work of the whole job, as if on one device).

This module holds that state and the DTensor-specific questions; :mod:`flopscope.core.mode` and
:mod:`flopscope.core.recorder` decide when to ask them.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils._pytree import tree_iter

from flopscope.core.ledger import Acc, Key, Sums, sums_of
from flopscope.cost import Cost

__all__ = ["DTensorLedger", "in_sharding_propagation", "is_dtensor_call"]

# tuple of tensor subclasses in a deferred call -> whether one is a DTensor
_DTENSORS: dict[tuple[type, ...], bool] = {}
_SHADOW_CODES: list[frozenset[Any]] = []


def is_dtensor_call(types: tuple[type, ...]) -> bool:
    """Whether a call left to its tensor subclasses is on DTensors (then its logical cost is
    recorded too)."""
    found = _DTENSORS.get(types)
    if found is None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # torch built without distributed
            found = False
        else:
            found = any(issubclass(t, DTensor) for t in types)
        _DTENSORS[types] = found
    return found


def _shadow_codes() -> frozenset[Any]:
    """Code objects of DTensor's sharding propagation, which runs an operator on fake tensors of
    the *global* shapes to learn its output's metadata: work no rank does."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        return frozenset()
    return frozenset({ShardingPropagator._propagate_tensor_meta_non_cached.__code__})


def in_sharding_propagation() -> bool:
    """Whether the dispatch mode calling this runs an operator for DTensor's sharding
    propagation (a few frames up from the mode's ``__torch_dispatch__``)."""
    if not _SHADOW_CODES:
        _SHADOW_CODES.append(_shadow_codes())
    codes = _SHADOW_CODES[0]
    frame = sys._getframe(2)
    # 12: the mode's __torch_dispatch__ may be wrapped (torch._disable_dynamo adds two frames)
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_code in codes:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class DTensorLedger:
    """A Counter's DTensor state: where the rank's work inside DTensor operators goes, the
    logical costs, the nesting depth and the re-entry mark (the outermost DTensor call is run
    again with the counter's mode pushed, and passed on to DTensor when it comes back)."""

    def __init__(self) -> None:
        self.sharded: Acc = {}
        self.replicated: Acc = {}
        self.logical: Acc = {}
        self.depth = 0
        self.passing = False

    def target(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Acc:
        """Where the rank's work of this outermost DTensor call goes: the replicated
        accumulator when every DTensor placement in the call is a replicate, else the sharded
        one."""
        replicated = all(p.is_replicate() for t in tree_iter((args, kwargs))
                         if isinstance(t, torch.Tensor) and hasattr(t, "placements")
                         for p in t.placements)
        return self.replicated if replicated else self.sharded

    def add_logical(self, key: Key, cost: Cost) -> None:
        """Add the logical cost of a call on DTensors (costed on the DTensors themselves, whose
        shapes are global) under ``key``."""
        found = self.logical.get(key)
        sums = self.logical[key] = Sums() if found is None else sums_of(found)
        sums.calls += 1
        sums.add(cost)
