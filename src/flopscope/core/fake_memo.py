"""The shape-only memo on fake tensors: a symbolic count's and a shape-only simulation's calls.

:mod:`flopscope.core.memo` keys a call on plain ``meta`` tensors by its metadata. While a
symbolic count (or a simulated rank's static fake mode) runs, its fake mode is registered here
(:data:`FAKE_MODES`, by :func:`flopscope.core.memo.symbolic_replay`), and calls on that mode's
fake tensors (no constant values) are keyed the same way, sizes and strides as their sympy
expressions, ``SymInt`` arguments (a ``view``'s sizes) likewise (:func:`add_fake`). A key made of
them ends with a marker (:func:`end_key`): its cost is remembered for that count only
(:func:`is_shared`), and it is answered from memory although the fake mode sits below the
Counter's (:func:`replays_fake`).

Their outputs are made again as fake tensors over one meta *template* per output
(``FakeTensor(mode, template)``: a few microseconds, where torch's fake dispatch re-derives every
symbolic size, stride and contiguity flag through ``SymInt`` arithmetic, about a millisecond per
call; :func:`template`, :func:`fake_outputs_of`, :func:`replay_fake`). The guards a replayed call
would add are those its first call added (the same operator on the same symbolic metadata).
Tensors made from one template share its autograd version counter, so this is done only for a
count without backward (no saved tensor's version is ever checked); outputs whose sizes hold a
data-dependent (unbacked) symbol are never replayed (each call makes its own), nor are outputs
with a storage offset. A static fake mode's outputs are made fresh
(:mod:`flopscope.core.fake_outputs`), so with backward too.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from flopscope.core import fake_outputs as fresh

__all__ = ["FAKE_KEYS", "FAKE_MODES", "KEY", "add_fake", "end_key", "fake_spec", "holds_fake", "is_shared",
           "replay_fake", "replays_fake", "replays_outputs", "same_size", "start_key", "template",
           "unkeyed"]

_STRIDED = torch.strided
_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
_META = torch.device("meta")
_empty_strided = torch.empty_strided
_FakeTensor = FakeTensor
_SymInt = torch.SymInt
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
_modes_below = torch._C._len_torch_dispatch_stack
KEY = object()
"""A tensor's place in a memo key: a marker no scalar argument can equal (shared with
:mod:`flopscope.core.memo`, whose meta tensors take the same place)."""
# symbolic counts running now: id(fake mode) -> (the mode, its shape environment, whether outputs
# are replayed, data-dependent symbol -> the operator that made it); and the keys of their calls
# in memo.OUTPUTS (dropped when the last one ends)
FAKE_MODES: dict[int, tuple[Any, Any, bool, dict[str, str]]] = {}
FAKE_KEYS: list[tuple[Any, ...]] = []
_F = object()  # the last element of a key made of fake tensors / SymInts (see replays_fake)
_S = object()  # a SymInt's place in a key
_FAKE_ONE = object()  # first element of a spec of one fake output
_FAKE_MANY = object()  # first element of a spec of a tuple or list of fake outputs
_FAKE_SPECS = (_FAKE_ONE, _FAKE_MANY, *fresh.SPECS)
_saw_fake = threading.local()  # per thread: whether the key being made holds a fake tensor
_UNKEYED: set[int] = set()  # ids of prim:: operators, not keyed during a symbolic count


def _expr(n: Any) -> Any:
    return n.node.expr if type(n) is _SymInt else n


def same_size(a: Any, b: Any) -> bool:
    """Whether two sizes are equal without adding a guard: the same int, or the same expression
    (comparing ``SymInt``s with ``==`` would record a guard in the shape environment)."""
    return bool(_expr(a) == _expr(b))


def start_key(func_id: int) -> bool:
    """A key of a call is begun while a fake mode is registered: ``False`` when the operator is
    not keyed (prim:: metadata queries, such as ``prim.device``: nothing to remember)."""
    if func_id in _UNKEYED:
        return False
    _saw_fake.yes = False
    return True


def end_key(key: list[Any]) -> None:
    """Mark a finished key that holds a fake tensor or a ``SymInt`` (see :func:`is_shared`)."""
    if getattr(_saw_fake, "yes", False):
        key.append(_F)


def add_fake(key: list[Any], a: Any) -> bool:
    """Append a fake tensor of a registered mode, with no constant value (its metadata, sizes as
    expressions), or a ``SymInt``, to a key; ``False`` for anything else."""
    ta = type(a)
    if ta is _SymInt:
        _saw_fake.yes = True
        key.append(_S)
        key.append(a.node.expr)
        return True
    if ta is not _FakeTensor:
        return False
    mode = a.fake_mode
    entry = FAKE_MODES.get(id(mode))
    if entry is None or a.layout is not _STRIDED or a.is_nested or a.dtype in _COMPLEX:
        return False
    if a.constant is not None and a.constant.numel():  # values a kernel may read (an empty
        return False  # one, such as a fresh key/value cache, has none)
    _saw_fake.yes = True
    key.append(KEY)
    key.append(id(mode))
    if entry[1] is None:  # a static mode: plain integers
        key += (a.shape, a.stride(), a.storage_offset())
    else:
        key += (tuple(_expr(n) for n in a.shape), tuple(_expr(n) for n in a.stride()),
                _expr(a.storage_offset()))
    key.append(a.dtype)
    key.append(a.fake_device)
    key.append(a.requires_grad)
    return True


def is_shared(key: tuple[Any, ...]) -> bool:
    """Whether what a call with this memo key costs may be remembered for every count of the
    process (plain meta tensors: it depends on their metadata alone), not only for the count
    that made it (fake tensors of a symbolic count, whose rules may add guards to that count's
    shape environment)."""
    return key[-1] is not _F


def holds_fake(key: tuple[Any, ...], s: Any) -> bool:
    """Whether a remembered call belongs to a symbolic count and goes when it ends: its key is
    made of the count's fake tensors, or its outputs are (a factory given only scalars has the
    key a real count's call would have, and must not hand that count a fake tensor)."""
    return key[-1] is _F or (type(s) is tuple and bool(s) and s[0] in _FAKE_SPECS)


