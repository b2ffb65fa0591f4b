"""The input grammar: ``1x3x224x224[:dtype]`` strings, dtype names, example tensors.

Messages name the thing being parsed with ``what`` (default ``"input shape"``); the command line
passes its flag name (``what="--input"``) so its errors say which flag to fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flopscope._text import did_you_mean
from flopscope.errors import SourceError

__all__ = [
    "DTYPES",
    "InputSpec",
    "cast_floating",
    "check_size",
    "describe",
    "make_inputs",
    "parse_dtype",
    "parse_input",
    "rebatch",
]

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
"""Every dtype name the grammar accepts (lower case), with its aliases."""


@dataclass(frozen=True)
class InputSpec:
    """One input tensor described by shape and dtype (``1x3x224x224:float16``).

    Attributes:
        shape: the dimensions.
        dtype: the element type (default float32).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return "x".join(map(str, self.shape)) + ("" if dtype == "float32" else f":{dtype}")


def parse_dtype(text: str | torch.dtype, *, what: str = "dtype", floating: bool = False
                ) -> torch.dtype:
    """A dtype from its name (``float64``, ``double``, ``bf16``, any case) or a ``torch.dtype``.

    Args:
        text: the name, or a dtype (returned as is after the checks).
        what: what the name is, for messages (``"--dtype"`` on the command line).
        floating: accept floating-point dtypes only.

    Returns:
        The dtype.

    Raises:
        SourceError: an unknown name, or a non-floating dtype where ``floating`` is set.
    """
    if isinstance(text, torch.dtype):
        dtype = text
    else:
        key = text.strip().lower()
        if key not in DTYPES:
            choices = sorted(k for k, v in DTYPES.items() if v.is_floating_point or not floating)
            raise SourceError(
                f"unknown {what} {text!r}: use one of {', '.join(choices)}"
                f"{did_you_mean(key, choices)}"
            )
        dtype = DTYPES[key]
    if floating and not dtype.is_floating_point:
        name = str(dtype).removeprefix("torch.")
        raise SourceError(
            f"{what} must be a floating-point type (float16, bfloat16, float32, float64), "
            f"not {name}"
        )
    return dtype


def parse_input(text: str, *, what: str = "input shape") -> InputSpec:
    """Parse ``1x3x224x224`` or ``1x3x224x224:float16`` into an :class:`InputSpec`.

    Args:
        text: dimensions joined by ``x``, optionally ``:dtype``.
        what: what the text is, for messages (``"--input"`` on the command line).

    Returns:
        The spec.

    Raises:
        SourceError: the text is not of that form, or names an unknown dtype.
    """
    shape_text, _, dtype_text = text.strip().partition(":")
    if re.fullmatch(r"-?\d+(x-?\d+)*", shape_text.lower()) and "-" in shape_text:
        raise SourceError(f"malformed {what} {text!r}: every dimension must be at least 1")
    if not re.fullmatch(r"\d+(x\d+)*", shape_text.lower()):
        raise SourceError(
            f"malformed {what} {text!r}: write the shape as dimensions joined by 'x', optionally "
            "followed by ':dtype', e.g. 1x3x224x224 or 1x128:int64"
        )
    dtype = torch.float32
    if dtype_text:
        if dtype_text.lower() not in DTYPES:
            raise SourceError(
                f"unknown dtype {dtype_text!r} in {what} {text!r}: use one of "
                f"{', '.join(sorted(DTYPES))}{did_you_mean(dtype_text.lower(), list(DTYPES))}"
            )
        dtype = DTYPES[dtype_text.lower()]
    shape = tuple(int(d) for d in shape_text.lower().split("x"))
    if any(d == 0 for d in shape):
        raise SourceError(f"malformed {what} {text!r}: every dimension must be at least 1")
    return InputSpec(shape, dtype)


# the most elements a tensor can have: its sizes are int64
_MAX_ELEMENTS = 2**63 - 1


