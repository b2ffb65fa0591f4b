"""Config overrides: ``key=value`` strings into a dict (for ``hf:`` sources)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flopscope.errors import SourceError

__all__ = ["parse_config"]

_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None}


def parse_config(items: Sequence[str], *, what: str = "config override") -> dict[str, Any]:
    """Parse ``key=value`` overrides; values are read as JSON (numbers, true/false, lists) when
    they parse, else kept as strings (``True``/``False``/``None`` in any case are booleans/None).

    Args:
        items: ``key=value`` strings.
        what: what an item is, for messages (``"--config"`` on the command line).

    Returns:
        key -> value, in the order given (a later item overrides an earlier one).

    Raises:
        SourceError: an item has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SourceError(
                f"malformed {what} {item!r}: write key=value, e.g. num_hidden_layers=2"
            )
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = _WORDS.get(value.strip().lower(), value)
    return out
