"""Formulas for people: :func:`pretty` writes a sympy formula (a symbolic cost) with its terms by
decreasing degree, short coefficients, ``·`` and superscripts."""

from __future__ import annotations

from collections.abc import Mapping

import sympy  # type: ignore[import-untyped]

__all__ = ["pretty"]

_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _monomial(powers: Mapping[sympy.Basic, sympy.Expr]) -> str:
    parts = []
    for base, exp in sorted(powers.items(), key=lambda kv: str(kv[0])):
        text = sympy.sstr(base)
        if exp != 1:
            text += str(exp).translate(_SUPERSCRIPT) if exp.is_Integer and exp > 0 else f"**{exp}"
        parts.append(text)
    return "·".join(parts)


def _number(n: sympy.Expr, digits: int) -> str:
    if n.is_Integer and abs(int(n)) < 10 ** (digits + 1):
        return str(int(n))
    return f"{float(n):.{digits - 1}e}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def pretty(expr: sympy.Expr | int, digits: int = 3) -> str:
    """A formula for people: terms by decreasing degree, coefficients to ``digits`` significant
    digits, products with ``·`` and powers as superscripts: ``2.10e6·T² + 6.74e9·T``.

    Args:
        expr: the formula (exact; see ``sympy.sstr`` for the exact text).
        digits: significant digits of large coefficients (integers below ``10**(digits+1)`` are
            shown exactly).

    Returns:
        The text.
    """
    expr = sympy.expand(sympy.sympify(expr))
    if expr == 0:
        return "0"
    terms = []
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        powers = rest.as_powers_dict() if rest != 1 else {}
        degree = sum(int(e) for e in powers.values() if e.is_Integer)
        if rest == 1:
            text = _number(coeff, digits)
        elif any(not b.is_Symbol for b in powers):  # floor(), FloorDiv ... : exact text
            text = (("" if coeff == 1 else _number(coeff, digits) + "·") + sympy.sstr(rest))
        else:
            text = ("" if coeff == 1 else _number(coeff, digits) + "·") + _monomial(powers)
        terms.append((degree, text))
    terms.sort(key=lambda dt: -dt[0])
    out = terms[0][1]
    for _, text in terms[1:]:
        out += " - " + text[1:] if text.startswith("-") else " + " + text
    return out
