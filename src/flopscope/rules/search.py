"""Searching, selecting, histograms and whole-tensor comparisons.

Convention: *locating* an element by comparisons (sorting, searching, selecting: ``sort``,
``topk``, ``kthvalue``, ``searchsorted``, ``bucketize`` in the zero-cost family, and here
``isin``, ``median``, ``nanmedian``, ``mode``) is 0 FLOPs: the number of comparisons depends on
the algorithm and the data, and none of them produces a floating-point value. Floating-point
arithmetic done along the way *is* counted: a histogram computes each element's bin from its value
(subtract the lower edge, multiply by bins / width, floor: 3 FLOPs) and accumulates a float count
or weight (1); finding the range when none is given is a min and a max (2 per element). An
element-wise comparison that produces a value (``eq``, ``lt``, ``allclose``'s test) counts 1, as
in the element-wise table. Integer work (``hash_tensor``'s bit mixing) is not FLOPs.
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg, numel
from flopscope.rules.registry import rule

BIN_INDEX_FLOPS = 3  # subtract the lower edge, multiply by bins / width, floor
ACCUMULATE_FLOPS = 1  # add 1 (or the weight) to the bin's float count
RANGE_FLOPS = 2  # min and max of the data, when no range is given


def _density_flops(bins: int, density: bool) -> int:
    """Normalizing to a density: the total (1 per bin) and count / (total * width) (2 per bin)."""
    return 3 * bins if density else 0


@rule("aten::histc")
def histc(call: OpCall) -> Cost:
    """Histogram with equal-width bins: per element the bin index (subtract, multiply, floor: 3) and
    the float count (1) = 4 FLOPs; + 2 per element (min and max) when min == max (range from the
    data). Range tests locate the element: not counted."""
    x = call.args[0]
    lo, hi = named_arg(call, "min", 0), named_arg(call, "max", 0)
    per = BIN_INDEX_FLOPS + ACCUMULATE_FLOPS + (RANGE_FLOPS if lo == hi else 0)
    return call.cost(flops=per * x.numel())


@rule("aten::bincount")
def bincount(call: OpCall) -> Cost:
    """Count each non-negative integer's occurrences: locating the bin is the value itself, and
    the count is 1 add per element (integer work, 0 FLOPs, without weights; 1 FLOP per element
    with float weights: the weight added to its bin)."""
    return call.cost(flops=ACCUMULATE_FLOPS * numel(call.args[0].shape))


@rule("aten::histogram")
def histogram(call: OpCall) -> Cost:
    """``torch.histogram``: with a bin count, as ``histc`` (4 FLOPs per element, + 2 without a
    range); with explicit edges, a binary search (0) and the accumulation (1 per element).
    ``density`` adds 3 FLOPs per bin."""
    x = call.args[0]
    bins = named_arg(call, "bins")
    hist = call.output
    if isinstance(bins, int):
        per = BIN_INDEX_FLOPS + ACCUMULATE_FLOPS
        per += RANGE_FLOPS if named_arg(call, "range") is None else 0
    else:
        per = ACCUMULATE_FLOPS
    density = bool(named_arg(call, "density", False))
    return call.cost(flops=per * x.numel() + _density_flops(hist.numel(), density))


@rule("aten::_histogramdd_bin_edges")
def histogramdd_bin_edges(call: OpCall) -> Cost:
    """Bin edges of a D-dimensional histogram: the range of each dimension from the data when none
    is given (min and max: 2 FLOPs per element of the [N, D] samples), else nothing; the evenly
    spaced edges are tensor creation (0)."""
    x = call.args[0]
    return call.cost(flops=RANGE_FLOPS * x.numel() if named_arg(call, "range") is None else 0)


@rule("aten::_histogramdd_from_bin_cts")
def histogramdd_from_bin_cts(call: OpCall) -> Cost:
    """D-dimensional histogram with equal-width bins, samples [N, D]: the bin index per coordinate
    (3 FLOPs per element) and one accumulation per sample; ``density`` adds 3 per bin."""
    x = call.args[0]
    samples = x.numel() // max(1, int(x.shape[-1]))
    density = bool(named_arg(call, "density", False))
    flops = BIN_INDEX_FLOPS * x.numel() + ACCUMULATE_FLOPS * samples
    return call.cost(flops=flops + _density_flops(call.out_numel(), density))


@rule("aten::_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(call: OpCall) -> Cost:
    """D-dimensional histogram with explicit edges: a binary search per coordinate (0) and one
    accumulation per sample; ``density`` adds 3 per bin."""
    x = call.args[0]
    samples = x.numel() // max(1, int(x.shape[-1]))
    density = bool(named_arg(call, "density", False))
    return call.cost(flops=ACCUMULATE_FLOPS * samples + _density_flops(call.out_numel(), density))


@rule("aten::isin", "aten::median", "aten::nanmedian", "aten::mode", "aten::hash_tensor")
def locate(call: OpCall) -> Cost:
    """Membership (``isin``: a brute-force or sort-based search), medians and the mode (selection),
    ``hash_tensor`` (integer bit mixing): 0 FLOPs, as ``sort`` and ``searchsorted``; bytes are
    counted. (``isin`` has a decomposition that would materialize every element x test-element
    comparison; the kernel does not.)"""
    return call.cost()


@rule("aten::allclose")
def allclose(call: OpCall) -> Cost:
    """|a - b| <= atol + rtol * |b| for every (broadcast) element, then all(): subtract, two
    absolute values, multiply, add, compare (6) + the and-reduction (1) = 7 FLOPs per element."""
    a, b = call.args[0], call.args[1]
    return call.cost(flops=7 * numel(torch.broadcast_shapes(a.shape, b.shape)))
