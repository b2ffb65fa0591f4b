"""The input grammar: ``1x3x224x224[:dtype]`` strings, dtype names, example tensors.

Messages name the thing being parsed with ``what`` (default ``"input shape"``); the command line
passes its flag name (``what="--input"``) so its errors say which flag to fix.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flopscope._text import did_you_mean
from flopscope.errors import SourceError
from flopscope.render.units import human

__all__ = [
    "DTYPES",
    "MAX_SIZE",
    "InputSpec",
    "cast_floating",
    "check_fits",
    "describe",
    "example_tensor",
    "make_inputs",
    "parse_dtype",
    "parse_input",
    "rebatch",
]

MAX_SIZE = 2**63 - 1
"""The largest tensor dimension, and the most bytes one tensor's storage can hold: PyTorch keeps
sizes in signed 64-bit integers (9,223,372,036,854,775,807; 8 EiB of storage)."""

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


def check_fits(shape: Sequence[int], dtype: torch.dtype, *, what: str = "input") -> None:
    """Refuse a tensor that PyTorch cannot describe: a dimension, or a storage in bytes, beyond
    :data:`MAX_SIZE` (torch would fail deep inside with a stack frame, or an overflow).

    Args:
        shape: the dimensions.
        dtype: the element type.
        what: what the tensor is, for the message (``"input 1x3x224x224"``, ``"batch 8"``).

    Raises:
        SourceError: it does not fit; the message says the limit.
    """
    big = [d for d in shape if d > MAX_SIZE]
    if big:
        raise SourceError(
            f"{what}: dimension {big[0]:,} is beyond the largest tensor dimension, "
            f"{MAX_SIZE:,} (2^63 - 1); use a smaller size"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_SIZE:
        name = str(dtype).removeprefix("torch.")
        raise SourceError(
            f"{what}: {'x'.join(map(str, shape))} {name} would take {human(nbytes, 'B')}, beyond "
            f"the {human(MAX_SIZE, 'B')} (2^63 - 1 bytes) one tensor can hold; use a smaller size"
        )


def example_tensor(shape: Sequence[int], dtype: torch.dtype = torch.float32, *,
                   shape_only: bool = False, what: str = "input") -> torch.Tensor:
    """An example input: random floats, zeros for integer dtypes (valid indices); on the
    ``meta`` device (no memory, no values) when ``shape_only``.

    Args:
        shape: the dimensions.
        dtype: the element type.
        shape_only: make it on ``meta``: a shape-only count never reads an input's values.
        what: what the tensor is, for the message when it does not fit.

    Returns:
        The tensor.

    Raises:
        SourceError: the shape does not fit in a tensor (see :func:`check_fits`), or a real
            tensor in this machine's memory.
    """
    check_fits(shape, dtype, what=what)
    if shape_only:
        return torch.empty(tuple(shape), dtype=dtype, device="meta")
    nbytes = math.prod(shape) * dtype.itemsize
    check_memory(nbytes, what)
    try:
        if dtype.is_floating_point:
            return torch.randn(tuple(shape), dtype=dtype)
        return torch.zeros(tuple(shape), dtype=dtype)
    except (RuntimeError, MemoryError) as e:  # an allocation this machine cannot make
        raise SourceError(f"{what} needs {human(nbytes, 'B')} of memory, which could not be "
                          f"allocated ({str(e).splitlines()[0][:120]}): {_SHAPE_ONLY}") from e


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
    check_fits(shape, dtype, what=f"{what} {text!r}")
    return InputSpec(shape, dtype)


_SHAPE_ONLY = "count it shape-only (--shape-only / shape_only=True), which makes no tensor memory"


def check_memory(nbytes: int, what: str) -> None:
    """Refuse real tensors of more bytes than this machine's memory, before they are made
    (an input, a batch, a model's weights)."""
    if nbytes > _physical_memory():
        raise SourceError(f"{what} needs {human(nbytes, 'B')}, more than this machine's "
                          f"{human(_physical_memory(), 'B')} of memory: {_SHAPE_ONLY}")


def _physical_memory() -> int:
    """This machine's memory in bytes (effectively unlimited where it cannot be read)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return MAX_SIZE


def make_inputs(
    specs: Sequence[InputSpec],
    *,
    batch: int | None = None,
    dtype: torch.dtype | None = None,
    shape_only: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Tensors for ``specs``: random floats, zeros for integer dtypes (valid indices); ``meta``
    tensors (no memory) when ``shape_only``.

    Args:
        specs: shapes and dtypes.
        batch: when given, replaces the first dimension of every input.
        dtype: when given, the dtype of every floating-point input.
        shape_only: make them on ``meta`` (see :func:`example_tensor`).

    Returns:
        One tensor per spec.

    Raises:
        SourceError: an input (at ``batch``) does not fit in a tensor.
    """
    out = []
    for spec in specs:
        shape = spec.shape
        if batch is not None and shape:
            shape = (batch, *shape[1:])
        kind = (dtype or spec.dtype) if spec.dtype.is_floating_point else spec.dtype
        what = f"input {spec}" + (f" at batch {batch:,}" if batch is not None else "")
        out.append(example_tensor(shape, kind, shape_only=shape_only, what=what))
    return tuple(out)


def rebatch(value: Any, batch: int) -> Any:
    """``value`` with its first dimension made ``batch`` (rows repeated or cut); non-tensors and
    scalars unchanged.

    Args:
        value: a forward argument.
        batch: the batch size.

    Returns:
        The argument at that batch size.

    Raises:
        SourceError: the input at that batch size does not fit in a tensor.
    """
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] == batch:
        return value
    shape = (batch, *value.shape[1:])
    check_fits(shape, value.dtype, what=f"batch {batch:,}")
    if value.is_meta:
        return torch.empty(shape, dtype=value.dtype, device="meta")
    check_memory(math.prod(shape) * value.dtype.itemsize, f"batch {batch:,}")
    reps = (batch + value.shape[0] - 1) // value.shape[0]
    return value.repeat(reps, *([1] * (value.dim() - 1)))[:batch].contiguous()


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
