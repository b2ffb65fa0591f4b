"""A model's state, saved before a count runs it and put back after, also when it raises.

What a forward can change, and how each is put back:

- training flags (``model.train(...)`` for the count, or a forward that flips them);
- buffers updated in place (batch-norm running statistics; also under fake tensors, where
  ``num_batches_tracked`` is bumped from Python): copied before, copied back;
- parameters an operator writes in place (``nn.Embedding(max_norm=...)``): copy on write by the
  Counter (:meth:`~flopscope.Counter.protect`), restored by the Counter;
- parameter, buffer and tensor-attribute *slots* a forward replaces (legacy ``spectral_norm`` /
  ``weight_norm`` set ``module.weight`` on every call): the objects put back;
- a parameter's storage swapped without any operator (``p.data = other``): aliases taken before
  are compared by storage identity, offset, sizes and strides and the storage put back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["ModelSnapshot"]

_PLAIN = (torch.Tensor, nn.Parameter)  # no subclass: data pointers say where the memory is


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
        self.modes = [(m, m.training) for m in modules]
        eager = [m for m in modules if type(m._parameters) is dict]  # not TorchScript modules
        self.slots: list[tuple[dict[str, Any], str, Any]] = [
            (m._parameters, name, t) for m in eager for name, t in m._parameters.items()]
        self.slots += [(m._buffers, name, t) for m in eager for name, t in m._buffers.items()]
        self.slots += [(vars(m), name, t) for m in eager if m._forward_pre_hooks or m._forward_hooks
                       for name, t in vars(m).items() if isinstance(t, torch.Tensor)]
        self.buffers: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
        # aliases (no copy) of every parameter, to undo `p.data = other`, which swaps a tensor's
        # storage without any operator (buffers are put back from their copies)
        self.aliases: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.params: list[torch.Tensor] = []  # the model's own (not meta) parameters
        self.kept = False

    def keep_values(self, *, meta: bool = False) -> None:
        """Save the buffers' values and alias the parameters (the first call only); afterwards
        :attr:`params` holds the parameters that are not on ``meta`` (what a real run protects
        with copy on write). Buffers are copied, not protected by copy on write: a composite
        operator updates them inside its kernel (``aten.batch_norm``'s running statistics,
        whose schema does not mark them written), where no dispatch mode sees the write.

        Args:
            meta: the model is on ``meta``: no values to protect, but ``.data =`` can still swap
                a storage or a shape, so every parameter is aliased.
        """
        if self.kept:
            return
        self.kept = True
        with torch.no_grad():
            for m in self.modules:
                for name, b in m._buffers.items():
                    if b is not None:  # (no grad here: the clone is detached)
                        self.buffers.append((m._buffers, name, b, b.clone()))
        if meta:
            self.aliases = [(p, p.detach()) for m in self.modules
                            for p in m._parameters.values() if p is not None]
            return
        self.params = [p for m in self.modules for p in m._parameters.values()
                       if p is not None and not p.is_meta and p.device.type != "meta"]
        self.aliases = [(p, p.detach()) for p in self.params]

    def restore(self) -> None:
        """Put everything back (call it in ``finally``)."""
        for m, mode in self.modes:
            if m.training != mode:
                m.training = mode
        for table, name, obj in self.slots:
            if table.get(name) is not obj:
                table[name] = obj
        with torch.no_grad():
            for held, original in self.aliases:
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
