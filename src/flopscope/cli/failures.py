"""How the command line tells a user that the model's forward failed: either the model rejected
its input (an operator refused the shapes it was given: "pass shapes it accepts with --input"),
or the forward's own code raised (a bug in the model: its error, where it was raised, and no
advice about shapes that would not help).

The two are told apart by where the error was raised: in the user's own code (a file outside
torch, flopscope, the standard library and installed packages), or inside an operator or an
installed library (torch's kernels and shape checks, transformers, timm, torchvision).
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path

import flopscope
from flopscope._text import one_line
from flopscope.errors import ForwardError, UsageError

__all__ = ["forward_failure", "raised_in_own_code"]


def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the user's: the standard library, installed packages, torch
    and flopscope (wherever they are imported from)."""
    import torch

    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {str(Path(m.__file__).parent) for m in (torch, flopscope) if m.__file__}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def raised_in_own_code(exc: BaseException) -> traceback.FrameSummary | None:
    """Where ``exc`` was raised, when that is the user's own code: the innermost frame of its
    traceback, if its file lies outside torch, flopscope, the standard library and installed
    packages. An error an operator raised has its innermost frame in torch or in flopscope's
    dispatch (``None``).

    Args:
        exc: the exception (the cause of a :class:`~flopscope.ForwardError`).

    Returns:
        The frame, or ``None``.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    innermost = frames[-1]
    if innermost.filename.startswith("<"):  # <frozen ...>, <string>: not a file of the user's
        return None
    file = os.path.realpath(innermost.filename)
    if file.startswith(_library_roots()):
        return None
    return innermost


def _shown(filename: str) -> str:
    """A file name relative to the working directory when it is below it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def forward_failure(error: ForwardError, source: str, shapes: str) -> UsageError:
    """The one-line usage error for a forward that failed while counting ``source``.

    Args:
        error: the error :func:`flopscope.count` raised; its ``__cause__`` is the model's own.
        source: the SOURCE as the user wrote it.
        shapes: the inputs, described (``1x3x224x224``).

    Returns:
        The error to raise: "the forward raised ... at FILE:LINE" for an error of the model's own
        code, "rejected its input (SHAPES) ...; pass shapes it accepts with --input" otherwise.
    """
    cause = error.__cause__
    where = f" in module '{error.module_path}'" if error.module_path else ""
    reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(error)
    frame = raised_in_own_code(cause) if cause is not None else None
    if frame is not None:
        code = f" ({one_line(frame.line, 120)})" if frame.line else ""
        return UsageError(
            f"{source}: the model's forward raised {one_line(reason, 240)}{where}, at "
            f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}{code}: an "
            "error in the model's code, not in its input (FLOPSCOPE_TRACEBACK=1 shows the "
            "traceback)")
    return UsageError(
        f"{source} rejected its input ({shapes}){where}: {one_line(reason, 240)}; pass shapes it "
        "accepts with --input")
