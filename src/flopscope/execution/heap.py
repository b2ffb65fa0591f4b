"""The garbage collector during a run: the objects that exist when it starts frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects that exist now (``gc.freeze``) until the block ends.

    The collector's full collections, which a run's many small objects trigger (symbolic sizes
    above all: a 70B-shaped symbolic count spent about 1 s of 1.4 s in them; a screened plan's
    small runs about 10 s of the 70B 256-GPU plan), then scan only what the block made, not the
    whole process (torch, the model, sympy's caches, the runs a plan keeps). Left alone when the
    process has frozen objects of its own or the collector is off.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
