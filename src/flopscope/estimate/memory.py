"""Peak memory: tensor lifetimes as the dispatcher sees them.

:class:`MemoryTracker` is a Counter observer. A tensor storage becomes live when it first appears
as an operator's output (or, for tensors that existed before, when it is registered or first
read); it dies when PyTorch frees it, which the tracker learns from ``weakref.finalize`` on the
storage (PyTorch keeps one Python object per live storage, so the finalizer runs exactly when the
storage is freed; ``torch.distributed._tools.mem_tracker`` relies on the same). Views share their
base's storage and are counted once; an in-place operator allocates nothing; a storage that an
operator resizes (``out=`` arguments) is charged its new size. Works the same for real, fake and
meta tensors, so a training step can be sized without running it.

What is counted: every storage an observed operator call produced or read (parameters, buffers,
inputs, gradients, optimizer state, activations saved for backward, temporaries), at its exact
size (``nbytes``); and one kind of scratch memory inside a kernel that follows from the call's
arguments alone, the *layout copies* of the matrix-product kernels (see :func:`layout_copy_bytes`:
an ``mm``/``addmm`` operand that is neither row- nor column-major, such as the expanded gradient
of a ``sum``, is copied to a dense matrix for BLAS while the call runs; category ``workspace``).
What is not: the allocator's rounding and caching (the CUDA caching allocator rounds to 512 bytes
and keeps freed blocks reserved: ``torch.cuda.memory_reserved`` is larger), other scratch memory
inside a kernel (cuBLAS/cuDNN/oneDNN workspaces and reordered weights, a decomposition's
intermediate results), the CUDA context and library code (hundreds of MB per process), and
allocations inside a module costed by a module rule (its operators are not observed). Python
objects and non-tensor memory are never seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from flopscope.core.facts import facts
from flopscope.cost import Cost, OpCall, Phase
from flopscope.estimate.bound import ancestors
from flopscope.estimate.layout_copies import layout_copy_bytes
from flopscope.estimate.resizes import follow_resizes

__all__ = ["CATEGORIES", "TIMELINE_POINTS", "CallPoint", "MemoryProfile", "MemoryTracker",
           "layout_copy_bytes", "timeline"]

CATEGORIES = (
    "parameters", "buffers", "inputs", "gradients", "optimizer_state", "activations",
    "temporaries", "workspace", "other",
)
"""Categories of live memory at the peak:

- ``parameters``, ``buffers``, ``inputs``: registered before the run (see
  :meth:`MemoryTracker.register`);