def _physical_memory() -> int:
    """This machine's memory in bytes (effectively unlimited where it cannot be read)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return _MAX_ELEMENTS


def check_size(shape: Sequence[int], *, what: str) -> None:
    """Refuse a shape no tensor can have (a size or an element count beyond int64), before
    anything is made: PyTorch would stop with a C++ stack frame.

    Args:
        shape: the dimensions.
        what: what the shape is, for the message (``"--batch 99999"``).

    Raises:
        SourceError: the shape is too large.
    """
    n = 1
    for d in shape:
        n *= int(d)
    if n > _MAX_ELEMENTS:
        raise SourceError(f"{what} is too large: {n:,} elements, more than a tensor can hold "
                          f"({_MAX_ELEMENTS:,}, the int64 limit)")


def make_inputs(
    specs: Sequence[InputSpec],
    *,
    batch: int | None = None,
    dtype: torch.dtype | None = None,
    meta: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Tensors for ``specs``: random floats, zeros for integer dtypes (valid indices).

    Args:
        specs: shapes and dtypes.
        batch: when given, replaces the first dimension of every input.
        dtype: when given, the dtype of every floating-point input.
        meta: make them on the ``meta`` device (a shape-only count: no memory, whatever the
            size).

    Returns:
        One tensor per spec.
    """
    out = []
    for spec in specs:
        shape = spec.shape
        if batch is not None and shape:
            shape = (batch, *shape[1:])
        if meta:
            out.append(torch.empty(shape, dtype=dtype if dtype is not None and
                                   spec.dtype.is_floating_point else spec.dtype, device="meta"))
            continue
        made = InputSpec(tuple(shape), spec.dtype)
        nbytes = torch.empty((), dtype=dtype or spec.dtype).element_size()
        for d in shape:
            nbytes *= d
        if nbytes > _physical_memory():
            raise SourceError(
                f"input {made} needs {nbytes / 2**30:,.1f} GiB, more than this machine's "
                f"{_physical_memory() / 2**30:,.1f} GiB of memory: count it shape-only "
                "(--shape-only / shape_only=True), which makes no tensor memory")
        try:
            if spec.dtype.is_floating_point:
                out.append(torch.randn(shape, dtype=dtype or spec.dtype))
            else:
                out.append(torch.zeros(shape, dtype=spec.dtype))
        except (RuntimeError, MemoryError) as e:  # an allocation this machine cannot make
            raise SourceError(
                f"input {made} needs {nbytes / 2**30:,.1f} GiB of memory, which could not be "
                f"allocated ({str(e).splitlines()[0][:120]}): count it shape-only "
                "(--shape-only / shape_only=True), which makes no tensor memory") from e
    return tuple(out)


def rebatch(value: Any, batch: int) -> Any:
    """``value`` with its first dimension made ``batch`` (rows repeated or cut); non-tensors and
    scalars unchanged.

    Args:
        value: a forward argument.
        batch: the batch size.

    Returns:
        The argument at that batch size.
    """
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.is_meta:
        return torch.empty((batch, *value.shape[1:]), dtype=value.dtype, device="meta")
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] != batch:
        reps = (batch + value.shape[0] - 1) // value.shape[0]
        return value.repeat(reps, *([1] * (value.dim() - 1)))[:batch].contiguous()
    return value


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating-point tensor in it (also inside tuples, lists and dicts) cast
    to ``dtype``; everything else unchanged.

    Args:
        value: a forward argument.
        dtype: the floating-point dtype.

    Returns:
        The argument with its floating tensors cast.
    """
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floating(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: cast_floating(v, dtype) for k, v in value.items()}
    return value


def describe(value: Any) -> str:
    """A forward argument in the input grammar (``1x3x224x224``), or its repr or type name.

    Args:
        value: a forward argument.

    Returns:
        The description.
    """
    if isinstance(value, torch.Tensor):
        return str(InputSpec(tuple(value.shape), value.dtype))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__name__