def unkeyed(func: Any) -> bool:
    """Whether ``func`` is a prim:: operator (a metadata query such as ``prim.device``), whose
    calls are not keyed while a fake mode is registered (see :func:`start_key`)."""
    if getattr(func, "namespace", None) == "prim":
        _UNKEYED.add(id(func))
        return True
    return False


def fake_spec(func: Any, out: Any) -> Any:
    """What :func:`replay_fake` needs to make a call's outputs on a registered mode's fake
    tensors again: ``(marker, mode, ...)``, the mode second; ``None`` when they are not such
    outputs or cannot be made again. Notes the operator that made each data-dependent symbol
    among them, for error messages."""
    if type(out) is _FakeTensor or type(out) in (tuple, list) or isinstance(out, _SYM):
        _note_origins(func, out)
        return _fake_spec(out) if not isinstance(out, _SYM) else None
    return None


def replay_fake(s: Any, args: tuple[Any, ...]) -> Any:
    """Fake tensors with the metadata of a :func:`fake_spec` (or of
    :func:`flopscope.core.fake_outputs.fresh_or_view`'s spec)."""
    if s[0] is _FAKE_ONE:
        return _FakeTensor(s[1], s[2], s[3])
    if s[0] is _FAKE_MANY:
        fakes = [_FakeTensor(s[1], t, d) for t, d in s[3]]
        return tuple(fakes) if s[2] is tuple else fakes
    return fresh.replay(s, args)


