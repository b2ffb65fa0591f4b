"""Special functions (``torch.special``, ``polygamma``, ``igamma``, Bessel functions, orthogonal
polynomials) with no decomposition into counted operators.

Convention: a special function is an *elementary function* in the sense of the elementwise table
(exp, log, erf, lgamma, digamma, i0 ...): one evaluation = 1 FLOP per output element. The series,
continued fractions, rational approximations or recurrences a kernel uses inside are not counted,
exactly as the polynomial inside ``exp`` is not; this keeps the count independent of the library
and of the argument values (the orthogonal-polynomial kernels run a recurrence whose length is the
*value* of ``n``). Functions PyTorch decomposes into such operators (``special_entr``,
``special_xlog1py``, ``special_log_ndtr``, ``mvlgamma`` ...) are counted through their
decomposition.
"""

from __future__ import annotations

from flopscope.rules.registry import register_table

register_table(
    [
        (
            [
                "aten::polygamma", "aten::polygamma_",
                "aten::igamma", "aten::igamma_", "aten::igammac", "aten::igammac_",
                "aten::special_zeta",
                "aten::special_airy_ai",
                "aten::special_bessel_j0", "aten::special_bessel_j1",
                "aten::special_bessel_y0", "aten::special_bessel_y1",
                "aten::special_modified_bessel_i0", "aten::special_modified_bessel_i1",
                "aten::special_modified_bessel_k0", "aten::special_modified_bessel_k1",
                "aten::special_scaled_modified_bessel_k0",
                "aten::special_scaled_modified_bessel_k1",
                "aten::special_spherical_bessel_j0",
                "aten::special_i1", "aten::special_i1e",
                "aten::special_erfcx", "aten::special_ndtri",
                "aten::special_chebyshev_polynomial_t", "aten::special_chebyshev_polynomial_u",
                "aten::special_chebyshev_polynomial_v", "aten::special_chebyshev_polynomial_w",
                "aten::special_shifted_chebyshev_polynomial_t",
                "aten::special_shifted_chebyshev_polynomial_u",
                "aten::special_shifted_chebyshev_polynomial_v",
                "aten::special_shifted_chebyshev_polynomial_w",
                "aten::special_hermite_polynomial_h", "aten::special_hermite_polynomial_he",
                "aten::special_laguerre_polynomial_l", "aten::special_legendre_polynomial_p",
            ],
            1,
            "Special functions of one or two arguments (polygamma, igamma/igammac, zeta, Bessel "
            "and Airy functions, erfcx, ndtri, orthogonal polynomials T/U/V/W/H/He/L/P): one "
            "evaluation = 1 FLOP per output element, as exp or lgamma (the kernel's series or "
            "recurrence is not counted).",
        ),
        (
            ["aten::angle", "aten::frexp"],
            1,
            "angle (atan2(imag, real); for real input a sign test) and frexp (split into mantissa "
            "and exponent): 1 FLOP per output element.",
        ),
    ]
)
