"""Human-readable numbers, for renderers only (the core deals in integers).

One convention, used by every table, note line, plot label and message that shows a number:

- **Counts** (parameters, MACs, FLOPs, calls; FLOP/s) take decimal SI prefixes, as many as the
  number needs: k, M, G, T, P, E, Z, Y, R, Q (10^3 to 10^30). ``4.09 GMAC``, ``268.75 ZFLOP``.
- **Bytes** (sizes, bytes moved, memory; and byte rates, ``B/s``) take binary IEC prefixes:
  KiB, MiB, GiB, TiB, PiB, EiB, ZiB, YiB (2^10 to 2^80). ``14.04 KiB``, ``3.05 TiB/s``.

:func:`human` picks the right one from the unit (``"B"`` and ``"B/s"`` are bytes), so no caller
formats a byte or a count by hand. Machine formats (JSON, CSV) carry plain integers.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "seconds",
    "BINARY_PREFIXES",
    "PREFIXES",
    "auto_prefix",
    "human",
    "human_bytes",
    "is_bytes",
    "parse_prefix",
    "scaled",
    "shared_prefix",
]

PREFIXES: dict[str, int] = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Z": 10**21, "Y": 10**24, "R": 10**27, "Q": 10**30,
}
"""Decimal SI prefixes of counts, smallest first."""

BINARY_PREFIXES: dict[str, int] = {
    "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "Zi": 2**70, "Yi": 2**80,
}
"""Binary IEC prefixes of bytes, smallest first."""

# a user's --unit, upper case -> the SI prefix (kilo is a lower-case k; K is accepted too)
_BY_UPPER = {p.upper(): p for p in PREFIXES if p}


def is_bytes(unit: str) -> bool:
    """Whether ``unit`` counts bytes (``"B"``, or a rate such as ``"B/s"``): those take binary
    prefixes.

    Args:
        unit: the unit name.

    Returns:
        True for bytes.
    """
    return unit == "B" or unit.startswith("B/")


def _largest(value: int | float, table: dict[str, int]) -> str:
    prefix = ""
    for p, scale in table.items():
        if abs(value) >= scale:
            prefix = p
    return prefix


def auto_prefix(value: int | float) -> str:
    """The largest SI prefix not above ``|value|`` (``""`` below 1000; ``"Q"`` above 10^30).

    Args:
        value: the number.

    Returns:
        A key of :data:`PREFIXES`.
    """
    return _largest(value, PREFIXES)


def parse_prefix(text: str | None) -> str | None:
    """Turn a user's ``--unit`` (``auto``, ``k``, ``M``, ``G``, ``T``, ``P``, ``E``, ``Z``, ``Y``,
    ``R``, ``Q``, any case) into a prefix, ``None`` meaning automatic.

    Args:
        text: the user's string.

    Returns:
        ``None`` for automatic, else a key of :data:`PREFIXES`.

    Raises:
        ValueError: an unknown unit.
    """
    if text is None or text.strip().lower() == "auto":
        return None
    prefix = _BY_UPPER.get(text.strip().upper())
    if prefix is None:
        raise ValueError(f"unknown unit {text!r}: use auto, {', '.join(list(_BY_UPPER.values())[:-1])} "
                         f"or {list(_BY_UPPER.values())[-1]}")
    return prefix


def shared_prefix(values: Iterable[int | float]) -> str:
    """One SI prefix that suits the largest of ``values`` (for an axis or a column).

    Args:
        values: the numbers.

    Returns:
        A key of :data:`PREFIXES` (``""`` when there are none).
    """
    return auto_prefix(max((abs(v) for v in values), default=0))


def scaled(value: int | float, prefix: str, digits: int = 2) -> str:
    """``value`` in units of an SI ``prefix``, without the prefix (for a column whose header names
    it): ``scaled(4089184256, "G", 3)`` gives ``"4.089"``; 0 is ``"0"``.

    Args:
        value: the number.
        prefix: a key of :data:`PREFIXES`.
        digits: digits after the decimal point.

    Returns:
        The number as text, with thousands separators.
    """
    if value == 0:
        return "0"
    return f"{value / PREFIXES[prefix]:,.{digits}f}"


def human(value: int, unit: str = "", *, prefix: str | None = None, digits: int = 2) -> str:
    """Format ``value`` with a prefix: SI for counts, binary for bytes (see the module docstring).

    ``human(4089184256, "MAC")`` gives ``"4.09 GMAC"``, ``human(14720, "B")`` gives
    ``"14.38 KiB"``; numbers below one prefix step (1000, or 1024 bytes) are shown exactly.

    Args:
        value: the integer.
        unit: the unit appended after the prefix (``MAC``, ``FLOP``, ``FLOP/s``; ``B`` and
            ``B/s`` are bytes).
        prefix: a fixed prefix (a key of :data:`PREFIXES`, or of :data:`BINARY_PREFIXES` for
            bytes), or ``None`` to choose one.
        digits: digits after the decimal point.

    Returns:
        The formatted string.

    Raises:
        ValueError: a fixed ``prefix`` of the other kind (an SI prefix for bytes, or the reverse).
    """
    table = BINARY_PREFIXES if is_bytes(unit) else PREFIXES
    if prefix is None:
        prefix = _largest(value, table)
    elif prefix not in table:
        kind = "bytes take binary prefixes (Ki, Mi, Gi ...)" if table is BINARY_PREFIXES else (
            "counts take SI prefixes (k, M, G ...)")
        raise ValueError(f"prefix {prefix!r} does not suit {unit or 'a count'}: {kind}")
    scale = table[prefix]
    if scale == 1:
        return f"{value:,} {unit}".rstrip()
    return f"{value / scale:,.{digits}f} {prefix}{unit}".rstrip()


def human_bytes(nbytes: int, digits: int = 2) -> str:
    """Bytes with a binary prefix: ``human_bytes(3 * 2**29)`` gives ``"1.50 GiB"``.

    Args:
        nbytes: bytes.
        digits: digits after the decimal point.

    Returns:
        The size.
    """
    return human(nbytes, "B", digits=digits)


def seconds(value: float) -> str:
    """A duration with a readable unit: ``1.23 s``, ``45.6 ms``, ``789 us``."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} us"