def template(t: Any, env: Any) -> Any:
    """A meta tensor with ``t``'s metadata (made once per memo key), or ``None`` when ``t`` must
    not be made again from one: not a fake tensor of a symbolic count, a constant, a storage
    offset, a size that holds a data-dependent symbol."""
    if type(t) is not _FakeTensor or id(t.fake_mode) not in FAKE_MODES or t.constant is not None \
            or t.layout is not _STRIDED or t.is_nested or t.dtype in _COMPLEX \
            or t.is_conj() or t.is_neg():
        return None
    offset = t.storage_offset()
    shape, stride = t.shape, t.stride()
    known = env.backed_var_to_val  # the backed symbols (input sizes), not data-dependent ones
    for n in (*shape, *stride, offset):
        if type(n) is _SymInt and not all(x in known for x in n.node.expr.free_symbols):
            return None  # an unbacked (data-dependent) size: every call makes its own
    with _disable_current_modes(), env.suppress_guards():
        if type(offset) is int and offset == 0:
            return _empty_strided(shape, stride, dtype=t.dtype, device=_META)
        # a view at an offset (a slice): a storage that holds it, viewed at that offset
        extent = offset + 1
        for n, st in zip(shape, stride, strict=True):
            extent = extent + (n - 1) * st
        storage = torch.empty(extent, dtype=t.dtype, device=_META)
        return storage.as_strided(shape, stride, offset)


def _note_origins(func: Any, out: Any) -> None:
    """Remember which operator made each data-dependent symbol among ``out``'s sizes or values."""
    exprs = []
    env = None
    for t in (out if type(out) in (tuple, list) else (out,)):
        if type(t) is _FakeTensor:
            exprs += [n.node.expr for n in (*t.shape, *t.stride()) if type(n) is _SymInt]
            env = t.fake_mode.shape_env
        elif isinstance(t, _SYM):
            exprs.append(t.node.expr)
            env = t.node.shape_env
    if not exprs:
        return
    entry = next((e for e in FAKE_MODES.values() if e[1] is env), None)
    if entry is None:
        return
    known = env.backed_var_to_val  # type: ignore[union-attr]
    for e in exprs:
        for symbol in e.free_symbols:
            if symbol not in known:
                entry[3].setdefault(str(symbol), str(func))


def _fake_spec(out: Any) -> Any:
    """What :func:`replay_fake` needs to make a symbolic count's fake outputs again (templates),
    or a static mode's (fresh meta tensors), or ``None``."""
    first: Any = out if type(out) is _FakeTensor else out[0] if type(out) in (tuple, list) \
        and out else None
    if type(first) is _FakeTensor:
        entry = FAKE_MODES.get(id(first.fake_mode))
        if entry is not None and entry[1] is None:  # a static mode (see static_replay)
            return fresh.spec(entry[0], out)
    if type(out) is _FakeTensor:
        entry = FAKE_MODES.get(id(out.fake_mode))
        tpl = template(out, entry[1]) if entry is not None else None
        return None if tpl is None else (_FAKE_ONE, out.fake_mode, tpl, out.fake_device)
    if not out or type(out[0]) is not _FakeTensor:
        return None
    entry = FAKE_MODES.get(id(out[0].fake_mode))
    if entry is None:
        return None
    parts = []
    for t in out:
        tpl = template(t, entry[1])
        if tpl is None or t.fake_mode is not entry[0]:
            return None
        parts.append((tpl, t.fake_device))
    return (_FAKE_MANY, entry[0], type(out), tuple(parts))


def replays_fake(key: tuple[Any, ...]) -> bool:
    """Whether a call keyed by ``key`` may be answered from memory although a dispatch mode sits
    below the Counter's: it is a symbolic count's call and that mode is the count's fake mode
    (the only one below; another mode, e.g. a ``FlopCounterMode`` around the count, must see
    every call)."""
    return key[-1] is _F and _modes_below() == 1


def replays_outputs(mode: Any) -> bool:
    """Whether ``mode`` is the fake mode of a running symbolic count that replays outputs (one
    without backward: see :func:`flopscope.core.memo.symbolic_replay`)."""
    entry = FAKE_MODES.get(id(mode))
    return entry is not None and entry[0] is mode and bool(entry[2])
