"""A model's state, saved before a count runs it and put back after, also when it raises.

What a forward can change, and how each is put back:

- training flags (``model.train(...)`` for the count, or a forward that flips them);
- parameters an operator writes in place (``nn.Embedding(max_norm=...)``), and in a real count
  buffers updated in place (batch-norm running statistics): copy on write by the Counter
  (:meth:`~flopscope.Counter.protect`), restored by the Counter;
- buffers in other runs (also under fake tensors, where ``num_batches_tracked`` is bumped from
  Python): copied before, copied back;
- parameter, buffer and tensor-attribute *slots* a forward replaces (legacy ``spectral_norm`` /
  ``weight_norm`` set ``module.weight`` on every call): the objects put back;
- a parameter's or buffer's storage swapped without any operator (``p.data = other``): aliases
  taken before are compared by storage identity, offset, sizes and strides and the storage put
  back.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, is_, is_not
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from flopscope.core.model_index import ModelTensors

__all__ = ["ModelSnapshot"]

_PLAIN = frozenset({torch.Tensor, nn.Parameter})  # no subclass: data pointers say where it is
_STRIDED = torch.strided


def _same_place(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` is a view of exactly ``b``'s memory: the same storage, offset, sizes and
    strides. A plain CPU or CUDA tensor is compared by data pointer (two live storages never
    share one; ``b``, the alias taken before, keeps the old storage alive); a meta tensor (data
    pointers all 0) or a tensor subclass (a fake tensor has no data to point to) by storage
    identity."""
    if type(a) in _PLAIN and type(b) in _PLAIN and not a.is_meta and not b.is_meta:
        return bool(a.data_ptr() == b.data_ptr() and a.shape == b.shape
                    and a.stride() == b.stride())
    return bool(StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
                and a.storage_offset() == b.storage_offset() and a.shape == b.shape
                and a.stride() == b.stride())


