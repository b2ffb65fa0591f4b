"""Special functions: one evaluation = 1 FLOP per output element, as exp or lgamma."""

from __future__ import annotations

import torch

from rules._util import count, op


def test_special_functions_are_one_flop_per_element() -> None:
    x = torch.rand(3, 4) + 0.5
    assert op(count(lambda: torch.polygamma(2, x)), "aten.polygamma.default").flops == 12
    assert op(count(lambda: torch.igamma(x, x)), "aten.igamma.default").flops == 12
    assert op(count(lambda: torch.special.bessel_j0(x)), "aten.special_bessel_j0.default").flops == 12
    n = torch.full((3, 4), 7.0)  # the kernel's recurrence runs 7 steps; counted as one evaluation
    cheb = op(count(lambda: torch.special.chebyshev_polynomial_t(x, n)),
              "aten.special_chebyshev_polynomial_t.default")
    assert cheb.flops == 12
    assert cheb.bytes_read == 2 * 12 * 4 and cheb.bytes_written == 12 * 4


def test_angle_and_frexp() -> None:
    z = torch.randn(5, dtype=torch.complex64)
    assert op(count(lambda: torch.angle(z)), "aten.angle.default").flops == 5
    assert op(count(lambda: torch.frexp(torch.randn(6))), "aten.frexp.Tensor").flops == 6
