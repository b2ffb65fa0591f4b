"""Outputs of a *static* fake mode's calls made again from metadata (the shape-only memo of
:mod:`flopscope.core.memo` for :func:`~flopscope.core.memo.static_replay`).

A shape-only simulated rank runs on fake CPU tensors (FSDP2 refuses meta parameters) in a fake
mode without a shape environment: every size is a plain integer, and an operator's outputs
depend on nothing but its arguments' metadata. torch's fake mode caches its answers too, but a
cache hit still hashes every argument and builds the output in Python (about 90 microseconds
a call here); a decoder layer is about a thousand such calls, most of them views. So the memo
keys such calls by metadata and, from the second call on, makes the outputs here:

- an operator that returns new tensors (no output holds an argument's storage: checked on the
  first call, since ``_unsafe_view``'s schema declares no alias but its output holds its
  input's storage) gets a *fresh* meta tensor per output, wrapped as a fake tensor of the mode:
  its own storage, of exactly the bytes the first call's output had (else it is not made again),
  and its own autograd version counter, so that a count with backward may replay too;
- a view of its first argument (``view``, ``t``, ``detach``, ``transpose``, ...) is made over
  that argument's storage, at the size, stride and storage offset the first call gave (the key
  holds the argument's own offset), as torch's fake cache does;
- anything else (in-place, ``out=``, several views, an output with a constant) runs in the mode.

The tensors are made with torch's dispatch off (``torch._C._DisableTorchDispatch``): plain meta
tensors, which no mode sees, as the fake mode's own kernels make them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from flopscope.core.facts import MemoKind, facts

__all__ = ["SPECS", "fresh_or_view", "replay", "spec"]

_FakeTensor = FakeTensor
_empty_strided = torch.empty_strided
_META = torch.device("meta")
_STRIDED = torch.strided
_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
_NoDispatch = torch._C._DisableTorchDispatch
_ONE = object()  # first element of a spec of one output made fresh
_MANY = object()  # ... of a tuple or list of outputs made fresh
_VIEW = object()  # ... of one view of the first argument's storage
SPECS = (_ONE, _MANY, _VIEW)
"""The first elements of the specs made here (a spec is a tuple that starts with one)."""


def _make(mode: Any, meta: tuple[Any, ...], storage: Any) -> Any:
    """A fake tensor of ``mode`` with the metadata ``(shape, stride, offset, dtype, device,
    requires_grad)`` over a new meta storage, or over ``storage`` (a view)."""
    with _NoDispatch():
        made = _empty_strided(meta[0], meta[1], dtype=meta[3], device=_META)
        if storage is not None:
            made.set_(storage, meta[2], meta[0], meta[1])
    if meta[5]:
        made.requires_grad_(True)
    return _FakeTensor(mode, made, meta[4])


def replay(s: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
    """The outputs of a spec made here (:data:`SPECS`).

    Args:
        s: the spec.
        args: the call's arguments (a view is made over the first one's storage).

    Returns:
        A fake tensor, or a tuple or list of them.
    """
    if s[0] is _ONE:
        return _make(s[1], s[2], None)
    if s[0] is _VIEW:
        return _make(s[1], s[2], args[0].untyped_storage())
    fakes = [_make(s[1], p, None) for p in s[3]]
    return tuple(fakes) if s[2] is tuple else fakes


def _metadata(t: Any, mode: Any) -> tuple[tuple[Any, ...], bool] | None:
    """``(shape, stride, offset, dtype, device, requires_grad)`` of a fake output of ``mode``
    (no constant), and whether a fresh meta tensor makes it again exactly (no storage offset, a
    storage of exactly its extent); ``None`` when it is not such an output."""
    if type(t) is not _FakeTensor or t.fake_mode is not mode or t.constant is not None \
            or t.layout is not _STRIDED or t.is_nested or t.dtype in _COMPLEX or t.is_conj() \
            or t.is_neg():
        return None
    meta = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device,
            t.requires_grad)
    with _NoDispatch():
        made = _empty_strided(meta[0], meta[1], dtype=meta[3], device=_META)
    return meta, bool(meta[2] == 0
                      and made.untyped_storage().nbytes() == t.untyped_storage().nbytes())


def spec(mode: Any, out: Any) -> tuple[Any, ...] | None:
    """What :func:`replay` needs to make a call's outputs (fake tensors of ``mode``) again, before
    :func:`fresh_or_view` says whether it may; ``None`` when an output is not such a tensor.

    Args:
        mode: the static fake mode.
        out: the call's return value (a fake tensor, or a tuple or list of them).

    Returns:
        The spec, or ``None``.
    """
    outs = (out,) if type(out) is _FakeTensor else out
    parts = [_metadata(t, mode) for t in outs]
    if any(p is None for p in parts):
        return None
    exact = all(p[1] for p in parts if p is not None)
    if type(out) is _FakeTensor:
        return (_ONE, mode, parts[0][0], exact)  # type: ignore[index]
    return (_MANY, mode, type(out), tuple(p[0] for p in parts if p is not None), exact)


def fresh_or_view(func: Any, args: tuple[Any, ...], out: Any, s: tuple[Any, ...]) -> Any:
    """What the memo keeps of a call whose outputs have the spec ``s`` (:func:`spec`): ``s``
    for an operator whose outputs are new tensors, a view's spec for a view of the first
    argument, ``False`` (its cost only) otherwise.

    Args:
        func: the operator overload.
        args: its positional arguments.
        out: what it returned.
        s: its outputs' spec.

    Returns:
        A spec or ``False``.
    """
    f = facts(func)
    if f.memo_kind == MemoKind.NEW and s[-1] and not _shares(args, out):
        return s
    if s[0] is _ONE and f.pure_view and args and type(args[0]) is _FakeTensor \
            and out.untyped_storage()._cdata == args[0].untyped_storage()._cdata:
        return (_VIEW, s[1], s[2])
    return False


def _shares(args: tuple[Any, ...], out: Any) -> bool:
    """Whether an output holds the storage of a tensor argument."""
    held = {t.untyped_storage()._cdata for a in args
            for t in (a if type(a) in (tuple, list) else (a,)) if type(t) is _FakeTensor}
    return any(t.untyped_storage()._cdata in held
               for t in (out if type(out) in (tuple, list) else (out,)))
