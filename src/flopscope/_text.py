"""Small text helpers shared by the model loader and the command line: one-line messages and
"did you mean" suggestions. No torch, no flopscope imports."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "one_line"]


def one_line(text: object, limit: int = 400) -> str:
    """``text`` on one line (runs of whitespace become one space), cut to ``limit`` characters.

    Args:
        text: anything; it is converted with ``str``.
        limit: the longest result; longer text ends with ``...``.

    Returns:
        The flattened text.
    """
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A suggestion suffix for an unknown ``name``: ``" (did you mean resnet50, resnet101?)"``.

    Close spellings first; failing those, up to three choices that contain ``name``.

    Args:
        name: what the user wrote.
        choices: the known names.

    Returns:
        The suffix, or ``""`` when nothing is close.
    """
    known = list(choices)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if not close:
        lowered = name.lower()
        close = sorted(c for c in known if lowered and lowered in c.lower())[:3]
    return f" (did you mean {', '.join(close)}?)" if close else ""
