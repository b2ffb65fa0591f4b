"""Model integrity during a real count: copy on write of the model's own tensors.

A forward may write to its parameters in place (``nn.Embedding(max_norm=...)`` renormalises rows).
:class:`WriteGuard` saves a protected tensor just before an operator first writes to it (writes
are found from the operator's schema and matched by storage, so views and ``.data`` aliases are
covered) and puts every saved value back on :meth:`WriteGuard.restore`. Tensors nothing writes to
are never copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

from flopscope.core.facts import facts

__all__ = ["WriteGuard", "plain_tensors"]

_TRANSPARENT: tuple[type, ...] = (FakeTensor, FunctionalTensor)


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


class WriteGuard:
    """Copy on write of ``tensors`` (see the module docstring).

    Args:
        tensors: the model's parameters (and any other tensors to keep as they were).
    """

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.protected = {t.untyped_storage().data_ptr(): t for t in plain_tensors(tensors)
                          if t.untyped_storage().nbytes()}
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def before(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before ``func`` runs: save any protected tensor it is about to write to."""
        for i, name in facts(func).written:
            t = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                owner = self.protected.get(ptr)
                if owner is not None and ptr not in self.saved:
                    self.saved[ptr] = (owner, owner.detach().clone())

    def restore(self) -> int:
        """Put back every protected tensor an operator wrote to; returns how many."""
        with torch.no_grad():
            for tensor, value in self.saved.values():
                tensor.copy_(value)
        n = len(self.saved)
        self.saved = {}
        return n
