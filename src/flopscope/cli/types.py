"""The value types of the command line's options (argparse ``type=``): each turns the user's
string into a value or raises :class:`argparse.ArgumentTypeError` with a message that says what
to write instead (argparse prints it as a one-line usage error)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

__all__ = ["PLOT_SUFFIXES", "dtype_name", "memory_size", "named_file", "non_negative_int",
           "output_file", "plot_file", "positive_int", "positive_number", "profile", "tolerance", "unit_prefix",
           "unwritable"]

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _whole_number(text: str, minimum: int, largest: int = 2**63 - 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        wanted = "at least 1" if minimum == 1 else f"{minimum} or more"
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
    if value > largest:  # before anything is built (torch's sizes are signed 64-bit integers)
        raise argparse.ArgumentTypeError(f"expected at most {largest:,} (2^63 - 1, the largest "
                                         f"size PyTorch holds), got {value:,}")
    return value


def positive_int(text: str) -> int:
    """Argument type: a whole number, at least 1 and at most 2^63 - 1 (``--batch``,
    ``--seq-len``).

    Args:
        text: the user's string.

    Returns:
        The number.

    Raises:
        argparse.ArgumentTypeError: not a whole number, below 1, or beyond 2^63 - 1.
    """
    return _whole_number(text, 1)


def positive_int_list(text: str) -> list[int]:
    """Argument type: comma-separated whole numbers, each at least 1 (``--batch 1,8,64``).

    Args:
        text: the user's string.

    Returns:
        The numbers, in the order given.

    Raises:
        argparse.ArgumentTypeError: a part that is not a whole number >= 1, or none at all.
    """
    values = [positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got "
                                         f"{text!r}")
    return values


def non_negative_int(text: str) -> int:
    """Argument type: a whole number, 0 or more, at most 2^63 - 1 (``--depth``).

    Args:
        text: the user's string.

    Returns:
        The number.

    Raises:
        argparse.ArgumentTypeError: not a whole number, negative, or beyond 2^63 - 1.
    """
    return _whole_number(text, 0)


def tolerance(text: str) -> float:
    """Argument type: a relative tolerance, a percentage (``1%``) or a fraction below 1
    (``0.01``). A bare number of 1 or more is refused as ambiguous: ``1`` could mean 1% or 100%.

    Args:
        text: the user's string.

    Returns:
        The fraction (``0.01`` for ``1%``).

    Raises:
        argparse.ArgumentTypeError: malformed, negative, or a bare number of 1 or more.
    """
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1]) / 100 if percent else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"malformed tolerance {text!r}: write a percentage like 1% or a fraction like 0.01"
        ) from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"tolerance must be 0 or more, got {text!r}")
    if not percent and value >= 1:
        raise argparse.ArgumentTypeError(
            f"ambiguous tolerance {text!r}: write {raw}% for {raw} percent, or a fraction below 1 "
            f"(0.01 is 1%); {raw} as a fraction would be {100 * value:g}%")
    return value


def profile(text: str) -> str:
    """Argument type: a hardware profile's name or file (``--hardware``), not empty.

    Args:
        text: the user's string.

    Returns:
        The text.

    Raises:
        argparse.ArgumentTypeError: an empty value (``--hardware ''`` was silently ignored).
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty profile: give a shipped profile (h100-sxm, a100-80gb, ...), a JSON profile "
            "file or this-machine (flopscope count --help lists them)")
    return text


def positive_number(text: str) -> float:
    """Argument type: a finite number above 0 (``--step-time 0.41``, ``--peak-tflops 989``).

    Args:
        text: the user's string.

    Returns:
        The number.

    Raises:
        argparse.ArgumentTypeError: not a number, or not above 0.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.41, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text!r}")
    return value


def unit_prefix(text: str) -> str | None:
    """Argument type: ``--unit auto|k|M|G|T|P|E|Z|Y|R|Q`` (any case).

    Args:
        text: the user's string.

    Returns:
        The SI prefix, ``None`` for automatic.

    Raises:
        argparse.ArgumentTypeError: an unknown unit.
    """
    from flopscope.render.units import parse_prefix

    try:
        return parse_prefix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def dtype_name(text: str) -> str:
    """Argument type: ``--dtype`` (a floating-point dtype name: ``float64``, ``double``, ``bf16``).

    Args:
        text: the user's string.

    Returns:
        The canonical name (``float64``).

    Raises:
        argparse.ArgumentTypeError: an unknown or non-floating dtype (close names suggested).
    """
    from flopscope.errors import SourceError
    from flopscope.sources import parse_dtype

    try:
        return str(parse_dtype(text, floating=True)).removeprefix("torch.")
    except SourceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- files a subcommand writes -----------------------------------------------------------------
def unwritable(path: str) -> str | None:
    """Why a file cannot be written at ``path``, or ``None`` when it can: the one rule of every
    file any subcommand writes. The folder must exist already (it is never created) and be
    writable, and the path must not be a folder.

    Args:
        path: the user's file name.

    Returns:
        The reason, to follow "cannot write PATH: ", or ``None``.
    """
    file = Path(path)
    if file.is_dir():
        return "it is a directory; give a file name"
    folder = file.parent
    if not folder.is_dir():
        return (f"the directory {str(folder)!r} does not exist; create it first or choose "
                "another path")
    if not os.access(folder, os.W_OK):
        return f"the directory {str(folder)!r} is not writable"
    return None


def output_file(text: str) -> str:
    """Argument type: a file to write a result to (``--output``, ``--trace``); ``-`` is stdout.

    Args:
        text: the user's string.

    Returns:
        The path, unchanged.

    Raises:
        argparse.ArgumentTypeError: the file cannot be written there (:func:`unwritable`).
    """
    problem = unwritable(text) if text != "-" else None
    if problem is not None:
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {problem}")
    return text


def named_file(text: str) -> str:
    """Argument type: a file that must be a file, not stdout (``profile --trace``, ``calibrate
    --output``: a trace or a profile is read back from its path): as :func:`output_file`, and
    ``-`` is refused (it wrote a file named ``-``).

    Args:
        text: the user's string.

    Returns:
        The path, unchanged.

    Raises:
        argparse.ArgumentTypeError: ``-``, or the file cannot be written there.
    """
    if text == "-":
        raise argparse.ArgumentTypeError("needs a file name, not - (this file is not printed: "
                                         "give a path such as out.json)")
    return output_file(text)


def plot_file(text: str) -> str:
    """Argument type: a chart to write (``--plot``, ``--roofline-plot``): a .png, .svg or .pdf
    file whose folder exists (:func:`unwritable`).

    Args:
        text: the user's string.

    Returns:
        The path, unchanged.

    Raises:
        argparse.ArgumentTypeError: another suffix, or the file cannot be written there.
    """
    if Path(text).suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"cannot plot to {text!r}: use a file name ending in .png, .svg or .pdf")
    problem = unwritable(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {problem}")
    return text


def memory_size(text: str) -> int:
    """Argument type: a memory size (``80GiB``, ``80GB``, ``1.5TiB``, bytes).

    Args:
        text: the user's string.

    Returns:
        Bytes.

    Raises:
        argparse.ArgumentTypeError: not a size.
    """
    from flopscope.errors import UsageError
    from flopscope.plan.space import parse_bytes

    try:
        return parse_bytes(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
