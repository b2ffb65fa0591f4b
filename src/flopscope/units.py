"""Human-readable numbers, for renderers only (the core deals in integers)."""

from __future__ import annotations

__all__ = ["PREFIXES", "human"]

PREFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def human(value: int, unit: str = "", *, prefix: str | None = None, digits: int = 2) -> str:
    """Format ``value`` with an SI prefix (auto when ``prefix`` is None): ``human(4089184256, "MAC")``
    gives ``"4.09 GMAC"``."""
    if prefix is None:
        prefix = ""
        for p, scale in PREFIXES.items():
            if abs(value) >= scale:
                prefix = p
    scale = PREFIXES[prefix]
    if scale == 1:
        return f"{value:,} {unit}".rstrip()
    return f"{value / scale:.{digits}f} {prefix}{unit}".rstrip()
