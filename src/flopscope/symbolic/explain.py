"""Why a symbolic count could not run a model: the operator or the line of Python that needed a
concrete size or a value, said in one message."""

from __future__ import annotations

import re
from collections.abc import Mapping

from flopscope.errors import ForwardError
from flopscope.symbolic.fake import CONCRETE_SIZES_ONLY

__all__ = ["explain"]


def explain(e: ForwardError, origins: Mapping[str, str]) -> str:
    """A failure under symbolic sizes in words: the operator that was running (from the dispatch
    mode's frame) and the module (in ``e``); for a data-dependent size or value also the operator
    that made each data-dependent symbol (``u0``: ``aten.nonzero.default``)."""
    text = str(e)
    cause: BaseException | None = e.__cause__
    while cause is not None:
        name = type(cause).__name__
        if "DataDependent" in name or "data-dependent" in str(cause).lower():
            op = _running_operator(cause)
            if op is None:
                found = re.search(r"(aten\.[\w.]+|torch\.ops\.[\w.]+)", str(cause))
                op = found.group(1) if found else None
            made = [f"{u}: a size or value made by {origins[u]}"
                    for u in dict.fromkeys(re.findall(r"\bu\d+\b", str(cause))) if u in origins]
            return (f"symbolic counting hit a data-dependent size or value"
                    f"{' in operator ' + op if op else ''}"
                    f"{' (' + '; '.join(made) + ')' if made else ''}: {text}. A size computed "
                    "from tensor values cannot be a formula of the input sizes; count concretely, "
                    "or make that size an input.")
        cause = cause.__cause__ or cause.__context__
    running = next((r for r in map(_running_operator, _chain(e)) if r is not None), None)
    why = ""
    if CONCRETE_SIZES_ONLY in text:  # a C++ kernel given a size that is a formula
        caller = None if running else next((_innermost_python(c) for c in _chain(e)
                                            if CONCRETE_SIZES_ONLY in str(c)
                                            and not isinstance(c, ForwardError)), None)
        why = (" (PyTorch's kernel" + (f" called by {caller}" if caller else "")
               + " takes its sizes as concrete integers only, and here a size is a formula of"
               " the symbolic sizes; count at concrete sizes)")
    return (f"symbolic counting failed{' in operator ' + running if running else ''}{why}: "
            f"{text}")


def _innermost_python(exc: BaseException) -> str | None:
    """The innermost Python function of ``exc``'s traceback, as ``module.function``: the one
    that called a C++ kernel (``torch.nn.functional.interpolate``)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame
        tb = tb.tb_next
    if last is None:
        return None
    module = last.f_globals.get("__name__", "?")
    return f"{module}.{last.f_code.co_name}"


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and its causes, outermost first."""
    out: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and cause not in out:
        out.append(cause)
        cause = cause.__cause__ or cause.__context__
    return out


def _running_operator(exc: BaseException) -> str | None:
    """The innermost operator flopscope's dispatch mode was handling where ``exc`` was raised
    (the ``func`` of its ``__torch_dispatch__`` frame), or ``None`` (raised in the model's own
    code, between operators)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__torch_dispatch__" and "flopscope" in frame.f_code.co_filename:
            func = frame.f_locals.get("func")
            if func is not None:
                found = str(func)
        tb = tb.tb_next
    return found
