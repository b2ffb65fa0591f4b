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
integer per call (exactly: half up, computed with 60 significant digits, so that a formula
evaluated at a size gives the same integer). Normalization (``norm="ortho"``/``"forward"``/``"backward"`` where it scales)
adds one real multiply per real output value (2 per complex element).
Reference: M. Frigo and S. G. Johnson, FFTW benchmark methodology,
http://www.fftw.org/speed/method.html.

Symbolic sizes (:mod:`flopscope.symbolic`): the count is the sympy expression
``floor(5*N*B*log(N)/log(2) + 1/2)`` (half of it for r2c/c2r), ``log(N)/log(2)`` being log2 N, made
a ``SymInt`` of the count's shape environment; evaluated at integer sizes it is the integer the
concrete rule gives (the log is irrational unless N is a power of two, so the value is never
within rounding distance of a tie).
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from math import prod
from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import per
from flopscope.rules.registry import rule

# complex matrices and transforms are counted in real operations by these rules themselves
COUNTS_REAL_NUMBERS = True


_DIGITS = Context(prec=60)


def fft_flops(points: Any, batch: Any, *, real: bool) -> Any:
    """FLOPs of ``batch`` transforms of ``points`` points: 5 N log2 N each (half for r2c/c2r),
    the total rounded half up to an integer; a ``SymInt`` formula when a size is symbolic."""
    if isinstance(points, torch.SymInt) or isinstance(batch, torch.SymInt):
        return _symbolic_fft_flops(points, batch, real)
    if points <= 1:
        return 0
    c = Fraction(5 * points * batch, 2 if real else 1)  # times log2 N
    k = points.bit_length() - 1
    if points == 1 << k:  # a power of two: log2 N = k exactly
        return int((c * k + Fraction(1, 2)) // 1)
    log2n = _DIGITS.divide(_DIGITS.ln(Decimal(points)), _DIGITS.ln(Decimal(2)))
    value = _DIGITS.multiply(_DIGITS.divide(Decimal(c.numerator), Decimal(c.denominator)), log2n)
    return int(_DIGITS.add(value, Decimal("0.5")).to_integral_value(rounding=ROUND_FLOOR))


def _symbolic_fft_flops(points: Any, batch: Any, real: bool) -> Any:
    """``floor(c*N*B*log(N)/log(2) + 1/2)`` (c = 5, or 5/2 for r2c/c2r) as a ``SymInt`` of the
    shape environment the sizes belong to, hinted with the concrete count at their hints. N = 1
    gives 0 (log 1 = 0) without a branch on the size."""
    import sympy  # type: ignore[import-untyped]

    def expr(v: Any) -> Any:
        return v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(v)

    def hint(v: Any) -> int:
        h: Any = v.node.hint if isinstance(v, torch.SymInt) else v
        return int(h)

    env: Any = (points if isinstance(points, torch.SymInt) else batch).node.shape_env
    n = expr(points)
    c = sympy.Rational(5, 2) if real else sympy.Integer(5)
    formula = sympy.floor(c * n * expr(batch) * sympy.log(n) / sympy.log(2) + sympy.Rational(1, 2))
    return env.create_symintnode(formula, hint=fft_flops(hint(points), hint(batch), real=real))


def _points(shape: torch.Size, dims: list[int]) -> Any:
    ndim = len(shape)
    return prod(shape[d % ndim] for d in dims)


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
    batch = per(x.numel(), points)
    return call.cost(flops=fft_flops(points, batch, real=False) + _norm_flops(call, norm))


@rule("aten::_fft_r2c")
def fft_r2c(call: OpCall) -> Cost:
    """Real-to-complex FFT over ``dim`` of a real signal of N points per batch element: 2.5 N log2 N
    real FLOPs (half a complex transform; a two-sided output only mirrors the conjugate half),
    + 2 per output element when normalized."""
    x, dims, norm = call.args[0], list(call.args[1]), int(call.args[2])
    points = _points(x.shape, dims)
    batch = per(x.numel(), points)
    return call.cost(flops=fft_flops(points, batch, real=True) + _norm_flops(call, norm))


@rule("aten::_fft_c2r")
def fft_c2r(call: OpCall) -> Cost:
    """Complex-to-real (inverse) FFT over ``dim`` producing a real signal of N points per batch
    element (the last transformed size is ``last_dim_size``): 2.5 N log2 N real FLOPs, + 1 per
    output element when normalized."""
    dims, norm = list(call.args[1]), int(call.args[2])
    out = call.output
    points = _points(out.shape, dims)
    batch = per(out.numel(), points)
    return call.cost(flops=fft_flops(points, batch, real=True) + _norm_flops(call, norm))
