"""One operator call as the roofline writes it down: :class:`CallRecord` (what
:class:`~flopscope.estimate.roofline.CallLog` records of each call, and what the bound, the
families and the prediction read), and :func:`is_convolution`, the test its ``convolution``
field is set by.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import torch

__all__ = ["CallRecord", "fields_but", "is_convolution"]


@functools.cache
def is_convolution(op: str) -> bool:
    """Whether a report operator name (``aten.convolution.default``, ``aten.mkldnn_convolution
    .default``, ``aten.convolution_backward.default``, ``aten.conv2d.default``, ...) is a
    convolution's, whose products run at the profile's convolution rate when it has one."""
    name = op.split(".")[1] if op.count(".") >= 1 else op
    return "conv" in name and "convert" not in name


class CallRecord:
    __slots__ = ("after", "before", "bytes", "bytes_read", "bytes_written", "convolution", "dtype", "faulted",
                 "flops", "fresh_bytes", "fused_bytes", "macs", "modules", "op", "out_bytes", "path", "phase",
                 "reuse", "special")

    def __init__(self, path: str, phase: str, op: str, macs: int, flops: int, nbytes: int,
                 dtype: torch.dtype | None) -> None:
        self.path = path
        self.phase = phase
        self.op = op
        self.macs = macs
        self.flops = flops
        self.bytes = nbytes
        self.fused_bytes = nbytes
        self.dtype = dtype
        self.bytes_read = nbytes
        self.bytes_written = 0
        # (storage bytes, traffic since its last touch) of each input storage touched before;
        # storage bytes of the outputs (None: unknown, never cached)
        self.reuse: tuple[tuple[int, int], ...] = ()
        self.out_bytes: int | None = None
        # storage bytes of the outputs that are none of the inputs' (new allocations; 0 for an
        # in-place call; None: unknown)
        self.fresh_bytes: int | None = None
        # bytes of new pages its fresh allocations take in a steady state of the run (glibc's
        # heap simulated, .heap; set by CallLog.estimate for a calibrated CPU; None: unknown)
        self.faulted: int | None = None
        # products at the convolution rate (a convolution that is not a 1x1 GEMM)
        self.convolution = is_convolution(op)
        # (special function, evaluations), see special_function
        self.special: tuple[str, int] | None = None
        # bytes the calls since the last call of the same operator moved (they evicted that
        # much of what the interpreter, the dispatcher and the operator's kernel keep in the
        # caches: the prediction's host time grows with it); the run's bytes so far for an
        # operator's first call
        self.before = 0
        # the family of the call just before (flopscope.estimate.families.family; "" for the
        # first): a convolution's or a product's kernel library evicts more of the host's
        # state than its bytes say (the prediction's host time adds the calibration's
        # host_after_s for it)
        self.after = ""
        # nn.Module calls Python entered since the previous forward call (the modules of its
        # path below the chain that call was in; 0 outside the forward: autograd's backward and
        # the optimizer run outside the modules' calls)
        self.modules = 0

    def cached(self, capacity: int) -> tuple[int, int]:
        """(bytes read, bytes written) of this call served by a last-level cache of
        ``capacity`` bytes: inputs whose reuse distance plus size fits, and outputs that fit
        (see the module docstring)."""
        hits = sum(n for n, d in self.reuse if d + n <= capacity)
        written = 0
        if self.out_bytes is not None and self.out_bytes <= capacity:
            written = self.bytes_written
        return min(hits, self.bytes_read), written

    def cached_bytes(self, capacity: int) -> int:
        """Bytes of this call served by a last-level cache of ``capacity`` bytes."""
        return sum(self.cached(capacity))


def fields_but(*names: str) -> Callable[[CallRecord], tuple[Any, ...]]:
    """A getter of every field of a :class:`CallRecord` but ``names``, as one tuple: the memo key
    of what is a function of a call's record but those fields (its place: ``path``, ``phase``)."""
    return attrgetter(*(n for n in CallRecord.__slots__ if n not in names))
