"""Memoising operator calls on ``meta`` tensors: the shape-only fast path of the counter.

On ``meta`` tensors an operator's outputs and its cost depend on nothing but the metadata of its
arguments (shapes, strides, storage offsets, dtypes), its non-tensor arguments and the default
dtype: there are no values to read. So a call whose every tensor argument is a plain strided
``meta`` tensor is keyed by :func:`signature`, and

- its *outputs* are made again from the metadata the kernel produced the first time
  (:func:`replay`), instead of running the kernel (many meta kernels are Python code in torch:
  ``native_batch_norm`` takes about a millisecond), for operators that return new tensors
  (no output aliases an input, no argument is written) and for in-place operators that write
  only their first argument's values (it is returned: :data:`SELF`); views and operators that
  change metadata (``resize_``, ``transpose_``, ...) still run, and so does every call when
  another dispatch mode sits below the counter's (it must see the call);
- its *cost* is looked up (see ``Counter._record``), instead of building an ``OpCall`` and calling
  the rule, per phase and per Counter (the rules are the Counter's).

Only meta tensors qualify: a real tensor's values can be read by a rule (variable-length attention
offsets, grouped-matmul offsets, sparse ``nnz``, CTC lengths), and so can a fake tensor's when it
holds a constant; nothing is cached when any tensor argument or output is not a plain meta tensor
(subclasses, fake, functional, nested, sparse, complex with its conjugate bit), or when a
non-tensor argument is not one of a few immutable scalar types.

Symbolic counts (:mod:`flopscope.symbolic`) are the one exception: while :func:`symbolic_replay`
holds a fake mode whose shape environment carries the named sizes, calls on that mode's fake
tensors (no constant values) are keyed the same way, sizes and strides as their sympy
expressions, ``SymInt`` arguments (a ``view``'s sizes) likewise. Their outputs are made again as
fake tensors over one meta *template* per output (``FakeTensor(mode, template)``: a few
microseconds, where torch's fake dispatch re-derives every symbolic size, stride and contiguity
flag through ``SymInt`` arithmetic, about a millisecond per call), and their costs are looked up.
The guards a replayed call would add are those its first call added (the same operator on the
same symbolic metadata). Tensors made from one template share its autograd version counter, so
this is done only for a count without backward (no saved tensor's version is ever checked);
outputs whose sizes hold a data-dependent (unbacked) symbol are never replayed (each call makes
its own), nor are outputs with a storage offset. A shape-only simulation's fake mode (static
sizes: :func:`static_replay`) is keyed the same way; its outputs are made fresh
(:mod:`flopscope.core.fake_outputs`), so with backward too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from flopscope.core import fake_outputs as fresh
from flopscope.core.facts import MemoKind, facts

__all__ = ["FAKE_MODES", "OUTPUTS", "SELF", "is_pure", "is_shared", "key_part", "outputs_of", "remember",
           "replay", "replays_fake", "same_size", "signature", "spec", "static_replay",
           "symbolic_replay", "template"]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_STRIDED = torch.strided
_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_META = torch.device("meta")
_empty_strided = torch.empty_strided
_default_dtype = torch.get_default_dtype
# a tensor's place in a key: a marker no scalar argument can equal
_T = object()
# signature -> output spec, shared by every Counter (it depends only on torch's meta kernels)
OUTPUTS: dict[tuple[Any, ...], Any] = {}
_LIMIT = 200_000  # entries before the output cache starts over
_FakeTensor = FakeTensor
_SymInt = torch.SymInt
_modes_below = torch._C._len_torch_dispatch_stack
# symbolic counts running now: id(fake mode) -> (the mode, its shape environment, whether outputs
# are replayed, data-dependent symbol -> the operator that made it); and the keys of their calls
# in OUTPUTS (dropped when the last one ends)
FAKE_MODES: dict[int, tuple[Any, Any, bool, dict[str, str]]] = {}
_FAKE_KEYS: list[tuple[Any, ...]] = []
_F = object()  # the last element of a key made of fake tensors / SymInts (see replays_fake)
_S = object()  # a SymInt's place in a key
_FAKE_ONE = object()  # first element of a spec of one fake output
_FAKE_MANY = object()  # first element of a spec of a tuple or list of fake outputs
_FAKE_SPECS = (_FAKE_ONE, _FAKE_MANY, *fresh.SPECS)
_saw_fake = threading.local()  # per thread: whether the key being made holds a fake tensor
_UNKEYED: set[int] = set()  # ids of prim:: operators, not keyed during a symbolic count


def _add(key: list[Any], a: Any) -> bool:
    """Append an argument's part of a key; ``False`` when the call must not be memoised."""
    ta = type(a)
    if ta is _Tensor or ta is _Parameter:
        if not a.is_meta or a.layout is not _STRIDED or a.is_nested:
            return False
        dtype = a.dtype
        if dtype in _COMPLEX:
            return False
        key.append(_T)
        key.append(a.shape)
        key.append(a.stride())
        key.append(a.storage_offset())
        key.append(dtype)
        return True
    if ta in _SCALARS:
        key.append(ta)  # 1, 1.0 and True are equal keys but promote differently
        key.append(a)
        return True
    if ta is list or ta is tuple:
        key.append(ta)
        key.append(len(a))
        for x in a:
            tx = type(x)
            if tx is int:
                key.append(x)
            elif tx is list or tx is tuple or not _add(key, x):
                return False
        return True
    if FAKE_MODES:
        if ta is _FakeTensor:
            return _add_fake(key, a)
        if ta is _SymInt:
            _saw_fake.yes = True
            key.append(_S)
            key.append(a.node.expr)
            return True
    return False


