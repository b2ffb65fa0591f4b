"""Fast Fourier transforms (``torch.fft.*``, ``stft``/``istft``), at the three ATen kernels they
all reach: ``_fft_r2c`` (real to complex), ``_fft_c2c`` (complex to complex) and ``_fft_c2r``
(complex to real). PyTorch has no decomposition for them.

Convention (the usual one, used by FFTW's benchmarks and most FFT literature): a complex transform
of N points costs 5 N log2 N real FLOPs (radix-2 Cooley-Tukey: (N/2) log2 N butterflies of one
complex multiply (6 real FLOPs) and two complex adds (4)); a transform whose input or output is
real (r2c, c2r) costs half of that, 2.5 N log2 N, N being the length of the real signal. A
transform over several dimensions of sizes N_1..N_k costs what one transform of N = N_1 * ... * N_k
points does (sum_i (N / N_i) * 5 N_i log2 N_i = 5 N log2 N), and is repeated for every batch
element. Non-power-of-two sizes use the same formula with the real log2, rounded to the nearest
integer per call. Normalization (``norm="ortho"``/``"forward"``/``"backward"`` where it scales)
adds one real multiply per real output value (2 per complex element).
Reference: M. Frigo and S. G. Johnson, FFTW benchmark methodology,
http://www.fftw.org/speed/method.html.
"""

from __future__ import annotations

from math import log2, prod

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules.registry import rule

# complex matrices and transforms are counted in real operations by these rules themselves
COUNTS_REAL_NUMBERS = True


def fft_flops(points: int, batch: int, *, real: bool) -> int:
    """FLOPs of ``batch`` transforms of ``points`` points: 5 N log2 N each (half for r2c/c2r)."""
    if points <= 1:
        return 0
    per = 5 * points * log2(points) * batch
    return round(per / 2) if real else round(per)


def _points(shape: torch.Size, dims: list[int]) -> int:
    ndim = len(shape)
    return int(prod(int(shape[d % ndim]) for d in dims))


def _norm_flops(call: OpCall, normalization: int) -> int:
    """One multiply per real output value when the transform scales (normalization != 0)."""
    if not normalization:
        return 0
    out = call.output
    return out.numel() * (2 if out.is_complex() else 1)


@rule("aten::_fft_c2c")
def fft_c2c(call: OpCall) -> Cost:
    """Complex-to-complex FFT over ``dim`` (sizes N_1..N_k, N = their product): 5 N log2 N real
    FLOPs per batch element (batch = input elements / N), + 2 per output element when normalized."""
    x, dims, norm = call.args[0], list(call.args[1]), int(call.args[2])
    points = _points(x.shape, dims)
    batch = x.numel() // points if points else 0
    return call.cost(flops=fft_flops(points, batch, real=False) + _norm_flops(call, norm))


@rule("aten::_fft_r2c")
def fft_r2c(call: OpCall) -> Cost:
    """Real-to-complex FFT over ``dim`` of a real signal of N points per batch element: 2.5 N log2 N
    real FLOPs (half a complex transform; a two-sided output only mirrors the conjugate half),
    + 2 per output element when normalized."""
    x, dims, norm = call.args[0], list(call.args[1]), int(call.args[2])
    points = _points(x.shape, dims)
    batch = x.numel() // points if points else 0
    return call.cost(flops=fft_flops(points, batch, real=True) + _norm_flops(call, norm))


@rule("aten::_fft_c2r")
def fft_c2r(call: OpCall) -> Cost:
    """Complex-to-real (inverse) FFT over ``dim`` producing a real signal of N points per batch
    element (the last transformed size is ``last_dim_size``): 2.5 N log2 N real FLOPs, + 1 per
    output element when normalized."""
    dims, norm = list(call.args[1]), int(call.args[2])
    out = call.output
    points = _points(out.shape, dims)
    batch = out.numel() // points if points else 0
    return call.cost(flops=fft_flops(points, batch, real=True) + _norm_flops(call, norm))
