"""Human-readable numbers, for renderers only (the core deals in integers)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PREFIXES", "auto_prefix", "human", "parse_prefix", "shared_prefix"]

PREFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def auto_prefix(value: int | float) -> str:
    """The largest SI prefix not above ``|value|`` (``""`` below 1000).

    Args:
        value: the number.

    Returns:
        A key of :data:`PREFIXES`.
    """
    prefix = ""
    for p, scale in PREFIXES.items():
        if abs(value) >= scale:
            prefix = p
    return prefix


def parse_prefix(text: str | None) -> str | None:
    """Turn a user's ``--unit`` (``auto``, ``K``, ``M``, ``G``, ``T``, ``P``, any case) into a
    prefix, ``None`` meaning automatic.

    Args:
        text: the user's string.

    Returns:
        ``None`` for automatic, else a key of :data:`PREFIXES`.

    Raises:
        ValueError: an unknown unit.
    """
    if text is None or text.lower() == "auto":
        return None
    up = text.upper()
    if up not in PREFIXES or up == "":
        raise ValueError(f"unknown unit {text!r}: use auto, K, M, G, T or P")
    return up


def shared_prefix(values: Iterable[int | float]) -> str:
    """One prefix that suits the largest of ``values`` (for an axis or a column)."""
    return auto_prefix(max((abs(v) for v in values), default=0))


def human(value: int, unit: str = "", *, prefix: str | None = None, digits: int = 2) -> str:
    """Format ``value`` with an SI prefix (auto when ``prefix`` is None).

    ``human(4089184256, "MAC")`` gives ``"4.09 GMAC"``; integers below 1000 are shown exactly.

    Args:
        value: the integer.
        unit: the unit name appended after the prefix (``MAC``, ``FLOP``, ``B``).
        prefix: a fixed key of :data:`PREFIXES`, or ``None`` to choose one.
        digits: digits after the decimal point.

    Returns:
        The formatted string.
    """
    if prefix is None:
        prefix = auto_prefix(value)
    scale = PREFIXES[prefix]
    if scale == 1:
        return f"{value:,} {unit}".rstrip()
    return f"{value / scale:,.{digits}f} {prefix}{unit}".rstrip()
