"""Human units, used by renderers only: SI prefixes for counts, binary prefixes for bytes."""

from __future__ import annotations

import pytest

from flopscope.render.units import (
    auto_prefix,
    human,
    human_bytes,
    parse_prefix,
    scaled,
    shared_prefix,
)


@pytest.mark.parametrize(("value", "prefix"), [
    (0, ""), (999, ""), (1000, "k"), (-2_500_000, "M"), (4_089_184_256, "G"), (10**13, "T"),
    (10**15, "P"), (10**18, "E"), (10**21, "Z"), (10**24, "Y"), (10**27, "R"), (10**30, "Q"),
    (10**40, "Q"),
])
def test_auto_prefix(value: int, prefix: str) -> None:
    assert auto_prefix(value) == prefix


def test_human_counts() -> None:
    assert human(4_089_184_256, "MAC") == "4.09 GMAC"
    assert human(999, "FLOP") == "999 FLOP"  # below 1000: exact
    assert human(1234) == "1.23 k"
    assert human(12, "", prefix="") == "12"
    # 268,751 * 10^15 is 268.75 * 10^18: an E prefix, not "268,751 PMAC"
    assert human(268_751 * 10**15, "MAC") == "268.75 EMAC"
    assert human(3 * 10**30, "FLOP") == "3.00 QFLOP"


def test_human_bytes_are_binary() -> None:
    assert human(1023, "B") == "1,023 B"  # below 1 KiB: exact
    assert human(14_720, "B") == "14.38 KiB"  # 14,720 / 1,024
    assert human_bytes(3 * 2**29) == "1.50 GiB"
    assert human(1_500_000, "B", prefix="Ki", digits=1) == "1,464.8 KiB"  # 1,500,000 / 1,024
    assert human(3_350 * 10**9, "B/s") == "3.05 TiB/s"  # 3.35e12 / 2^40 = 3.047
    assert human_bytes(9 * 2**60) == "9.00 EiB"
    with pytest.raises(ValueError, match=r"bytes take binary prefixes"):
        human(10**6, "B", prefix="M")
    with pytest.raises(ValueError, match=r"counts take SI prefixes"):
        human(10**6, "FLOP", prefix="Mi")


def test_scaled() -> None:
    assert scaled(4_089_184_256, "G", 3) == "4.089"
    assert scaled(0, "G") == "0"
    assert scaled(25_557_032, "M") == "25.56"


def test_parse_prefix() -> None:
    assert parse_prefix(None) is None and parse_prefix("AUTO") is None
    assert parse_prefix("g") == "G"
    assert parse_prefix("K") == "k" and parse_prefix("k") == "k"  # kilo is a lower-case k
    assert parse_prefix("e") == "E" and parse_prefix("Q") == "Q"
    for bad in ("X", "", "Ki"):
        with pytest.raises(ValueError, match=r"unknown unit .*use auto, k, M, G, T, P, E, Z, Y, R or Q"):
            parse_prefix(bad)


def test_shared_prefix() -> None:
    assert shared_prefix([10, 2_000_000, -5]) == "M"
    assert shared_prefix([]) == ""
