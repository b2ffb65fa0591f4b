"""Human units, used by renderers only."""

from __future__ import annotations

import pytest

from flopscope.render.units import auto_prefix, human, parse_prefix, shared_prefix


@pytest.mark.parametrize(("value", "prefix"), [
    (0, ""), (999, ""), (1000, "K"), (-2_500_000, "M"), (4_089_184_256, "G"), (10**13, "T"),
    (10**18, "P"),
])
def test_auto_prefix(value: int, prefix: str) -> None:
    assert auto_prefix(value) == prefix


def test_human() -> None:
    assert human(4_089_184_256, "MAC") == "4.09 GMAC"
    assert human(999, "FLOP") == "999 FLOP"  # below 1000: exact
    assert human(1234) == "1.23 K"
    assert human(1_500_000, "B", prefix="K", digits=1) == "1,500.0 KB"
    assert human(12, "", prefix="") == "12"


def test_parse_prefix() -> None:
    assert parse_prefix(None) is None and parse_prefix("AUTO") is None
    assert parse_prefix("g") == "G"
    for bad in ("X", ""):
        with pytest.raises(ValueError, match=r"unknown unit"):
            parse_prefix(bad)


def test_shared_prefix() -> None:
    assert shared_prefix([10, 2_000_000, -5]) == "M"
    assert shared_prefix([]) == ""
