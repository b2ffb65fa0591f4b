"""MFU's numerator: the unsharded model's forward and backward FLOPs of a training step."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from flopscope.plan.roles import Build
from flopscope.report.report import Report

__all__ = ["model_flops"]


def model_flops(build: Build, global_batch: int) -> int:
    """MFU's numerator: the unsharded model's forward + backward FLOPs for one sequence, times
    the batch (every operator's work is linear in the batch dimension); a long stack of alike
    layers counted from three small layer counts
    (:func:`flopscope.distributed.repeat.from_small`, the same report).

    Args:
        build: makes the model and a batch (:data:`~flopscope.plan.roles.Build`).
        global_batch: sequences per step.

    Returns:
        FLOPs per step.
    """
    from flopscope.distributed.repeat import NotRepeating, from_small
    from flopscope.execution.inputs import Inputs
    from flopscope.run import count

    def run(small: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]) -> Report:
        model, args, kwargs = small()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return count(model, Inputs(*args, **kwargs), backward=True, shape_only=True,
                         warn=False)

    def one() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        return build(1, "none")

    try:
        report = from_small(one, run)
    except NotRepeating:
        report = run(one)
    return int(report.flops) * global_batch
