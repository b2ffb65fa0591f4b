"""``key=value`` config overrides."""

from __future__ import annotations

import pytest

from flopscope.errors import SourceError
from flopscope.sources import parse_config


def test_values_are_json_when_they_parse() -> None:
    out = parse_config(["a=2", "b=0.5", "c=[1, 2]", "d=true", "e=None", "f=silu", "g=x=y"])
    assert out == {"a": 2, "b": 0.5, "c": [1, 2], "d": True, "e": None, "f": "silu", "g": "x=y"}


def test_later_items_override() -> None:
    assert parse_config(["a=1", "a=2"]) == {"a": 2}


@pytest.mark.parametrize("item", ["novalue", "=3", " =3"])
def test_malformed(item: str) -> None:
    with pytest.raises(SourceError, match=r"malformed config override .*write key=value"):
        parse_config([item])
    with pytest.raises(SourceError, match=r"malformed --config"):
        parse_config([item], what="--config")