_OBJECT = object()  # an object's place in a module call's key (key_part)


def key_part(key: list[Any], a: Any) -> bool:
    """Append a module call's argument to its key (:mod:`flopscope.core.replay`): tensors and
    scalars as in :func:`signature`, containers element by element, any other object by
    identity (a cache passed to every layer is the same object); ``False`` when a tensor or a
    symbolic value cannot be keyed."""
    ta = type(a)
    if ta is tuple or ta is list:
        key.append(ta)
        key.append(len(a))
        return all(key_part(key, x) for x in a)
    if ta is dict:
        key.append(ta)
        for k, v in a.items():
            key.append(k)
            if not key_part(key, v):
                return False
        return True
    if ta in _SCALARS or isinstance(a, (_Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _add(key, a)
    key.append(_OBJECT)
    key.append(id(a))
    return True


def _expr(n: Any) -> Any:
    return n.node.expr if type(n) is _SymInt else n


def same_size(a: Any, b: Any) -> bool:
    """Whether two sizes are equal without adding a guard: the same int, or the same expression
    (comparing ``SymInt``s with ``==`` would record a guard in the shape environment)."""
    return bool(_expr(a) == _expr(b))


def _add_fake(key: list[Any], a: Any) -> bool:
    """A fake tensor of a symbolic count's mode, with no constant value: its metadata, sizes as
    expressions."""
    mode = a.fake_mode
    entry = FAKE_MODES.get(id(mode))
    if entry is None or a.layout is not _STRIDED or a.is_nested or a.dtype in _COMPLEX:
        return False
    if a.constant is not None and a.constant.numel():  # values a kernel may read (an empty
        return False  # one, such as a fresh key/value cache, has none)
    _saw_fake.yes = True
    key.append(_T)
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


def signature(func_id: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The memo key of a call, or ``None`` when the call must not be memoised (see the module
    docstring).

    Args:
        func_id: ``id`` of the operator overload.
        args: the positional arguments as the dispatcher passed them.
        kwargs: the keyword arguments.

    Returns:
        A hashable key, or ``None``.
    """
    key: list[Any] = [func_id]
    if FAKE_MODES:
        if func_id in _UNKEYED:  # prim:: metadata queries (prim.device): nothing to remember
            return None
        _saw_fake.yes = False
    for a in args:
        if not _add(key, a):
            return None  # on a real count: the first tensor argument, before anything else
    if kwargs:
        for name, a in kwargs.items():
            key.append(name)
            if not _add(key, a):
                return None
    # the default dtype decides the result type of an integer tensor times a float, and of
    # factory functions given no dtype
    key.append(_default_dtype())
    if FAKE_MODES and getattr(_saw_fake, "yes", False):
        key.append(_F)
    try:
        return tuple(key)
    except RuntimeError:  # pragma: no cover - a size that cannot be read
        return None


def is_shared(key: tuple[Any, ...]) -> bool:
    """Whether what a call with this memo key costs may be remembered for every count of the
    process (plain meta tensors: it depends on their metadata alone), not only for the count
    that made it (fake tensors of a symbolic count, whose rules may add guards to that count's
    shape environment)."""
    return key[-1] is not _F


SELF = ("self",)
"""The remembered outputs of an in-place operator: its first argument, returned as it is."""


def is_pure(func: Any) -> bool:
    """Whether an operator returns only new tensors (no output aliases an argument and no
    argument is written), so that its outputs can be made from their metadata alone."""
    return facts(func).memo_kind == MemoKind.NEW


def outputs_of(func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """What to remember of a call's outputs (see :func:`spec`): ``None`` when the call is not
    memoised at all, ``False`` when only its cost is, :data:`SELF` for an in-place operator that
    returned its first argument, otherwise a :func:`spec` to :func:`replay`.

    Args:
        func: the operator overload.
        args: its positional arguments.
        out: what it returned.

    Returns:
        As above.
    """
    kind = facts(func).memo_kind
    if FAKE_MODES and getattr(func, "namespace", None) == "prim":
        _UNKEYED.add(id(func))
        return None
    if FAKE_MODES and (type(out) is _FakeTensor or type(out) in (tuple, list)
                       or isinstance(out, (torch.SymInt, torch.SymFloat, torch.SymBool))):
        _note_origins(func, out)
        fake = _fake_spec(out) if not isinstance(out, (torch.SymInt, torch.SymFloat,
                                                       torch.SymBool)) else None
        if fake is not None:
            if not FAKE_MODES[id(fake[1])][2]:
                return False  # costs only (a count with backward)
            if kind == MemoKind.SELF and args and out is args[0]:
                return SELF
            if fake[0] in fresh.SPECS:
                return fresh.fresh_or_view(func, args, out, fake)
            return fake if kind == MemoKind.NEW or facts(func).pure_view else False
    if kind == MemoKind.SELF and args and out is args[0]:
        return SELF if _meta_of(out) is not False else None
    made = spec(out)
    if made is None or made is False:
        return made
    return made if kind == MemoKind.NEW else False


def _meta_of(t: Any) -> Any:
    if type(t) is not _Tensor or not t.is_meta or t.layout is not _STRIDED or t.is_nested:
        return False
    if t.dtype in _COMPLEX:
        return False
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def spec(out: Any) -> Any:
    """What :func:`replay` needs to make ``out`` again: ``None`` when an output is not a plain
    meta tensor (then the call is not memoised at all); ``False`` when the outputs are meta
    tensors but cannot be made from metadata alone (a storage offset, a ``None`` among them);
    otherwise ``(shape, stride, dtype)`` for one tensor, or a tuple/list of those.

    Args:
        out: an operator's return value.

    Returns:
        The spec, ``False`` or ``None``.
    """
    if type(out) is _Tensor:
        m = _meta_of(out)
        if m is False:
            return None
        return (m[0], m[1], m[3]) if m[2] == 0 else False
    if type(out) is tuple or type(out) is list:
        parts = []
        replayable = True
        for t in out:
            if not isinstance(t, _Tensor):
                if t is None or type(t) in _SCALARS:
                    replayable = False
                    continue
                return None
            m = _meta_of(t)
            if m is False:
                return None
            if m[2] != 0:
                replayable = False
            parts.append((m[0], m[1], m[3]))
        if not replayable:
            return False
        return (type(out), tuple(parts))
    return None


def replay(s: Any, args: tuple[Any, ...] = ()) -> Any:
    """New meta tensors with the metadata of a :func:`spec` (not ``False`` or ``None``).

    Args:
        s: the spec.
        args: the call's arguments (a static fake mode's view is made over the first one's
            storage).

    Returns:
        A tensor, or a tuple or list of tensors.
    """
    if type(s[0]) is tuple:
        return _empty_strided(s[0], s[1], dtype=s[2], device=_META)
    if s[0] is _FAKE_ONE:
        return _FakeTensor(s[1], s[2], s[3])
    if s[0] is _FAKE_MANY:
        fakes = [_FakeTensor(s[1], t, d) for t, d in s[3]]
        return tuple(fakes) if s[2] is tuple else fakes
    if s[0] in fresh.SPECS:
        return fresh.replay(s, args)
    made = [_empty_strided(p[0], p[1], dtype=p[2], device=_META) for p in s[1]]
    return tuple(made) if s[0] is tuple else made


def remember(key: tuple[Any, ...], s: Any) -> None:
    """Keep an output spec for a key (the cache starts over past a bound on its size)."""
    if len(OUTPUTS) >= _LIMIT:
        OUTPUTS.clear()
    OUTPUTS[key] = s
    # a symbolic count's entries go when it ends: keys made of its fake tensors, and any key whose
    # outputs are its fake tensors (a factory given only scalars has the key a real count's call
    # would have, and must not hand that count a fake tensor)
    if key[-1] is _F or (type(s) is tuple and s and s[0] in _FAKE_SPECS):
        _FAKE_KEYS.append(key)


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
        elif isinstance(t, (torch.SymInt, torch.SymFloat, torch.SymBool)):
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
    """What :func:`replay` needs to make a symbolic count's fake outputs again (templates), or
    a static mode's (fresh meta tensors), or ``None``."""
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
    without backward: see :func:`symbolic_replay`)."""
    entry = FAKE_MODES.get(id(mode))
    return entry is not None and entry[0] is mode and bool(entry[2])


@contextmanager
def static_replay(mode: Any) -> Iterator[None]:
    """While the block runs, calls on ``mode``'s fake tensors (a fake mode without a shape
    environment, as a shape-only simulation's) are memoised as a symbolic count's are: their
    costs looked up, their outputs made again by :mod:`flopscope.core.fake_outputs` (new
    tensors fresh, views over their base's storage), so with backward too.

    Args:
        mode: the ``FakeTensorMode`` (``shape_env`` ``None``).

    Yields:
        Nothing.

    Raises:
        ValueError: the mode has a shape environment (use :func:`symbolic_replay`).
    """
    if getattr(mode, "shape_env", None) is not None:
        raise ValueError("static_replay() takes a fake mode without a shape environment; "
                         "use symbolic_replay() for a symbolic count's")
    with symbolic_replay(mode):
        yield


@contextmanager
def symbolic_replay(mode: Any, *, replay: bool = True,
                    origins: dict[str, str] | None = None) -> Iterator[None]:
    """While the block runs, calls on ``mode``'s fake tensors are memoised (see the module
    docstring); their entries are dropped at the end.

    Args:
        mode: the ``FakeTensorMode`` of a symbolic count (with a ``ShapeEnv``).
        replay: make outputs from templates (a count without backward); ``False``: costs only.
        origins: filled with data-dependent (unbacked) symbol name -> the operator whose output
            first held it (``u0`` -> ``aten.nonzero.default``), for error messages.

    Yields:
        Nothing.
    """
    FAKE_MODES[id(mode)] = (mode, mode.shape_env, replay, {} if origins is None else origins)
    try:
        yield
    finally:
        del FAKE_MODES[id(mode)]
        if not FAKE_MODES:
            for k in _FAKE_KEYS:
                OUTPUTS.pop(k, None)
            _FAKE_KEYS.clear()
