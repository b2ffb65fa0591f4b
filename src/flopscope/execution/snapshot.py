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
from operator import attrgetter, is_, methodcaller
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

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
    which need no copy of any value).

    Args:
        modules: the model's modules.
    """

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self.modes = list(map(_training, modules))
        eager = [m for m in modules if type(m._parameters) is dict]  # not TorchScript modules
        self.slots: list[tuple[dict[str, Any], str, Any]] = [
            (m._parameters, name, t) for m in eager for name, t in m._parameters.items()]
        self.slots += [(m._buffers, name, t) for m in eager for name, t in m._buffers.items()]
        self.slots += [(vars(m), name, t) for m in eager if m._forward_pre_hooks or m._forward_hooks
                       for name, t in vars(m).items() if isinstance(t, torch.Tensor)]
        self.buffers: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
        # aliases (no copy) of every parameter, and of every buffer not copied, to undo
        # `t.data = other`, which swaps a tensor's storage without any operator
        self.aliases: list[tuple[torch.Tensor, torch.Tensor]] = []
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
            if meta:
                self.aliases = [(p, p.data) for m in self.modules
                                for p in m._parameters.values() if p is not None]
            else:
                # (a plain tensor on meta says so in is_meta; a subclass's device may say meta
                # where is_meta does not: a fake tensor of a meta model)
                self.params = [p for m in self.modules for p in m._parameters.values()
                               if p is not None and not p.is_meta
                               and (type(p) in _PLAIN or p.device.type != "meta")]
                self.aliases = [(p, p.data) for p in self.params]
        if buffers and not self.copied:
            self.copied = True
            self._copy_buffers(lambda b: True)
        elif not buffers and not self.guarded:
            self.guarded = True
            held = [b for m in self.modules for b in m._buffers.values() if b is not None]
            self.own_buffers = [b for b in held if b.layout is _STRIDED]
            self.aliases += [(b, b.data) for b in self.own_buffers]
            if len(self.own_buffers) < len(held):  # (sparse: no storage; none in most models)
                self._copy_buffers(lambda b: b.layout is not _STRIDED)

    def _copy_buffers(self, which: Callable[[torch.Tensor], bool]) -> None:
        with torch.no_grad():
            for m in self.modules:
                for name, b in m._buffers.items():
                    if b is not None and which(b):  # (no grad here: the clone is detached)
                        self.buffers.append((m._buffers, name, b, b.clone()))

    def restore(self) -> None:
        """Put everything back (call it in ``finally``; before the write guard's restore, which
        puts values back into the storages this puts back)."""
        if list(map(_training, self.modules)) != self.modes:
            for m, mode in zip(self.modules, self.modes, strict=True):
                m.training = mode
        slots = self.slots
        if not all(map(is_, map(dict.get, [t for t, _, _ in slots], [n for _, n, _ in slots]),
                       [o for _, _, o in slots])):  # (compared in C: this runs at every count)
            for table, name, obj in slots:
                if table.get(name) is not obj:
                    table[name] = obj
        with torch.no_grad():
            aliases = self.aliases
            if aliases and not _all_in_place(aliases):
                for held, original in aliases:
                    if not _same_place(held, original):
                        held.data = original
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
_data_ptr = methodcaller("data_ptr")
_stride = methodcaller("stride")
_shape = attrgetter("shape")


def _all_in_place(aliases: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether every aliased tensor still views its alias's memory, for plain tensors not on
    ``meta`` (compared in C, all at once); ``False`` means: look at each (:func:`_same_place`)."""
    held = [h for h, _ in aliases]
    kept = [k for _, k in aliases]
    if (not _PLAIN.issuperset(map(type, held)) or any(map(_is_meta, held))
            or not {_STRIDED}.issuperset(map(_layout, held))):
        return False
    return bool(list(map(_data_ptr, held)) == list(map(_data_ptr, kept))
                and list(map(_shape, held)) == list(map(_shape, kept))
                and list(map(_stride, held)) == list(map(_stride, kept)))


_is_meta = attrgetter("is_meta")
_layout = attrgetter("layout")