class ModelSnapshot:
    """What a count may change in a model, saved; :meth:`restore` puts it back.

    The training flags and the slots are saved when the snapshot is made; the values (buffers,
    parameter aliases) by :meth:`keep_values`, before the first attempt that can write to the
    model's own tensors (a shape-only count of a real model first runs on meta copies of them,
    which need no copy of any value). Every step reads the model's tables as lists, one pass in
    C over all modules or all tensors (:class:`~flopscope.core.model_index.ModelTensors`).

    Args:
        modules: the model's modules.
        tensors: their tables as a Counter read them just before
            (:attr:`~flopscope.Counter.model_tensors`); read here when not given.
    """

    def __init__(self, modules: list[nn.Module], tensors: ModelTensors | None = None) -> None:
        self.modules = modules
        self.modes = list(map(_training, modules))
        if tensors is None or tensors.modules is not modules:
            tensors = ModelTensors(modules)
        self.tensors = tensors
        # the slots (table, name, object): every parameter and buffer entry of the eager (not
        # TorchScript) modules, and the tensor attributes of the ones with forward hooks, as
        # three lists (restore compares them in C)
        if tensors.plain:
            tables = [*tensors.param_tables, *tensors.buffer_tables]
            self.slot_tables: list[dict[str, Any]] = list(chain.from_iterable(
                map(repeat, tables, map(len, tables))))
            self.slot_names: list[str] = [*tensors.param_names, *tensors.buffer_names]
            self.slot_objects: list[Any] = [*tensors.params, *tensors.buffers]
        else:
            slots = [(t, name, v) for m in tensors.eager for t in (m._parameters, m._buffers)
                     for name, v in t.items()]
            self.slot_tables = [t for t, _, _ in slots]
            self.slot_names = [n for _, n, _ in slots]
            self.slot_objects = [v for _, _, v in slots]
        for m in tensors.hooked:
            attrs = vars(m)
            for name, t in attrs.items():
                if isinstance(t, torch.Tensor):
                    self.slot_tables.append(attrs)
                    self.slot_names.append(name)
                    self.slot_objects.append(t)
        self.buffers: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
        # aliases (no copy) of every parameter, and of every buffer not copied, to undo
        # `t.data = other`, which swaps a tensor's storage without any operator: the tensors
        # and their aliases, as two lists
        self.held: list[torch.Tensor] = []
        self.aliases: list[torch.Tensor] = []
        self.params: list[torch.Tensor] = []  # the model's own (not meta) parameters
        self.own_buffers: list[torch.Tensor] = []  # its buffers, when aliased, not copied
        self.kept = False
        self.copied = False  # every buffer copied
        self.guarded = False  # buffers aliased for copy on write (own_buffers)

    def keep_values(self, *, meta: bool = False, buffers: bool = True) -> None:
        """Alias the parameters and save the buffers' values (each once, however often it is
        called); afterwards :attr:`params` holds the parameters that are not on ``meta`` (what a
        real run protects with copy on write).

        Args:
            meta: the model is on ``meta``: no values to protect, but ``.data =`` can still swap
                a storage or a shape, so every parameter is aliased.
            buffers: copy the buffers' values. ``False``: the caller protects them with copy on
                write instead (a real count: :attr:`own_buffers` lists them for
                :meth:`~flopscope.Counter.protect`, whose write guard also sees batch norm's
                unmarked writes of its running statistics), and they are only aliased here.
        """
        if not self.kept:
            self.kept = True
            held = list(filter(_not_none, self.tensors.params))
            if not meta:
                # (a plain tensor on meta says so in is_meta; a subclass's device may say meta
                # where is_meta does not: a fake tensor of a meta model)
                if not _PLAIN.issuperset(map(type, held)) or self.tensors.on_meta():
                    held = [p for p in held if not p.is_meta
                            and (type(p) in _PLAIN or p.device.type != "meta")]
                self.params = held
            self.held = list(held)
            self.aliases = list(map(_data, held))
        if buffers and not self.copied:
            self.copied = True
            self._copy_buffers(lambda b: True)
        elif not buffers and not self.guarded:
            self.guarded = True
            held = list(filter(_not_none, self.tensors.buffers))
            strided = {_STRIDED}.issuperset(map(_layout, held))
            self.own_buffers = held if strided else [b for b in held if b.layout is _STRIDED]
            self.held += self.own_buffers
            self.aliases += map(_data, self.own_buffers)
            if not strided:  # (sparse: no storage; none in most models)
                self._copy_buffers(lambda b: b.layout is not _STRIDED)

    def _copy_buffers(self, which: Callable[[torch.Tensor], bool]) -> None:
        with torch.no_grad():
            for table in self.tensors.buffer_tables:
                for name, b in table.items():
                    if b is not None and which(b):  # (no grad here: the clone is detached)
                        self.buffers.append((table, name, b, b.clone()))

    def restore(self) -> None:
        """Put everything back (call it in ``finally``; before the write guard's restore, which
        puts values back into the storages this puts back)."""
        if list(map(_training, self.modules)) != self.modes:
            for m, mode in zip(self.modules, self.modes, strict=True):
                m.training = mode
        tables, names, objects = self.slot_tables, self.slot_names, self.slot_objects
        if not all(map(is_, map(dict.get, tables, names), objects)):  # (in C: at every count)
            for table, name, obj in zip(tables, names, objects, strict=True):
                if table.get(name) is not obj:
                    table[name] = obj
        with torch.no_grad():
            held, aliases = self.held, self.aliases
            if held and not _all_in_place(held, aliases):
                for tensor, original in zip(held, aliases, strict=True):
                    if not _same_place(tensor, original):
                        tensor.data = original
            into: list[torch.Tensor] = []
            values: list[torch.Tensor] = []
            for table, name, tensor, value in self.buffers:
                table[name] = tensor
                if tensor.shape == value.shape and tensor.dtype == value.dtype:
                    into.append(tensor)
                    values.append(value)
                else:  # `buffer.data = other` changed its shape: take the saved copy's storage
                    tensor.data = value
            if into:  # one call for every buffer (a copy_ per buffer from Python otherwise)
                torch._foreach_copy_(into, values)


_training = attrgetter("training")
_data = attrgetter("data")
_layout = attrgetter("layout")
_not_none = partial(is_not, None)
_is_set_to = torch.Tensor.is_set_to


def _all_in_place(held: list[torch.Tensor], aliases: list[torch.Tensor]) -> bool:
    """Whether every tensor still views exactly its alias's memory (the same storage, offset,
    sizes and strides: ``Tensor.is_set_to``, one pass in C), for plain strided tensors not on
    ``meta``; ``False`` means: look at each (:func:`_same_place`)."""
    if not _PLAIN.issuperset(map(type, held)):
        return False
    try:  # (an operator call: no dispatch mode of the caller's may see it)
        with _NoDispatch():
            return all(map(_is_set_to, held, aliases))
    except RuntimeError:  # (no kernel for meta or sparse tensors)
        return False


_NoDispatch = torch._C._DisableTorchDispatch
