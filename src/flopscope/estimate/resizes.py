"""Storage resizes made outside any operator, told to the memory trackers that follow them.

FSDP2 frees a layer's unsharded parameters after its forward with ``storage.resize_(0)`` and
allocates them again for backward with ``resize_(size)``; no dispatch mode sees either. While at
least one listener follows, ``torch.UntypedStorage.resize_`` is wrapped: the resize runs, then
every listener's ``storage_resized(storage)`` is called. The original is put back when the last
listener stops.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

__all__ = ["ResizeListener", "follow_resizes"]


class ResizeListener(Protocol):
    """What follows resizes (:class:`flopscope.estimate.memory.MemoryTracker`)."""

    def storage_resized(self, st: Any) -> None:
        """A storage took a new size."""


_FOLLOWING: weakref.WeakSet[Any] = weakref.WeakSet()
_ORIGINAL_RESIZE: list[Any] = []


def _resize_(storage: Any, size: int) -> Any:
    """``UntypedStorage.resize_``, then every listener told of the new size."""
    out = _ORIGINAL_RESIZE[0](storage, size)
    for listener in list(_FOLLOWING):
        listener.storage_resized(storage)
    return out


def follow_resizes(listener: ResizeListener, follow: bool) -> None:
    """Start (or stop) telling ``listener`` of storage resizes made outside any operator.

    Args:
        listener: what to tell (held weakly).
        follow: start (``True``) or stop (``False``).
    """
    if follow:
        _FOLLOWING.add(listener)
    else:
        _FOLLOWING.discard(listener)
    if _FOLLOWING and not _ORIGINAL_RESIZE:
        _ORIGINAL_RESIZE.append(torch.UntypedStorage.resize_)
        torch.UntypedStorage.resize_ = _resize_  # type: ignore[method-assign,assignment]
    elif not _FOLLOWING and _ORIGINAL_RESIZE:
        torch.UntypedStorage.resize_ = _ORIGINAL_RESIZE.pop()  # type: ignore[method-assign]
