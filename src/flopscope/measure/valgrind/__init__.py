"""The ``valgrind`` backend, in rooms: the parent (:mod:`.backend`), what parent and child say to
each other (:mod:`.contract`), the child (:mod:`._child`) and its client requests
(:mod:`._client`), the callgrind reader (:mod:`.callgrind`), and instructions to FLOPs
(:mod:`.code`)."""

from flopscope.measure.valgrind.backend import (
    FAST_ISA_ENV,
    ValgrindBackend,
    ValgrindOptions,
    unavailable_reason,
)

__all__ = ["FAST_ISA_ENV", "ValgrindBackend", "ValgrindOptions", "unavailable_reason"]
