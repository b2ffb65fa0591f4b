"""Spatial resampling kernels with no decomposition that counts what they do: grid sampling
(``F.grid_sample``, spatial transformers), fractional max pooling, max unpooling.

Grid sampling convention: unlike ``upsample_*`` (whose interpolation weights depend only on the
output coordinate and are shared by a whole row or column), every output location of a grid sample
has its own coordinates, so its cost has two parts:

- per output *location* (N x H_out x W_out [x D_out], shared by the C channels), for each of the
  D = 2 or 3 coordinates: unnormalize from [-1, 1] (add, multiply, subtract: 3), plus for
  bilinear/trilinear floor (1), fractional part (1) and its complement 1 - t (1); for bicubic
  floor, fraction and the 4 cubic-convolution weights (Keys, a = -0.75; 4 FLOPs each by Horner:
  16); for nearest a rounding (1). Border padding clamps the coordinate (2 compares), reflection
  reflects it (abs, fmod, compare, subtract: 4). Then the tap weights: the product of the D
  per-dimension weights for each of the 2^D taps (bilinear 4 x 1, trilinear 8 x 2);
- per output *element* (x C): the weighted sum of the taps, as in the interpolation table:
  bilinear 4 multiplies + 3 adds = 7, trilinear 15, bicubic 35, nearest 0 (a copy).

``grid_sampler_2d`` has a decomposition in ``torch._decomp``; flopscope keeps its own rule so 2d and
3d sampling are counted alike (the decomposition would also count its index and bounds-mask
arithmetic per tap). ``max_unpool2d/3d`` also decompose (into index arithmetic and an index put);
their rule keeps them what the kernel is, a scatter copy.
"""

from __future__ import annotations

from math import prod

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import rule

# interpolation_mode: 0 bilinear/trilinear, 1 nearest, 2 bicubic; padding_mode: 0 zeros, 1 border,
# 2 reflection (the integer enums of aten::grid_sampler_*).
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_PAD_FLOPS = {0: 0, 1: 2, 2: 4}


def grid_sample_flops(locations: int, channels: int, dims: int, mode: int, padding: int) -> int:
    """FLOPs of sampling ``channels`` values at ``locations`` points of a ``dims``-D grid (see
    the module docstring)."""
    taps = 1 << dims
    per_coord = 3 + _PAD_FLOPS.get(padding, 0)
    if mode == _NEAREST:
        per_coord += 1
        weights, per_element = 0, 0
    elif mode == _BICUBIC:
        per_coord += 2 + 16
        weights, per_element = 0, 35  # separable: rows of 4 taps, then 4 row results
    else:
        per_coord += 3
        weights, per_element = taps * (dims - 1), 2 * taps - 1
    per_location = dims * per_coord + weights
    return locations * per_location + locations * channels * per_element


def _grid_args(call: OpCall, first: int) -> tuple[int, int, int, int, int]:
    x, grid = call.args[first], call.args[first + 1]
    dims = grid.dim() - 2
    locations = int(prod(int(s) for s in grid.shape[:-1]))
    mode = int(call.args[first + 2])
    padding = int(call.args[first + 3])
    return locations, int(x.shape[1]), dims, mode, padding


@rule("aten::grid_sampler_2d", "aten::grid_sampler_3d", "aten::cudnn_grid_sampler")
def grid_sampler(call: OpCall) -> Cost:
    """Grid sampling of C channels at L = N x H_out x W_out (x D_out) locations, D = 2 or 3
    coordinates: per location D x (unnormalize 3 + padding 0/2/4 + mode: bilinear floor, fraction,
    1 - t = 3; nearest round = 1; bicubic floor, fraction, 4 cubic weights = 18) + tap weights
    (bilinear 4 x 1, trilinear 8 x 2); per output element the weighted taps (bilinear 7,
    trilinear 15, bicubic 35, nearest 0). Example: bilinear 2d, zeros padding: 2 x 6 + 4 = 16 per
    location + 7 per element."""
    if call.op._schema.name == "aten::cudnn_grid_sampler":
        x, grid = call.args[0], call.args[1]
        locations = int(prod(int(s) for s in grid.shape[:-1]))
        flops = grid_sample_flops(locations, int(x.shape[1]), 2, _BILINEAR, 0)
    else:
        flops = grid_sample_flops(*_grid_args(call, 0))
    return call.cost(flops=flops)


@rule("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sampler_backward(call: OpCall) -> Cost:
    """Gradient of grid sampling (per output_mask): the coordinates and tap weights are recomputed
    (the per-location part of the forward); grad_input scatters each grad_output element to its
    taps (multiply + add per tap: bilinear 8, trilinear 16, bicubic 32, nearest 1); grad_grid takes,
    per output element and tap, the value times grad (1) accumulated into the D coordinate
    gradients through the weight derivative (multiply + add each: 2D), then chains through the
    unnormalization (1 multiply per coordinate and location)."""
    locations, channels, dims, mode, padding = _grid_args(call, 1)
    mask = list(named_arg(call, "output_mask", [True, True]))
    forward_total = grid_sample_flops(locations, channels, dims, mode, padding)
    per_location = forward_total - locations * channels * _per_element(mode, dims)
    taps = 16 if mode == _BICUBIC else (1 if mode == _NEAREST else 1 << dims)
    flops = per_location
    if mask[0]:
        flops += locations * channels * (1 if mode == _NEAREST else 2 * taps)
    if len(mask) > 1 and mask[1] and mode != _NEAREST:
        flops += locations * channels * taps * (1 + 2 * dims) + locations * dims
    return call.cost(flops=flops)


def _per_element(mode: int, dims: int) -> int:
    if mode == _NEAREST:
        return 0
    if mode == _BICUBIC:
        return 35
    return 2 * (1 << dims) - 1


@rule("aten::fractional_max_pool2d", "aten::fractional_max_pool3d")
def fractional_max_pool(call: OpCall) -> Cost:
    """Fractional max pooling with a k-element window (``kernel_size``) at pseudo-random window
    starts: k compares per output element, as max pooling (the window starts, computed from the
    random samples with a multiply and a floor per output row/column, are index arithmetic and
    not counted)."""
    window = int(prod(int(k) for k in call.args[1]))
    return call.cost(flops=window * call.out_numel())


@rule("aten::fractional_max_pool2d_backward", "aten::fractional_max_pool3d_backward",
      "aten::max_unpool2d", "aten::max_unpool3d")
def scatter_to_argmax(call: OpCall) -> Cost:
    """Max-unpooling (zeros, then each input element written at its saved index) and the
    fractional-max-pool gradient (each grad_output element added at its argmax): 0 FLOPs for the
    unpooling (a scatter copy), 1 FLOP per grad_output element for the gradient (an add), as
    ``max_pool2d_with_indices_backward``."""
    if call.op._schema.name.startswith("aten::max_unpool"):
        return call.cost()
    return call.cost(flops=call.args[0].numel())
