"""The model index: a model's module paths, type names and parameter table, made once and reused by
later counts while the model's structure is unchanged (:func:`model_tables`).

A structural stamp (each module's class, children, parameters and buffers by identity, shapes,
``requires_grad``) tells whether tables made earlier still hold; the model is held only weakly,
so the index never keeps a model alive.
"""

from __future__ import annotations

import weakref
from contextlib import suppress
from functools import partial
from operator import attrgetter, is_not
from typing import Any

from torch import nn

from flopscope.core.params import packed_objects, param_table, uninitialized

__all__ = ["ModelTables", "model_tables"]


class ModelTables:
    """A model's module paths, types and parameter counts, as a :class:`ModuleTracker` starts
    from them: worked out once per model and reused while the model's structure is unchanged
    (see :func:`model_tables`). Holds the modules only weakly, so that it never keeps a model
    alive."""

    __slots__ = ("module_paths", "packed", "param_paths", "params", "refs", "shared", "stamp",
                 "types", "uninitialized")

    def __init__(self, model: nn.Module, named: list[tuple[str, nn.Module]]) -> None:
        stats, owners = param_table(model, named)
        modules = [m for _, m in named]
        self.module_paths = [name for name, _ in named]
        self.types = {name: type(m).__name__ for name, m in named}
        self.params = stats
        self.param_paths = owners
        known = {id(m): name for name, m in named}
        self.shared: set[int] = set()  # ids of modules registered under more than one path
        for name, sub in model.named_modules(remove_duplicate=False):
            if name and known.get(id(sub)) != name:
                self.shared.add(id(sub))
                self.types.setdefault(name, type(sub).__name__)
        # modules holding quantized packed-parameter objects (their ids are part of the stamp)
        self.packed = frozenset(id(m) for m in modules if packed_objects(m))
        self.stamp = _stamp(modules, self.packed)
        # lazy modules not initialised yet (their tensors have no shape, so no stamp): their
        # parameters count 0 now and are counted again when the report is made
        self.uninitialized = uninitialized(model) if self.stamp is None else []
        self.refs = [weakref.ref(m) for m in modules] if self.stamp is not None else []


_shape_and_grad = attrgetter("shape", "requires_grad")
_shape = attrgetter("shape")
_not_none = partial(is_not, None)
# id(model) -> (weak reference to it, its tables)
_TABLES: dict[int, tuple[Any, ModelTables]] = {}


def _stamp_tensors(extend: Any, table: dict[str, Any], describe: Any) -> bool:
    """Add a parameter or buffer table's part of a stamp: names, identities and ``describe`` of
    each tensor; ``False`` when a tensor has no shape yet (a lazy module's uninitialised one)."""
    extend(table)
    held = table.values()
    extend(map(id, held))  # (an entry set to None is told by its id: None's)
    try:
        extend(map(describe, filter(_not_none, held)))  # (all in C: no Python call per tensor)
    except RuntimeError:
        return False
    return True


def _stamp(modules: list[nn.Module], packed: frozenset[int]) -> list[Any] | None:
    """Everything a model's :class:`ModelTables` are made from, as a flat list of plain values: each
    module's class and number of attributes, its children, parameters and buffers (names and
    identities), every parameter's and buffer's shape, whether each parameter requires grad, and
    the packed-parameter objects of the modules that hold them. Equal stamps, equal tables: a
    structural change anywhere in the tree changes some module's children. ``None`` for a model
    with TorchScript modules (their tables are not plain dicts; never reused)."""
    out: list[Any] = []
    push = out.append
    extend = out.extend
    for m in modules:
        children = m._modules
        params = m._parameters
        buffers = m._buffers
        if type(params) is not dict or type(buffers) is not dict or type(children) is not dict:
            return None
        push(type(m))
        push(len(m.__dict__))
        push(len(children))
        extend(children)
        extend(map(id, children.values()))
        push(len(params))
        if params and not _stamp_tensors(extend, params, _shape_and_grad):
            return None
        push(len(buffers))
        if buffers and not _stamp_tensors(extend, buffers, _shape):
            return None
        if packed and id(m) in packed:
            extend(map(id, packed_objects(m)))
    return out


def model_tables(model: nn.Module) -> tuple[ModelTables, list[nn.Module]]:
    """``model``'s tables and modules (``named_modules()`` order): the tables made for it before
    when its stamp is the same (a model counted again: a dictionary lookup and one walk over its
    modules, instead of ``named_modules()`` and the parameter table), otherwise made now and
    kept for the next time."""
    entry = _TABLES.get(id(model))
    if entry is not None and entry[0]() is model:
        tables = entry[1]
        modules = [r() for r in tables.refs]
        if all(m is not None for m in modules) and _stamp(
                modules, tables.packed) == tables.stamp:  # type: ignore[arg-type]
            return tables, modules  # type: ignore[return-value]
    named = list(model.named_modules())
    tables = ModelTables(model, named)
    if tables.stamp is not None:
        if len(_TABLES) > 1_000:
            _TABLES.clear()
        with suppress(TypeError):  # not weakly referenceable: not kept
            _TABLES[id(model)] = (weakref.ref(model, partial(_forget, id(model))), tables)
    return tables, [m for _, m in named]


def _forget(key: int, ref: Any) -> None:
    """A model whose tables are kept was freed: drop its entry (if it is still its own)."""
    entry = _TABLES.get(key)
    if entry is not None and entry[0] is ref:
        del _TABLES[key]


