"""A real call's cost key (and its remembered cost) found again by one C call on its tensors.

:func:`~flopscope.core.cost_memo.cost_key` reads five getters per tensor (layout, ``is_meta``,
dtype, sizes, strides) on every argument and output, and the key is hashed again to look its cost
up: about a third of a counted call's own work. A model calls the same operator in the same module
with the same metadata at every forward, so :func:`call_key` keeps, per (operator, module), the
last few keys it made, each with a *template* of its call: the number of arguments, where its
tensors were, its other arguments and keywords, what it returned, and torch's C tensor guard
(``torch._C._dynamo.guards.TensorGuards``, what a compiled function checks its inputs with) built
on its tensors. A later call in that module matches a template when

- it has as many arguments, the same keywords, and its other arguments are equal to the
  template's, of the same Python types where the operator's schema lets the type vary (a
  ``Tensor`` or ``Scalar`` argument: ``x * 2`` and ``x * y`` are both ``mul.Tensor``, and
  ``1``, ``1.0`` and ``True`` are told apart as in the key; an ``int[]``, ``bool`` or ``float``
  argument always arrives as that type from the dispatcher), compared before any value, so no
  tensor's ``==`` is ever called;
- it returned the same kind of thing (one tensor, a tuple of as many, or its own argument, as an
  in-place operator does);
- its tensors pass the guard: exact Python type, dispatch keys (which include layout and device),
  dtype, device index, ``requires_grad``, every size and stride: all that :func:`cost_key` reads
  of a tensor, and more.

Then its key is the template's, equal to what :func:`cost_key` would make; anything else makes
the key as before and a new template. Each template has a cell (:data:`Cell`) where the recorder
keeps the cost it found under the key (rule and phase with it), so the next call that matches
the template skips the memo's hash of the key too. A template holds no tensor (the guard keeps
types, sizes and strides only), so a freed module whose id is reused can only miss.

Without the guard (an older or newer torch that has none) every key is made by
:func:`cost_key`.
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter
from typing import Any

import torch
from torch import nn

from flopscope.core.cost_memo import cost_key

try:  # torch's C tensor guard (Dynamo's); built only with both keywords (without them it crashes)
    from torch._C._dynamo.guards import TensorGuards  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # pragma: no cover (torch without Dynamo's C guards)
    TensorGuards = None  # type: ignore[misc,assignment]

__all__ = ["Cell", "call_key", "forget_templates"]

#: a keyed call's key, then the rule, phase and cost last found under it (``None`` until then)
Cell = list[Any]

_Tensor = torch.Tensor
_Parameter = nn.Parameter
_NoneType = type(None)
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_INTS = frozenset({int})
# schema types whose Python type the dispatcher fixes (a ScalarType, Layout or MemoryFormat is
# shown as "int" and arrives as a torch.dtype, torch.layout or torch.memory_format)
_FIXED = frozenset({"int", "bool", "float", "str", "Device", "List[int]", "List[bool]",
                    "List[float]", "List[str]"})
_PER_PLACE = 4  # templates kept per (operator, module), the latest first
_LIMIT = 20_000  # (operator, module) places kept before the table starts over
# (id(operator), id(module)) -> templates (see _template for their fields)
_TEMPLATES: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
# a place where calls are keyed directly: one call there had no template, or more call shapes
# were seen there than are kept (templates would be made again and again)
_NEVER: list[tuple[Any, ...]] = []


def call_key(func: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             out: Any) -> Cell | None:
    """The :data:`Cell` of a call made in ``module`` (``None``: outside any module; keyed
    directly) with its :func:`~flopscope.core.cost_memo.cost_key`, from a template of an earlier
    call there when one matches (see the module docstring); ``None`` when the call has no key."""
    func_id = id(func)
    place: tuple[int, int] | None = None  # (None: the call is keyed directly)
    found = None
    if module is not None and TensorGuards is not None:
        place = (func_id, id(module))
        found = _TEMPLATES.get(place)
        if found is _NEVER:
            place = None
        elif found is not None:
            n_args = len(args)
            for n, tensors, typed, pick, others, kw, nout, check, kept in found:
                if n_args != n:
                    continue
                if typed:  # where the schema lets the type vary: types before any value
                    same = True
                    for i, t in typed:
                        if type(args[i]) is not t:
                            same = False
                            break
                    if not same:
                        continue
                if pick is not None and pick(args) != others:
                    continue
                if kwargs:
                    if kw is None or tuple(kwargs.items()) != kw:
                        continue
                elif kw is not None:
                    continue
                ts = args[:tensors] if type(tensors) is int else tuple(compress(args, tensors))
                if nout is None:  # one tensor returned
                    if not check(*ts, out):
                        continue
                elif type(nout) is int:  # a tuple of tensors
                    if type(out) is not tuple or len(out) != nout or not check(*ts, *out):
                        continue
                elif out is not args[nout[0]] or not check(*ts):  # its argument (in place)
                    continue
                return kept  # type: ignore[no-any-return]
    key = cost_key(func_id, args, kwargs, out)
    if key is None:
        return None
    cell: Cell = [key, None, None, None]  # (the one place a cell is made)
    if place is not None:  # no template matched: this call's becomes one
        _keep(place, found, _template(func, args, kwargs, out, cell))
    return cell


def _keep(place: tuple[int, int], found: list[tuple[Any, ...]] | None,
          template: tuple[Any, ...] | None) -> None:
    """Keep a new template (``None``: the call's shape is not one a template covers) at
    ``place``, whose templates were ``found`` (``None``: none yet)."""
    if found is None:
        if len(_TEMPLATES) >= _LIMIT:
            _TEMPLATES.clear()
        _TEMPLATES[place] = [template] if template is not None else _NEVER
    elif template is None or len(found) >= _PER_PLACE:  # (more call shapes here than kept)
        _TEMPLATES[place] = _NEVER
    else:
        found.insert(0, template)


def _template(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
              cell: Cell) -> tuple[Any, ...] | None:
    """A keyed call's template, or ``None`` when its shape is not one a template covers (tensors,
    scalars and flat lists of integers as arguments, scalar keywords, a tensor, a tuple of
    tensors or an argument returned, no tensor twice): the number of arguments; where the
    tensors are (``k``: the first ``k``; else a mask); ``(position, type)`` of the other
    arguments whose schema type is not fixed; an ``itemgetter`` of the other arguments and what
    it gave; the keywords' items; what was returned (``None``: one tensor; ``n``: a tuple of
    ``n``; ``(i,)``: argument ``i``); the guard's ``check``; the call's :data:`Cell`."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    params = schema.arguments
    mask: list[bool] = []
    tensors: list[torch.Tensor] = []
    positions: list[int] = []
    others: list[Any] = []
    typed: list[tuple[int, type]] = []
    for i, a in enumerate(args):
        ta = type(a)
        is_tensor = ta is _Tensor or ta is _Parameter
        mask.append(is_tensor)
        if is_tensor:
            tensors.append(a)
            continue
        if ta in _SCALARS:
            others.append(a)
        elif (ta is list or ta is tuple) and _INTS.issuperset(map(type, a)):
            others.append(list(a) if ta is list else a)  # (a copy: the caller may change it)
        else:
            return None
        positions.append(i)
        if i >= len(params) or _varies(params[i].type):
            typed.append((i, ta))
    if kwargs:
        by_name = {p.name: p for p in params}
        if not _SCALARS.issuperset(map(type, kwargs.values())) or any(
                name not in by_name or _varies(by_name[name].type) for name in kwargs):
            return None  # (a keyword of a varying type: keyed directly)
    nout: Any
    if type(out) is _Tensor:
        alias = [i for i, a in enumerate(args) if a is out]
        if alias:  # an in-place operator returns its argument: compared by identity
            nout = (alias[0],)
        else:
            nout = None
            tensors.append(out)
    elif type(out) is tuple and all(type(o) is _Tensor for o in out):
        nout = len(out)
        tensors += out
    else:
        return None
    if len(set(map(id, tensors))) != len(tensors):  # (the guard fails on a tensor passed twice)
        return None
    first = mask.index(False) if False in mask else len(mask)
    where: Any = first if not any(mask[first:]) else tuple(mask)
    pick = itemgetter(*positions) if positions else None
    try:  # (a torch whose guard takes other arguments, or refuses these tensors: keyed directly)
        check = TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
    except (TypeError, RuntimeError, ValueError):
        return None
    # (what pick gives: one value, or a tuple of them; lists copied, as the caller may change its)
    picked = None if not positions else others[0] if len(positions) == 1 else tuple(others)
    return (len(args), where, tuple(typed), pick, picked,
            tuple(kwargs.items()) if kwargs else None, nout, check, cell)


def _varies(schema_type: Any) -> bool:
    """Whether an argument of this schema type may arrive as more than one Python type."""
    text = str(schema_type)
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[9:-1]  # (None against a value: told apart by ==)
    return text not in _FIXED


def forget_templates() -> None:
    """Drop every template (tests)."""
    _TEMPLATES.clear()
