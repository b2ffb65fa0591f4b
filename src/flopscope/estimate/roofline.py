"""Roofline time per operator call: a lower bound on how long the counted work takes on a machine.

:class:`CallLog` is a Counter observer that writes down, for every operator call, what the
roofline needs (module path, phase, operator, MACs, FLOPs, bytes, the dtype the arithmetic is
done in, whether the operator is element-wise); it knows nothing about hardware.
:meth:`CallLog.estimate` turns it into an :class:`Estimate` for one :class:`Hardware`:

- matrix work (``2 * macs``: the sums of products of matmul, convolution and attention, the only
  work flopscope counts as MACs) runs on the matrix units when the hardware has them for the
  dtype (float32 products as TF32 when torch's ``float32_matmul_precision`` is not ``"highest"``);
  the rest of the FLOPs (``flops - 2 * macs``) runs on the vector units;
- convolutions' products run at the hardware's convolution rate when it has one
  (:attr:`Hardware.convolution`), except a 1x1 convolution with one group, which is a matrix
  product (a GEMM over the channels) and runs at the matrix rate;
- an element-wise special function (:data:`~flopscope.estimate.profile.SPECIAL_FUNCTIONS`:
  ``exp``, ``log``, ``tanh``, ``erf``, GELU, softmax, ...) takes at least its elements / the
  hardware's rate for that function and dtype (:attr:`Hardware.special`), when it has one: a
  transcendental evaluation costs tens of instructions, not the one FLOP it is counted as (the
  count is unchanged; this is time only);
- compute time = max(matrix FLOPs / matrix peak, other FLOPs / vector peak, special-function
  elements / their rate) (the units can overlap, so the largest is the bound);
- memory time = (bytes read + bytes written) / memory bandwidth (bytes read / read bandwidth +
  bytes written / write bandwidth when the hardware gives the two apart), or, when the hardware
  describes its last-level cache (capacity *C* and bandwidth, :attr:`Hardware.has_cache`), the
  larger of all bytes / cache bandwidth and that time for the bytes that miss the cache;
- time = max(compute time, memory time); the call is compute-bound when its compute time is the
  larger, memory-bound otherwise.
- a collective (an operator of ``torch.distributed``'s namespaces) is charged only the bytes of a
  copy kernel it runs besides its own (:func:`flopscope.rules.collectives.copy_bytes`: the
  out-of-place functional all-reduce's copy of its input); its own kernel's reads and writes
  are its time on the link (:mod:`flopscope.estimate.comm_time`), not a memory-bound call's.

The cache level: the log follows the calls in order, with a clock that advances by the bytes each
call touches (its tensors' storage sizes). A storage the call reads was last touched *d* bytes of
traffic ago; it is found in the cache when *d* plus its own size fits in *C* (an LRU cache
holds the most recently touched *C* bytes; counting traffic rather than distinct bytes makes *d*
an over-estimate, so hits are if anything missed). A storage never touched before in the run
comes from main memory (a storage is told from one made later at the same address, which its
key is). Outputs that fit in *C* are written to the cache (written back later, if
ever, when evicted: charged to no call, which keeps the estimate a lower bound). So in one
forward the weights come from memory and an activation read right after it was written comes
from the cache when it fits; an operator timed in a loop finds its inputs in the cache when they
fit, which the validation on this machine shows.

This is a lower bound. It ignores kernel launch and framework overhead, caches other than the
last level (and every cache when the hardware has no cache figures: every byte then comes from
and goes to main memory once), the fusion a compiler does, tile and wave quantisation, and
anything not at peak clock. The *fused* view assumes chains of element-wise operators are fused
(what ``torch.compile`` does): when an element-wise call reads a tensor that the call right
before it wrote, in the same phase and that call also element-wise (module boundaries are no
fusion boundaries: a residual add in a block and the activation module after it fuse), the
intermediate's write and read are dropped. It is an optimistic view (a fused kernel still writes
an intermediate that is needed later, e.g. saved for backward) and shows the low end of the range.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from flopscope.core.facts import facts
from flopscope.cost import Cost, OpCall, Phase
from flopscope.estimate.bound import Estimate, ancestors, resolve_tf32
from flopscope.estimate.calibration import DTENSOR_DISPATCH, DTENSOR_POINTWISE
from flopscope.estimate.call_record import CallRecord
from flopscope.estimate.families import family
from flopscope.estimate.heap import FROM_BEFORE, TRACKED_BYTES, HeapState, faulted_bytes
from flopscope.estimate.profile import SPECIAL_FUNCTIONS, Hardware
from flopscope.rules.collectives import copy_bytes, is_collective

__all__ = ["CallLog", "call_dtype", "special_function"]

def call_dtype(call: OpCall | None) -> torch.dtype | None:
    """The dtype a call computes in: its first floating-point (or complex) input's, else its first
    floating-point output's; ``None`` when it has neither.

    Args:
        call: the call (``None`` for a module rule's whole-module cost).

    Returns:
        The dtype, or ``None``.
    """
    if call is None:
        return None
    for t in call.inputs:
        if t.is_floating_point() or t.is_complex():
            return t.dtype
    for t in call.outputs:
        if t.is_floating_point() or t.is_complex():
            return t.dtype
    return None


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):  # sparse, nested, functional
        return None


# ATen base name -> special function: each of SPECIAL_FUNCTIONS under its own name, except that
# gelu_tanh is gelu with approximate="tanh" and (log-)softmax's operators are underscored
_SPECIAL_OPS = {("_" + f if f.endswith("softmax") else f): f
                for f in SPECIAL_FUNCTIONS if f != "gelu_tanh"}
_CHEAP_POWERS = (0.5, -0.5)  # ATen runs these as sqrt and rsqrt


def special_function(op: str, call: OpCall | None) -> tuple[str, int] | None:
    """The special function a call evaluates, and how many times (its output's elements): an
    ``aten`` operator of :data:`~flopscope.estimate.profile.SPECIAL_FUNCTIONS` (in place and
    ``out=`` variants too); ``gelu`` with ``approximate="tanh"`` is ``gelu_tanh``; ``pow`` only
    with a scalar exponent that is neither an integer nor +-0.5 (those run as products, sqrt and
    rsqrt); ``aten._softmax``/``aten._log_softmax`` are ``softmax``/``log_softmax``.

    Args:
        op: the operator's report name (``"aten.exp.default"``).
        call: the call (``None``: a module rule's cost, no function).

    Returns:
        ``(function, evaluations)``, or ``None``.
    """
    if call is None:
        return None
    parts = op.split(".")
    if len(parts) < 2 or parts[0] != "aten":
        return None
    base = parts[1]
    base = base[:-1] if base.endswith("_") and not base.startswith("_") else base
    function = _SPECIAL_OPS.get(base)
    if function is None:
        return None
    if function == "gelu" and call.arg(1, "approximate", "none") == "tanh":
        function = "gelu_tanh"
    if function == "pow":
        exponent = call.arg(1, "exponent")
        if (len(parts) < 3 or not parts[2].startswith("Tensor_Scalar")
                or isinstance(exponent, bool) or not isinstance(exponent, (int, float))
                or float(exponent).is_integer() or exponent in _CHEAP_POWERS):
            return None
    try:
        return function, int(call.output.numel())
    except (ValueError, TypeError, RuntimeError):  # no tensor output, or a symbolic size
        return None


def _is_gemm_convolution(op: str, call: OpCall | None) -> bool:
    """Whether a convolution call is a matrix product: a 1x1 kernel (every spatial size 1), one
    group (the weight's input channels are the input's), not transposed. Its products then
    run at the matrix rate, not the convolution rate."""
    if call is None:
        return False
    base = op.split(".")[1] if op.count(".") >= 1 else op
    backward = "backward" in base
    if base in ("convolution", "_convolution") and call.arg(6, "transposed", False):
        return False
    if base == "convolution_backward" and call.arg(7, "transposed", False):
        return False
    x = call.arg(1 if backward else 0, "input")
    w = call.arg(2 if backward else 1, "weight")
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return False
    return (w.dim() >= 3 and x.dim() == w.dim() and all(int(n) == 1 for n in w.shape[2:])
            and int(x.shape[1]) == int(w.shape[1]))


_WRITTEN_JUST_BEFORE = frozenset({"aten.lift_fresh.default"})
"""Views whose storage was just written outside any operator (``torch.tensor``'s data): they
touch it in the cache model, as other views do not."""


class CallLog:
    """A Counter observer that keeps what the roofline needs of every operator call.

    Example::

        log = CallLog()
        report = flopscope.count(model, x, observers=[log])
        estimate = log.estimate(get_hardware("h100-sxm"))

    The log holds no tensor (only storage identities of the last call's outputs, for the fused
    view), so it does not change what memory is live.

    Args:
        default_dtype: the dtype of a module rule's whole-module cost (its calls are not seen);
            ``None``: torch's default dtype.
    """

    def __init__(self, *, default_dtype: torch.dtype | None = None) -> None:
        self.records: list[CallRecord] = []
        self.default_dtype = default_dtype or torch.get_default_dtype()
        # the cache model's clock: bytes touched so far, and the clock when each storage was
        # last touched, with a weak reference to the storage: a storage's key is its address,
        # which a storage made after it died may take (a constant made outside any operator
        # would otherwise find the dead one's clock, depending on what the allocator reused)
        self._clock = 0
        self._touched: dict[int, tuple[int, weakref.ref[Any]]] = {}
        self._op_clock: dict[str, int] = {}  # the clock after each operator's last call
        self._chain: list[str] = []  # the module chain of the last forward call
        # large fresh allocations and their frees, for the heap's page faults (.heap):
        # (call index, allocation id, bytes; 0 for its free before that call), and the weak
        # references whose callbacks record the frees (they hold the lists, not the log: no
        # reference cycle)
        self._heap: list[tuple[int, int, int]] = []
        self._heap_refs: list[weakref.ref[Any]] = []
        # the heap the predicted runs start in (.heap.this_process, set by whoever runs them in
        # this process: flopscope.profile); None: an empty one, a fresh process
        self.heap_start: HeapState | None = None
        # the previous call, for the fused view: (path, phase, element-wise, record,
        # {storage key: bytes written})
        self._prev: tuple[str, Phase, bool, CallRecord | None, dict[int, int]] = (
            "", Phase.FORWARD, False, None, {})

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """Record one call (the :class:`flopscope.core.counter.CallObserver` protocol).

        Args:
            path: the module path the call is attributed to.
            phase: its phase.
            op: the operator's report name.
            call: the call (``None`` for a module rule's cost).
            cost: what it cost.
        """
        nbytes = cost.bytes_read + cost.bytes_written
        last = self._prev[3]
        if call is None:
            rec = CallRecord(path, phase.value, op, cost.macs, cost.flops, nbytes, self.default_dtype)
            rec.modules = self._entered(path, phase)
            rec.after = family(last) if last is not None else ""
            self.records.append(rec)
            self._prev = (path, phase, False, rec, {})
            return
        local = (cost.bytes_read, cost.bytes_written)
        if is_collective(call.op):  # its link time is the rest (rules.collectives, "Time")
            local = copy_bytes(call.op, cost)
            nbytes = local[0] + local[1]
        rec = CallRecord(path, phase.value, op, cost.macs, cost.flops, nbytes, call_dtype(call))
        rec.before = self._clock - self._op_clock.get(op, 0)
        rec.modules = self._entered(path, phase)
        if rec.convolution and _is_gemm_convolution(op, call):
            rec.convolution = False
        rec.special = special_function(op, call)
        rec.bytes_read, rec.bytes_written = local
        rec.after = family(last) if last is not None else ""
        self._follow(rec, call)
        self._op_clock[op] = self._clock
        self.records.append(rec)
        pointwise = facts(call.op).pointwise
        _, prev_phase, prev_pointwise, prev_rec, prev_out = self._prev
        if (pointwise and prev_pointwise and prev_rec is not None and prev_out
                and prev_phase is phase):
            for t in call.inputs:
                key = _storage_key(t)
                written = prev_out.pop(key, None) if key is not None else None
                if written is not None:  # the intermediate stays in registers
                    rec.fused_bytes = max(rec.fused_bytes - t.nbytes, 0)
                    prev_rec.fused_bytes = max(prev_rec.fused_bytes - written, 0)
        out: dict[int, int] = {}
        if pointwise and cost.bytes_written:
            for t in call.outputs:
                key = _storage_key(t)
                if key is not None:
                    out[key] = t.nbytes
        self._prev = (path, phase, pointwise, rec, out)

    def on_dtensor_call(self, path: str, phase: Phase, op: str, pointwise: bool) -> None:
        """An outermost operator on DTensors ran (its local calls come to :meth:`on_call`): a
        record of no work, :data:`~flopscope.estimate.calibration.DTENSOR_DISPATCH` (or
        :data:`~flopscope.estimate.calibration.DTENSOR_POINTWISE` for a point-wise operator),
        that a calibrated prediction gives DTensor's own host time."""
        self.records.append(CallRecord(path, phase.value,
                                       DTENSOR_POINTWISE if pointwise else DTENSOR_DISPATCH,
                                       0, 0, 0, None))

    def _entered(self, path: str, phase: Phase) -> int:
        """How many ``nn.Module`` calls a forward (or recomputed) call at ``path`` entered since
        the previous one: the modules of its path (the root first) below the chain that call was
        in; 0 in the backward and the optimizer step."""
        if phase not in (Phase.FORWARD, Phase.RECOMPUTE):
            return 0
        chain = ancestors(path)
        common = 0
        for a, b in zip(chain, self._chain, strict=False):
            if a != b:
                break
            common += 1
        self._chain = chain
        return len(chain) - common

    def _follow(self, rec: CallRecord, call: OpCall) -> None:
        """The cache model's bookkeeping: reuse distances of the call's inputs, sizes of its
        outputs, then the clock moves on by the bytes the call touched."""
        touched = self._touched
        clock = self._clock
        seen: dict[int, int] = {}
        storages: dict[int, Any] = {}
        reuse = []
        views: set[tuple[Any, ...]] = set()
        for t in call.inputs:
            key = _storage_key(t)
            if key is None:
                continue
            view = (key, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            if key in seen:  # the same bytes again (addcmul_(g, g)): read with the first
                if view in views:
                    reuse.append((min(seen[key], t.numel() * t.element_size()), 0))
                continue
            views.add(view)
            storage = storages[key] = t.untyped_storage()
            size = storage.nbytes()
            seen[key] = size
            last = touched.get(key)
            if last is not None and last[1]() is storage:  # the same storage, still alive
                reuse.append((size, clock - last[0]))
        inputs = set(seen)
        out: dict[int, int] = {}  # written storages, in-place and out= ones included
        known = True
        for t in call.outputs:
            key = _storage_key(t)
            if key is None:
                known = False
                continue
            known_size = seen.get(key)
            if known_size is None:
                storage = storages[key] = t.untyped_storage()
                known_size = seen[key] = storage.nbytes()
            out[key] = known_size
        rec.reuse = tuple(reuse)
        rec.out_bytes = sum(out.values()) if known else None
        rec.fresh_bytes = sum(n for k, n in out.items() if k not in inputs) if known else None
        # a call that moves no byte (a view: a linear layer's weight.t() before its product)
        # touches none of its inputs' storages: their last touch stays the last call that
        # read or wrote them (round 11: a decode step's weights read from memory, not cached);
        # but lift_fresh's storage was just written (torch.tensor's data, outside any operator)
        moved = rec.bytes > 0 or rec.op in _WRITTEN_JUST_BEFORE
        clock += sum(seen.values()) if moved else 0
        for key, storage in storages.items():
            last = touched.get(key)
            if not moved and key in inputs:
                continue
            if last is not None and last[1]() is storage:
                ref = last[1]
            else:
                ref = weakref.ref(storage)
                size = seen[key]
                if key in out and key not in inputs and size >= TRACKED_BYTES:
                    self._allocated(storage, size)
                elif key in inputs and size >= TRACKED_BYTES:
                    self._from_before(storage)
            touched[key] = (clock, ref)
        self._clock = clock

    def _allocated(self, storage: Any, size: int) -> None:
        """A storage first seen as a call's fresh output: its allocation, and its free when
        PyTorch frees it (a weak reference's callback)."""
        events, records, key = self._heap, self.records, len(self._heap_refs)
        events.append((len(records), key, size))

        def freed(_: object) -> None:  # holds the lists, not the log
            events.append((len(records), key, 0))

        self._heap_refs.append(weakref.ref(storage, freed))

    def _from_before(self, storage: Any) -> None:
        """A storage first seen as an input (made before the run: a weight, a decode step's
        KV cache): its free, if PyTorch frees it during the run, recorded as one of a storage
        from before (:data:`flopscope.estimate.heap.FROM_BEFORE`)."""
        events, records = self._heap, self.records

        def freed(_: object) -> None:
            events.append((len(records), -1, FROM_BEFORE))

        self._heap_refs.append(weakref.ref(storage, freed))

    def faulted_bytes(self, threshold: int) -> list[int]:
        """Bytes of new pages each recorded call's fresh allocations take in a steady state of
        the run (:func:`flopscope.estimate.heap.faulted_bytes`), from :attr:`heap_start`.

        Args:
            threshold: the allocator's mmap threshold to start at.

        Returns:
            Bytes per record.
        """
        return faulted_bytes(self._heap, len(self.records), threshold=threshold,
                             start=self.heap_start)

    def simulate_faults(self, hardware: Hardware) -> None:
        """Set each record's :attr:`~CallRecord.faulted` from the heap's replay
        (:meth:`faulted_bytes`) where ``hardware`` is a CPU calibrated with an allocator that
        maps fresh allocations (``mmap_bytes``); otherwise leave them.

        Args:
            hardware: the machine.
        """
        cal = hardware.calibration
        if cal is not None and cal.mmap_bytes > 0 and not cal.device.startswith("cuda"):
            for rec, faulted in zip(self.records, self.faulted_bytes(cal.mmap_bytes),
                                    strict=True):
                rec.faulted = faulted

    def estimate(self, hardware: Hardware, *, tf32: bool | None = None) -> Estimate:
        """The roofline estimate of the recorded calls on ``hardware``.

        Args:
            hardware: the machine.
            tf32: float32 matrix products and convolutions run as TF32; ``None``: each as torch
                is set now (:func:`flopscope.estimate.bound.resolve_tf32`: matrix products by
                ``torch.get_float32_matmul_precision()``, convolutions by
                ``torch.backends.cudnn.allow_tf32``, True by default).

        Returns:
            The :class:`Estimate`.
        """
        matmul, convolution = resolve_tf32(tf32)
        self.simulate_faults(hardware)
        return Estimate.from_records(self.records, hardware, tf32=matmul,
                                     tf32_convolution=convolution)
