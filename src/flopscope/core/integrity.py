"""Model integrity during a real count: copy on write of the model's own tensors.

A forward may write to its parameters in place (``nn.Embedding(max_norm=...)`` renormalises rows)
and to its buffers (batch norm's running statistics in training mode). :class:`WriteGuard` saves a
protected tensor just before an operator first writes to it (writes are found from the operator's
schema, and for batch norm's kernels, which update the running statistics without their schema
saying so, from :attr:`~flopscope.core.facts.OpFacts.stats_written`; they are matched by storage,
so views and ``.data`` aliases are covered) and puts every saved value back on
:meth:`WriteGuard.restore`. Tensors nothing writes to are never copied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from operator import methodcaller
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

from flopscope.core.facts import OpFacts

__all__ = ["WriteGuard", "plain_tensors"]

_TRANSPARENT: tuple[type, ...] = (FakeTensor, FunctionalTensor)
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_untyped_storage = methodcaller("untyped_storage")
_nbytes = methodcaller("nbytes")
_data_ptr = methodcaller("data_ptr")
_storage_offset = torch.Tensor.storage_offset
_tensor_data_ptr = torch.Tensor.data_ptr


def plain_tensors(tensors: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The plain tensors that hold these tensors' data: a wrapper subclass (DTensor: its local
    shard) by its inner tensors."""
    for t in tensors:
        if is_traceable_wrapper_subclass_type(type(t)) and not isinstance(t, _TRANSPARENT):
            names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
            yield from plain_tensors([getattr(t, n) for n in names
                                      if isinstance(getattr(t, n), torch.Tensor)])
        else:
            yield t


def _storage_addresses(tensors: list[torch.Tensor]) -> list[int] | None:
    """The addresses of plain tensors' storages (what :meth:`WriteGuard.before` reads of a
    written argument, ``untyped_storage().data_ptr()``) when each tensor starts its storage and
    the storages are distinct and not empty (the usual case: a model's parameters and buffers),
    read in C from the tensors themselves: a tensor at offset 0 has its storage's data pointer,
    and a nonzero one is memory allocated (an empty storage has none). A storage object made per
    tensor and its address and size read cost about four times as much. ``None`` otherwise (a
    view at an offset, a tied, empty or ``meta`` tensor, one with no storage): read per storage."""
    try:
        if any(map(_storage_offset, tensors)):
            return None
        ptrs = list(map(_tensor_data_ptr, tensors))
    except (RuntimeError, NotImplementedError):  # (sparse, mkldnn: no storage to read)
        return None
    return ptrs if all(ptrs) and len(set(ptrs)) == len(ptrs) else None


class WriteGuard:
    """Copy on write of ``tensors`` (see the module docstring).

    Args:
        tensors: the model's parameters and buffers (any tensors to keep as they were).
    """

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        # (made at every count: plain tensors and parameters, the usual case, need no unwrapping)
        plain = tensors if _PLAIN.issuperset(map(type, tensors)) else plain_tensors(tensors)
        self.saved: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # storage -> the protected tensors on it (all saved at the first write to any of them)
        kept = list(plain)
        if plain is tensors:  # (see _storage_addresses)
            ptrs = _storage_addresses(kept)
            if ptrs is not None:
                self.protected: Mapping[int, Sequence[torch.Tensor]] = dict(
                    zip(ptrs, zip(kept), strict=True))
                return
        storages = list(map(_untyped_storage, kept))  # (the storages' reads in C, all at once)
        ptrs = list(map(_data_ptr, storages))
        if len(set(ptrs)) == len(ptrs) and all(map(_nbytes, storages)):
            # one tensor per storage, none empty: the table made in C
            self.protected = dict(
                zip(ptrs, zip(kept), strict=True))
            return
        protected: dict[int, list[torch.Tensor]] = {}
        seen: set[int] = set()
        for t, nbytes, ptr, key in zip(kept, map(_nbytes, storages), ptrs, map(id, kept),
                                       strict=True):
            if nbytes and key not in seen:  # (a tied tensor is listed twice)
                seen.add(key)
                owners = protected.get(ptr)
                if owners is None:
                    protected[ptr] = [t]
                else:
                    owners.append(t)
        self.protected = protected

    def before(self, f: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before the operator of facts ``f`` runs: save any protected tensor it is about to
        write to (the arguments its schema marks written, and batch norm's running statistics in
        training: :attr:`~flopscope.core.facts.OpFacts.stats_written`)."""
        written = f.written
        if f.stats_written is not None:
            flag, stats = f.stats_written
            if (args[flag] if flag < len(args) else kwargs.get("training")) is True:
                written = (*written, *stats)
        for i, name in written:
            t = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                owners = self.protected.get(ptr)
                if owners is not None and ptr not in self.saved:
                    self.saved[ptr] = [(owner, owner.detach().clone()) for owner in owners]

    def restore(self) -> int:
        """Put back every protected tensor an operator wrote to; returns how many."""
        with torch.no_grad():
            for saved in self.saved.values():
                for tensor, value in saved:
                    tensor.copy_(value)
        n = sum(map(len, self.saved.values()))
        self.saved = {}
        return n
