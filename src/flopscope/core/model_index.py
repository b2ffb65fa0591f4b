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
from itertools import chain, compress
from operator import add, attrgetter, is_not, itemgetter
from typing import Any

from torch import nn

from flopscope.core.params import packed_objects, param_table, uninitialized

__all__ = ["ModelTables", "ModelTensors", "model_tables"]


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
        # set by model_tables: the stamp (None: never reused); lazy modules not initialised yet
        # (their tensors have no shape, so no stamp: their parameters count 0 now and are counted
        # again when the report is made); weak references to the modules (when stamped)
        self.stamp: list[Any] | None = None
        self.uninitialized: list[str] = []
        self.refs: list[Any] = []


_shape_and_grad = attrgetter("shape", "requires_grad")
_shape = attrgetter("shape")
_is_meta = attrgetter("is_meta")
_not_none = partial(is_not, None)
_deref = weakref.ref.__call__  # a weak reference's object (None once it is gone)
_values = dict.values
# a module's tables and flags, read from its __dict__ (an itemgetter on a dict: nn.Module's
# __getattr__ makes an attribute read of a module several times dearer)
_TABLE_KEYS = ("_modules", "_parameters", "_buffers", "_forward_pre_hooks", "_forward_hooks")
_tables_of = itemgetter(*_TABLE_KEYS)
_table_attrs = attrgetter(*_TABLE_KEYS)
# id(model) -> (weak reference to it, its tables)
_TABLES: dict[int, tuple[Any, ModelTables]] = {}


class ModelTensors:
    """A model's module tables and the tensors in them as they are now, read all at once: each
    step is one pass in C over every module or every tensor (``map`` over a list), not Python per
    module. Made at every count (:func:`model_tables`); the model's stamp, the snapshot
    (:class:`~flopscope.execution.snapshot.ModelSnapshot`) and :func:`~flopscope.execution.how.on_meta`
    all read these lists instead of walking the modules again.

    Attributes:
        modules: the modules (``named_modules()`` order).
        attrs: their instance dicts.
        plain: every module's children, parameter and buffer tables are plain dicts (no
            TorchScript module).
        children: each module's child table.
        param_tables, buffer_tables: each module's parameter and buffer table.
        param_names, params: every module's parameter names and entries (``None`` kept), flat,
            in module order; likewise ``buffer_names`` and ``buffers``.
        eager: the modules whose parameter table is a plain dict (not TorchScript modules).
        hooked: the eager modules with forward hooks or forward pre-hooks.
    """

    __slots__ = ("_meta", "attrs", "buffer_names", "buffer_tables", "buffers", "children", "eager",
                 "hooked", "modules", "param_names", "param_tables", "params", "plain")

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self.attrs: list[dict[str, Any]] = list(map(vars, modules))
        try:
            rows = list(map(_tables_of, self.attrs))
        except (KeyError, TypeError):  # (not set in the instance dict: read as attributes)
            rows = list(map(_table_attrs, modules))
        children, params, buffers, pre, post = (list(c) for c in zip(*rows, strict=True)) \
            if rows else ([], [], [], [], [])
        self.children: list[Any] = children
        self.param_tables: list[Any] = params
        self.buffer_tables: list[Any] = buffers
        self.plain = {dict}.issuperset(map(type, chain(children, params, buffers)))
        if self.plain:
            self.eager = modules
            self.param_names: list[str] = list(chain.from_iterable(params))
            self.params: list[Any] = list(chain.from_iterable(map(_values, params)))
            self.buffer_names: list[str] = list(chain.from_iterable(buffers))
            self.buffers: list[Any] = list(chain.from_iterable(map(_values, buffers)))
        else:  # TorchScript modules: their tables are not dicts
            keep = [type(t) is dict for t in params]
            self.eager = list(compress(modules, keep))
            pre, post = list(compress(pre, keep)), list(compress(post, keep))
            self.param_names = [k for t in params for k, _ in t.items()]
            self.params = [v for t in params for v in t.values()]
            self.buffer_names = [k for t in buffers for k, _ in t.items()]
            self.buffers = [v for t in buffers for v in t.values()]
        self.hooked: list[nn.Module] = list(compress(self.eager, map(add, map(len, pre),
                                                                     map(len, post))))
        self._meta: bool | None = None

    def on_meta(self) -> bool:
        """Whether a parameter or buffer of the modules is on ``meta`` (see
        :func:`~flopscope.execution.how.on_meta`)."""
        if self._meta is None:
            self._meta = any(map(_is_meta, filter(_not_none, chain(self.params, self.buffers))))
        return self._meta


