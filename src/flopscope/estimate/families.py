"""Operator families of the prediction (:data:`~.calibration.FAMILIES`): which family a call
is in, what its work is (FLOPs or bytes), and where it sits among its family's calibration points
(the interpolation's coordinates). :mod:`flopscope.estimate.predict` predicts by them;
:mod:`flopscope.estimate.calibrate` and :mod:`flopscope.estimate.chains` record points by them.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from flopscope.estimate.calibration import DTENSOR_DISPATCH, DTENSOR_POINTWISE
from flopscope.estimate.call_record import is_convolution

if TYPE_CHECKING:
    from flopscope.estimate.call_record import CallRecord

__all__ = ["COMPUTE_FAMILIES", "ROTATED_FAMILIES", "SHAPED_FAMILIES", "WORK_IN_FLOPS", "coords",
           "family", "family_of", "reduction_length", "work"]

COMPUTE_FAMILIES = ("matmul", "conv", "attention")
"""Families whose work is FLOPs (the others' is bytes)."""

_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean",
               "prod", "argmax", "argmin", "logsumexp", "linalg_vector_norm", "norm", "cumsum",
               "any", "all", "_foreach_norm", "nansum", "aminmax"}


def family_of(op: str, macs: int, flops: int, nbytes: int, special: bool,
              convolution: bool) -> str:
    """The family of an operator call (:data:`~.calibration.FAMILIES`), from its report name
    and counts.

    Args:
        op: the report name (``"aten.addmm.default"``).
        macs: its MACs.
        flops: its FLOPs.
        nbytes: its bytes read plus written.
        special: whether it evaluates a special function.
        convolution: whether it is a convolution (forward or backward).

    Returns:
        The family.
    """
    return _family(op, flops == 0 and nbytes == 0, macs > 0, special, convolution)


@functools.cache
def _family(op: str, moves_nothing: bool, products: bool, special: bool,
            convolution: bool) -> str:
    """:func:`family_of` from what it reads of the counts (kept: every call's record asks)."""
    base = op.split(".")[1] if op.count(".") >= 1 else op
    if moves_nothing:
        return "framework" if op in (DTENSOR_DISPATCH, DTENSOR_POINTWISE) else "view"
    if "attention" in base:
        return "attention"
    if convolution:
        return "conv"
    if products:
        return "matmul"
    if special:
        return "special"
    if "norm" in base and base not in _REDUCTIONS and "linalg" not in base:
        return "normalization"
    if "pool" in base:
        return "pooling"
    if base.removesuffix("_") in _REDUCTIONS or base.removesuffix("_backward") in _REDUCTIONS:
        return "reduction"
    return "elementwise"


def family(rec: CallRecord) -> str:
    """The family of a recorded call (:func:`family_of`).

    Args:
        rec: the call's record.

    Returns:
        The family.
    """
    return family_of(rec.op, rec.macs, rec.flops, rec.bytes, rec.special is not None,
                     is_convolution(rec.op))


ROTATED_FAMILIES = (*COMPUTE_FAMILIES, "pooling")
"""Families whose calibration points are timed in rotation with their group's other calls
(:func:`flopscope.estimate.timers.time_in_rotation`): a model's layers evict each other's
code, kernel descriptors and weights, so these points include what that costs, and their
calls' host time does not grow again with the bytes moved before them."""

WORK_IN_FLOPS = (*COMPUTE_FAMILIES, "pooling")
"""Families whose work is FLOPs, and whose rate is interpolated in (log work, log intensity):
the compute families, and pooling (one operation per element of each output's window: a
stride-1 3x3 max pooling does four times a stride-2 one's over the same bytes, and the window's
size and stride, which set the intensity, change the rate per operation by 2x here)."""


def work(fam: str, flops: int, nbytes: int) -> float:
    """A call's work: its FLOPs for :data:`WORK_IN_FLOPS`, else its bytes."""
    return float(flops if fam in WORK_IN_FLOPS else nbytes)


SHAPED_FAMILIES = (*WORK_IN_FLOPS, "normalization")
"""Families whose rate is interpolated in (log work, log intensity) and not log work alone:
the compute families and pooling, and normalisation (a training-mode batch norm computes its
statistics, three times an eval-mode one's FLOPs per byte, at a different rate)."""


def reduction_length(rec: CallRecord) -> float:
    """MACs per output element of a call: a product's K, a convolution's input channels per
    group times its window (a depthwise 3x3 convolution's 9, a dense one's 9 x channels);
    0 for calls without MACs or whose output is not new.

    Args:
        rec: the call's record.

    Returns:
        The length.
    """
    if not rec.macs or not rec.bytes_written or rec.dtype is None:
        return 0.0
    return rec.macs / max(rec.bytes_written / rec.dtype.itemsize, 1.0)


def coords(fam: str, flops: int, nbytes: int, reduction: float = 0.0) -> tuple[float, ...]:
    """The interpolation's coordinates: log work; then, for :data:`SHAPED_FAMILIES`, log
    intensity; then, for the compute families when known, log reduction length (a depthwise
    and a dense convolution of one size and intensity differ in it)."""
    amount = work(fam, flops, nbytes)
    if fam in SHAPED_FAMILIES:
        intensity = flops / nbytes if nbytes else 1.0
        at = (math.log10(amount), math.log10(max(intensity, 1e-6)))
        if reduction > 0 and fam in COMPUTE_FAMILIES:
            return (*at, math.log10(reduction))
        return at
    return (math.log10(amount),)