- ``gradients``: parameter gradients (``.grad``, registered or found after the run);
- ``optimizer_state``: tensors held by the optimizer (momentum, Adam moments, step counters);
- ``activations``: storages allocated in the forward phase and live at the peak (saved for
  backward, or the model's outputs);
- ``temporaries``: other storages allocated during the run (backward and optimizer temporaries);
- ``workspace``: scratch memory a kernel holds only while it runs (the matrix products' layout
  copies, :func:`layout_copy_bytes`), live at the peak when the peak is inside such a call;
- ``other``: storages that existed before the run and were not registered (first seen read).
"""



_PHASE_CATEGORY = {Phase.FORWARD: "activations", Phase.RECOMPUTE: "activations",
                   Phase.BACKWARD: "temporaries", Phase.OPTIMIZER: "temporaries"}


def _storage(t: torch.Tensor) -> tuple[int, int, Any] | None:
    """(key, bytes, storage object) of a tensor's storage, or ``None`` when it has none."""
    try:
        st = t.untyped_storage()
        return int(st._cdata), int(st.nbytes()), st
    except (RuntimeError, NotImplementedError, AttributeError):  # sparse, nested, functional
        return None


class _Alloc:
    __slots__ = ("born", "category", "died", "key", "nbytes", "path", "phase")

    def __init__(self, key: int, nbytes: int, born: int, category: str, path: str,
                 phase: str) -> None:
        self.key = key
        self.nbytes = nbytes
        self.born = born
        self.died: int | None = None
        self.category = category
        self.path = path
        self.phase = phase


class MemoryTracker:
    """A Counter observer that follows live tensor storages and records the peak.

    Example::

        tracker = MemoryTracker()
        tracker.register(model.parameters(), "parameters")
        with torch.no_grad():
            report = flopscope.count(model, x, observers=[tracker])
        profile = tracker.profile()

    The tracker keeps no tensor alive: it holds storage identities and finalizers only.
    Call :meth:`close` (or :meth:`profile`, which does) when done, so the finalizers stop
    reporting to it.
    """

    def __init__(self) -> None:
        self._allocs: list[_Alloc] = []
        self._live: dict[int, _Alloc] = {}
        self._finalizers: list[weakref.finalize] = []  # type: ignore[type-arg]
        self._event = 0
        self.current = 0
        self.peak = 0
        self._peak_event = 0
        self._peak_at: tuple[str, str, str] = ("", Phase.FORWARD.value, "")
        self._hwm: dict[str, int] = {}  # module path -> live bytes high-water mark (own calls)
        self._calls: list[tuple[int, str]] = []  # (event, phase) of each operator call, in order
        self._where: list[tuple[str, str]] = []  # (module path, operator) of each call, in order
        self._closed = False
        # what register() made live (storage, key, bytes, category): kept by reset()
        self._registered: list[tuple[weakref.ref[Any], int, int, str]] = []
        self._resized_away: dict[int, str] = {}  # storages freed by resize_(0): their module
        self._regrown: list[tuple[int, int, str, str]] = []  # (calls before, event, path, phase)
        follow_resizes(self, True)

    def storage_resized(self, st: Any) -> None:
        """A storage took a new size outside any operator (:mod:`flopscope.estimate.resizes`):
        a followed one's old bytes are freed, and one that grows (again) is allocated anew (in
        the phase of the last call).

        Args:
            st: the storage.
        """
        if self._closed:
            return
        key, nbytes = int(st._cdata), int(st.nbytes())
        alloc = self._live.get(key)
        if alloc is not None and (alloc.nbytes == nbytes or alloc.key != key):
            return
        if alloc is not None:
            self._died(alloc)
            self._resized_away[key] = alloc.path
        if nbytes and (alloc is not None or key in self._resized_away):
            path = self._resized_away.pop(key)
            phase = self._calls[-1][1] if self._calls else Phase.FORWARD.value
            self._event += 1  # a moment of its own, between two calls
            self._born(key, nbytes, st, _PHASE_CATEGORY.get(Phase(phase), "temporaries"), path,
                       phase)
            self._regrown.append((len(self._calls), self._event, path, phase))
            self._note_peak(path, phase, "resize_")

    # -- bookkeeping ----------------------------------------------------------------------------
    def _born(self, key: int, nbytes: int, st: Any, category: str, path: str, phase: str) -> None:
        alloc = _Alloc(key, nbytes, self._event, category, path, phase)
        self._allocs.append(alloc)
        self._live[key] = alloc
        self.current += nbytes
        self._finalizers.append(weakref.finalize(st, self._died, alloc))

    def _alias(self, key: int, st: Any, alloc: _Alloc) -> None:
        """Storage ``key`` holds ``alloc``'s bytes under another storage object (fake tensors
        convert a real tensor inside an operator): known, never counted twice."""
        self._live[key] = alloc
        self._finalizers.append(weakref.finalize(st, self._unalias, key, alloc))

    def _unalias(self, key: int, alloc: _Alloc) -> None:
        if self._live.get(key) is alloc and alloc.key != key:
            del self._live[key]

    def _died(self, alloc: _Alloc) -> None:
        if self._closed or alloc.died is not None:
            return
        self._event += 1
        alloc.died = self._event
        if self._live.get(alloc.key) is alloc:
            del self._live[alloc.key]
        self.current -= alloc.nbytes

    def _note_peak(self, path: str, phase: str, op: str) -> None:
        if self.current > self.peak:
            self.peak = self.current
            self._peak_event = self._event
            self._peak_at = (path, phase, op)

    def register(self, tensors: Iterable[Any], category: str) -> None:
        """Count tensors that exist before the run (parameters, buffers, inputs, gradients,
        optimizer state) as live from now; each storage once (a registered storage keeps its
        first category).

        Args:
            tensors: tensors (other objects are skipped).
            category: one of :data:`CATEGORIES`.

        Raises:
            ValueError: an unknown category.
        """
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; use one of {CATEGORIES}")
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            found = _storage(t)
            if found is not None and found[0] not in self._live:
                self._born(found[0], found[1], found[2], category, "", "")
                self._registered.append((weakref.ref(found[2]), found[0], found[1], category))
        self._note_peak("", Phase.FORWARD.value, "")

    def reset(self) -> None:
        """Forget the run (:func:`flopscope.count` calls it when it abandons an attempt and
        runs the model again another way); what :meth:`register` made live, and still exists,
        stays live, with its category."""
        registered = self._registered
        self.close()
        self.__init__()  # type: ignore[misc]
        for ref, key, nbytes, category in registered:
            st = ref()
            if st is not None and key not in self._live:
                self._born(key, nbytes, st, category, "", "")
                self._registered.append((ref, key, nbytes, category))
        self._note_peak("", Phase.FORWARD.value, "")

    def close(self) -> None:
        """Stop following storages (finalizers detached); the recorded figures stay."""
        self._closed = True
        follow_resizes(self, False)
        for fin in self._finalizers:
            fin.detach()
        self._finalizers = []

    # -- the observer ---------------------------------------------------------------------------
    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """Storages the call read that were never seen become live (category ``other``); its
        outputs' new storages become live (allocated by the call); then the peak is updated.

        Args:
            path: the module path the call is attributed to.
            phase: its phase.
            op: the operator's report name.
            call: the call (``None`` for a module rule: nothing to follow).
            cost: what it cost (unused).
        """
        if call is None or self._closed:
            return
        self._event += 1
        self._calls.append((self._event, phase.value))
        self._where.append((path, op))
        live = self._live
        for t in call.inputs:
            found = _storage(t)
            if found is not None and found[0] not in live:
                self._born(found[0], found[1], found[2], "other", path, phase.value)
        # outputs that alias inputs (views, in-place and out= forms) are never new storage (under
        # fake tensors a real input is converted inside the operator: its view's storage is new)
        aliasing = facts(call.op).aliasing
        for t in call.outputs:
            found = _storage(t)
            if found is None:
                continue
            key, nbytes, st = found
            alloc = live.get(key)
            if alloc is None:
                if aliasing:  # a view of a converted input: the same bytes as what it aliases
                    for i in call.inputs:
                        found_in = _storage(i)
                        source = live.get(found_in[0]) if found_in is not None else None
                        if source is not None:
                            self._alias(key, st, source)
                            break
                    continue
                self._born(key, nbytes, st, _PHASE_CATEGORY[phase], path, phase.value)
            elif alloc.nbytes != nbytes:
                # resized in place (out= arguments, resize_), or known by an alias of another
                # size (a stale one: what it aliased has died): its old bytes freed (the alias
                # forgotten) and the new allocated now, so that what was live before (the
                # peak's breakdown, every call's) keeps the size it had then
                if alloc.key == key:
                    self._died(alloc)
                else:
                    del live[key]
                self._event += 1
                self._born(key, nbytes, st, alloc.category, path, phase.value)
        scratch = layout_copy_bytes(call)
        if scratch:  # live while the call runs (with its inputs and outputs), then freed
            work = _Alloc(-1, scratch, self._event, "workspace", path, phase.value)
            self._allocs.append(work)
            self.current += scratch
        hwm = self._hwm.get(path, 0)
        if self.current > hwm:
            self._hwm[path] = self.current
        self._note_peak(path, phase.value, op)
        if scratch:
            self._event += 1
            work.died = self._event
            self.current -= scratch

    # -- results --------------------------------------------------------------------------------
    def profile(self, *, relabel: Mapping[str, Iterable[Any]] | None = None) -> MemoryProfile:
        """The peak and what was live then, and each module's high-water mark; closes the
        tracker.

        Args:
            relabel: category -> tensors whose storages belong to it, applied before the
                breakdown (e.g. ``{"gradients": [p.grad ...], "optimizer_state": [...]}``
                after a training step: those storages were allocated as temporaries).

        Returns:
            The :class:`MemoryProfile`.
        """
        if relabel:
            # the allocation each tensor's storage is now: a storage's key is its address, which
            # an earlier, freed storage may have had (an activation freed in backward whose
            # address a gradient then got); only the live one is the tensor's
            for category, tensors in relabel.items():
                for t in tensors:
                    found = _storage(t) if isinstance(t, torch.Tensor) else None
                    alloc = self._live.get(found[0]) if found is not None else None
                    if alloc is not None:
                        alloc.category = category
        self.close()
        at_peak = {c: 0 for c in CATEGORIES}
        peak_event = self._peak_event
        for alloc in self._allocs:
            if alloc.born <= peak_event and (alloc.died is None or alloc.died > peak_event):
                at_peak[alloc.category] += alloc.nbytes
        inclusive: dict[str, int] = {}
        for path, value in self._hwm.items():
            for p in ancestors(path):
                if value > inclusive.get(p, 0):
                    inclusive[p] = value
        path, phase, op = self._peak_at
        return MemoryProfile(
            peak_bytes=self.peak,
            peak_module=path,
            peak_phase=phase,
            peak_op=op,
            at_peak={c: v for c, v in at_peak.items() if v},
            end_bytes=self.current,
            by_module=inclusive,
            timeline=timeline(self._allocs, self._calls),
        )

    def call_points(self) -> list[CallPoint]:
        """Live bytes by category at every operator call, in the order of the calls (each
        call's moment as at the peak: its inputs, outputs and workspace live), and at every
        storage that grew again outside an operator (op ``resize_``, as the peak names it:
        FSDP2's gathered parameters); after :meth:`profile`, with its relabelling applied.

        Returns:
            One :class:`CallPoint` per call (and regrown storage), in order.
        """
        at = [(e, ph, path, op) for (path, op), (e, ph) in zip(self._where, self._calls,
                                                               strict=True)]
        for i, event, path, phase in reversed(self._regrown):
            at.insert(i, (event, phase, path, "resize_"))
        rows = _rows(self._allocs, [(e, ph) for e, ph, _, _ in at])
        return [CallPoint(path, phase, op, dict(zip(CATEGORIES, row, strict=True)))
                for (_, phase, path, op), row in zip(at, rows, strict=True)]


@dataclass(frozen=True)
class CallPoint:
    """One operator call of a tracked run and what was live at it.

    Attributes:
        module: the module path the call is attributed to.
        phase: its phase.
        op: the operator's report name.
        live: category (every one of :data:`CATEGORIES`) -> bytes live at the call.
    """

    module: str
    phase: str
    op: str
    live: dict[str, int]


def _rows(allocs: Sequence[_Alloc], calls: Sequence[tuple[int, str]]) -> list[tuple[int, ...]]:
    """Bytes live per category (in :data:`CATEGORIES` order) at each call's event: born at or
    before it and not died by it (the rule of the peak's breakdown)."""
    where = {c: i for i, c in enumerate(CATEGORIES)}
    changes = sorted([(a.born, where[a.category], a.nbytes) for a in allocs]
                     + [(a.died, where[a.category], -a.nbytes) for a in allocs
                        if a.died is not None], key=lambda c: c[0])
    live, rows, j = [0] * len(CATEGORIES), [], 0
    for event, _ in calls:
        while j < len(changes) and changes[j][0] <= event:
            live[changes[j][1]] += changes[j][2]
            j += 1
        rows.append(tuple(live))
    return rows


TIMELINE_POINTS = 400


def timeline(allocs: Sequence[_Alloc], calls: Sequence[tuple[int, str]],
             points: int = TIMELINE_POINTS) -> dict[str, Any]:
    """Live bytes by category over the run's operator calls, at most ``points`` of them: each a
    call's moment (its inputs, outputs and workspace live, as at the peak); when there are more
    calls, the highest call of each equal run of calls, so the peak is always one of them.

    Args:
        allocs: every allocation, with the events it was born and died at.
        calls: (event, phase) of each operator call, in order.
        points: the most calls kept.

    Returns:
        ``{"calls": total calls, "index": [call number], "phase": [phase], "categories":
        {category: [bytes]}}``, categories that were ever live only; ``{}`` with no call.
    """
    if not calls:
        return {}
    cats = [c for c in CATEGORIES if any(a.category == c for a in allocs)]
    rows = _rows(allocs, calls)
    step = -(-len(rows) // points)  # ceil
    keep = [max(range(i, min(i + step, len(rows))), key=lambda k: sum(rows[k]))
            for i in range(0, len(rows), step)]
    return {"calls": len(calls), "index": keep, "phase": [calls[k][1] for k in keep],
            "categories": {c: [rows[k][CATEGORIES.index(c)] for k in keep] for c in cats}}


@dataclass(frozen=True)
class MemoryProfile:
    """Peak memory of a counted run (see :mod:`flopscope.estimate.memory` for what is counted).

    Attributes:
        peak_bytes: the most bytes of tensor storage live at once.
        peak_module: the module path of the call at which the peak was reached (``""`` the root).
        peak_phase: its phase (``forward``, ``backward``, ``optimizer``...).
        peak_op: the operator that made the peak allocation.
        at_peak: category -> bytes live at the peak (see :data:`CATEGORIES`).
        end_bytes: bytes live when the run ended.
        by_module: module path -> high-water mark of live bytes during its calls (inclusive of
            the modules below it).
        train: whether the run was a training step.
        note: what the run was (filled in by the helpers).
        timeline: live bytes by category over the operator calls (see :func:`timeline`).
    """

    peak_bytes: int
    peak_module: str
    peak_phase: str
    peak_op: str
    at_peak: dict[str, int] = field(default_factory=dict)
    end_bytes: int = 0
    by_module: dict[str, int] = field(default_factory=dict)
    train: bool = False
    note: str = ""
    timeline: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (integers in bytes)."""
        return {
            "peak_bytes": self.peak_bytes,
            "peak_module": self.peak_module,
            "peak_phase": self.peak_phase,
            "peak_op": self.peak_op,
            "at_peak": dict(self.at_peak),
            "end_bytes": self.end_bytes,
            "by_module": dict(self.by_module),
            "train": self.train,
            "note": self.note,
            "excludes": "allocator rounding and caching, kernel workspaces (cuBLAS/cuDNN/oneDNN), "
                        "CUDA context, allocations inside module-rule modules",
            **({"timeline": self.timeline} if self.timeline else {}),
        }