def _stamp(tensors: ModelTensors, packed: frozenset[int]) -> list[Any] | None:
    """Everything a model's :class:`ModelTables` are made from, as a list of plain values: each
    module's class and number of attributes, its children, parameters and buffers (names and
    identities), every parameter's and buffer's shape, whether each parameter requires grad, and
    the packed-parameter objects of the modules that hold them. Equal stamps, equal tables: a
    structural change anywhere in the tree changes some module's children. ``None`` for a model
    with TorchScript modules (their tables are not plain dicts; never reused) or with a lazy
    module's uninitialised tensor (no shape yet). Each part is one pass in C over all modules or
    all tensors; the lengths per module make the flat lists say which module holds what."""
    if not tensors.plain:
        return None
    modules, children = tensors.modules, tensors.children
    params, buffers = tensors.params, tensors.buffers
    out: list[Any] = [
        list(map(type, modules)), list(map(len, tensors.attrs)),
        list(map(len, children)), list(chain.from_iterable(children)),
        list(map(id, chain.from_iterable(map(_values, children)))),
        list(map(len, tensors.param_tables)), tensors.param_names,
        list(map(id, params)),  # (an entry set to None is told by its id: None's)
        list(map(len, tensors.buffer_tables)), tensors.buffer_names, list(map(id, buffers))]
    try:
        out.append(list(map(_shape_and_grad, filter(_not_none, params))))
        out.append(list(map(_shape, filter(_not_none, buffers))))
    except RuntimeError:
        return None
    if packed:
        out.append([id(o) for m in modules if id(m) in packed for o in packed_objects(m)])
    return out


def model_tables(model: nn.Module) -> tuple[ModelTables, ModelTensors]:
    """``model``'s tables, and its modules (``named_modules()`` order) with their tensors as
    they are now: the tables made for it before when its stamp is the same (a model counted
    again: a dictionary lookup and one pass over its modules' tables, instead of
    ``named_modules()`` and the parameter table), otherwise made now and kept for the next
    time."""
    entry = _TABLES.get(id(model))
    if entry is not None and entry[0]() is model:
        tables = entry[1]
        modules: list[Any] = list(map(_deref, tables.refs))  # (in C: one pass each)
        if all(map(_not_none, modules)):
            tensors = ModelTensors(modules)
            if _stamp(tensors, tables.packed) == tables.stamp:
                return tables, tensors
    named = list(model.named_modules())
    tables = ModelTables(model, named)
    tensors = ModelTensors([m for _, m in named])
    tables.stamp = _stamp(tensors, tables.packed)
    if tables.stamp is not None:
        tables.refs = [weakref.ref(m) for m in tensors.modules]
        if len(_TABLES) > 1_000:
            _TABLES.clear()
        with suppress(TypeError):  # not weakly referenceable: not kept
            _TABLES[id(model)] = (weakref.ref(model, partial(_forget, id(model))), tables)
    else:
        tables.uninitialized = uninitialized(model)
    return tables, tensors


def _forget(key: int, ref: Any) -> None:
    """A model whose tables are kept was freed: drop its entry (if it is still its own)."""
    entry = _TABLES.get(key)
    if entry is not None and entry[0] is ref:
        del _TABLES[key]


