"""torchvision's operators (``torchvision::``): non-maximum suppression and region pooling, as the
detection models run them, and deformable convolution.

Non-maximum suppression is data-dependent (how many pairs are compared depends on which boxes
are suppressed along the way); it is counted as its worst case, every pair compared once. Region
pooling with an adaptive sampling grid (``sampling_ratio <= 0``) reads the boxes when they are
real; on fake or meta tensors, one sample per bin is assumed (a lower bound).
"""

from __future__ import annotations

import math

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import has_values, named_arg
from flopscope.rules.registry import rule


@rule("torchvision::nms")
def nms(call: OpCall) -> Cost:
    """Non-maximum suppression of N boxes: box areas, (x2 - x1) * (y2 - y1), 3 FLOPs per box; then,
    in score order, each kept box against every later one: the intersection's corners (4 max/min),
    its width and height (2 subtracts, 2 clamps), their product (1), the union (2 adds), the IoU
    (1 divide), the threshold compare (1): 13 FLOPs per pair, counted for the worst case of all
    N(N-1)/2 pairs (the pairs actually compared depend on the suppressions). The score sort is a
    search (0 FLOPs)."""
    n = int(call.args[0].shape[0])
    return call.cost(flops=3 * n + 13 * (n * (n - 1) // 2))


def _samples_per_bin(call: OpCall, rois: torch.Tensor, ph: int, pw: int, ratio: int) -> int:
    """Total sampling points over all bins of all boxes: ratio^2 per bin when ``ratio > 0``;
    otherwise ceil(roi_h / ph) * ceil(roi_w / pw) per bin (torchvision's adaptive grid), read from
    the boxes when they are real, else 1 per bin."""
    k = int(rois.shape[0])
    if ratio > 0:
        return k * ph * pw * ratio * ratio
    if not has_values(rois):
        return k * ph * pw
    scale = float(call.args[2])
    aligned = bool(named_arg(call, "aligned", False))
    total = 0
    for box in rois.detach().reshape(k, -1).tolist():
        x1, y1, x2, y2 = (v * scale for v in box[-4:])
        w, h = x2 - x1, y2 - y1
        if not aligned:
            w, h = max(w, 1.0), max(h, 1.0)
        total += max(1, math.ceil(h / ph)) * max(1, math.ceil(w / pw)) * ph * pw
    return total


@rule("torchvision::roi_align", "torchvision::ps_roi_align")
def roi_align(call: OpCall) -> Cost:
    """RoIAlign: each output bin (per channel) averages bilinear samples of the feature map: per
    sample 4 weights times 4 corners and 3 adds (7 FLOPs) and 1 add into the bin's sum; 1 divide
    per output element. Samples per bin: ``sampling_ratio``^2, or the adaptive grid (see
    ``_samples_per_bin``). The sample positions and weights (per bin, shared by the channels)
    are not counted. Position-sensitive RoIAlign has C/(ph*pw) output channels."""
    rois = call.args[1]
    ph, pw, ratio = int(call.args[3]), int(call.args[4]), int(call.args[5])
    out = call.output
    channels = int(out.shape[1])
    samples = _samples_per_bin(call, rois, ph, pw, ratio)
    return call.cost(flops=8 * samples * channels + int(out.numel()))


@rule("torchvision::roi_pool", "torchvision::ps_roi_pool")
def roi_pool(call: OpCall) -> Cost:
    """RoI max (or, position-sensitive, average) pooling: one compare (add) per feature element
    in each bin; the bins' extents depend on the boxes, so this counts 1 FLOP per output element
    (a lower bound: a bin of one element)."""
    return call.cost(flops=int(call.output.numel()))


@rule("torchvision::deform_conv2d")
def deform_conv2d(call: OpCall) -> Cost:
    """Deformable convolution: the convolution's MACs (N * out_spatial * C_out * C_in/groups *
    kh * kw), + one bilinear sample per (input channel, kernel tap, output position): 7 FLOPs
    (4 products, 3 adds), + 1 multiply by the mask per sample when ``use_mask``, + 1 add per
    output element for the bias."""
    x, w = call.args[0], call.args[1]
    out = call.output
    n, c_in = int(x.shape[0]), int(x.shape[1])
    spatial = int(out.shape[2]) * int(out.shape[3])
    taps = int(w.shape[2]) * int(w.shape[3])
    macs = n * spatial * int(w.shape[0]) * int(w.shape[1]) * taps
    samples = n * c_in * taps * spatial
    use_mask = bool(call.args[13]) if len(call.args) > 13 else False
    flops = 2 * macs + samples * (7 + int(use_mask)) + int(out.numel())
    return call.cost(macs=macs, flops=flops)
