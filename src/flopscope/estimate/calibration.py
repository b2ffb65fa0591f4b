"""Calibration data of a hardware profile: the raw points of microbenchmarks flopscope ran on the
machine (:mod:`flopscope.estimate.calibrate`), with their date, versions, device and thread
count, and the host time per eager call of each operator family. Nothing here is fitted: the
model that turns the points into a prediction is :mod:`flopscope.estimate.predict`.

In a profile file the block is ``"calibration"``::

    "calibration": {"date": "2026-11-26T23:40:00+00:00", "device": "cpu", "threads": 1,
                    "versions": {"torch": "2.14.1", "flopscope": "...", "python": "3.12.3"},
                    "host_s": {"elementwise": 2.1e-06, "matmul": 3.0e-06, ...},
                    "points": [{"family": "matmul", "dtype": "fp32", "what": "mm 64x64x64",
                                "flops": 524288, "bytes": 49152, "seconds": 1.2e-05}, ...],
                    "error_bars": {"matmul": 0.12, ...},
                    "host_op_s": {"addmm": 3.1e-06, "add_": 1.2e-06, ...}}

A point's ``op`` is the ATen operator's base name (``"sqrt"``); ``host_op_s`` the host time
per eager call of each operator measured, ``host_evicted`` the same tiny calls after a call
that moved each of ``bytes`` (``{"bytes": [262144, ...], "seconds": {"add": [3e-6, ...]}}``),
``clock`` what timed them (all optional: files written before them read as before, with the
family's curve and host time). ``fault_s_per_byte`` and ``mmap_bytes``: what a fresh allocation
of at least ``mmap_bytes`` costs per byte beyond the call's work (the allocator maps it anew,
each page faults when first written and is unmapped when freed), and a point's ``fresh``: the
bytes of new output storage it allocated; ``module_call_s``: Python's time per ``nn.Module``
call outside its operators (absent: not modelled, as before); ``dtensor_call_s``: DTensor's own
host time per operator on DTensors (its dispatch and sharding propagation, beyond the local calls
it makes), ``dtensor_pointwise_s`` the same for a point-wise operator on like-sharded DTensors
(absent: ``dtensor_call_s``), and ``fsdp_collective_s``: FSDP2's host time per all-gather or
reduce-scatter (its hooks, beyond the operators they run); those two absent: not modelled
(:mod:`flopscope.estimate.framework`). ``chains``: model-like chains of layers over fresh outputs
(:mod:`flopscope.estimate.chains`), each timed whole against what its calls' points predict
(``[{"what": "conv3x3+bn+relu 48x32x32 x3", "families": ["conv", ...], "calls": 9,
"activation_bytes": 196608, "seconds": 1.9e-3, "predicted_s": 1.5e-3}, ...]``; absent: not
modelled, as before).

``error_bars`` (optional) are the validation's relative errors per family and for whole models
(``"total"``): the 90th percentile over the validation models of ``|predicted / measured - 1|``
of the family's summed time (``benchmarks/prediction_validation.py`` writes them); a profile
without them says its prediction is not validated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopscope.errors import UsageError

__all__ = ["CHAIN_OCTAVES", "DTENSOR_DISPATCH", "DTENSOR_POINTWISE", "FAMILIES", "GRAPH_CLOCK",
           "Calibration", "ChainPoint", "Point", "table_with"]

GRAPH_CLOCK = "CUDA graph replay"
"""A CUDA calibration's clock when its points were timed as CUDA graphs' replays: device time
at every size, kept however small (an eager loop's small points time the host instead)."""

DTENSOR_DISPATCH = "dtensor.dispatch"
"""The report name a prediction gives DTensor's own host time of one operator on DTensors (a
:class:`~flopscope.estimate.CallLog` record of no work; its family is ``"framework"``)."""

DTENSOR_POINTWISE = "dtensor.pointwise"
"""The same for an operator with torch's ``pointwise`` tag (an element-wise operator, whose
sharding DTensor propagates from its like-placed inputs without redistributing them)."""

FAMILIES = ("matmul", "conv", "attention", "elementwise", "reduction", "normalization",
            "pooling", "special", "view")
"""Operator families of the prediction (:func:`flopscope.estimate.families.family`): matrix
products, convolutions, attention kernels, element-wise and copies, reductions, normalisations,
pooling, special functions (:data:`~flopscope.estimate.profile.SPECIAL_FUNCTIONS`), and calls that move
no byte (views, metadata: host time only)."""



def table_with(data: Any, where: str, keys: Sequence[str]) -> Mapping[str, Any]:
    """Check that a profile block read from a file is a table holding ``keys``.

    Args:
        data: the block's value.
        where: what to name in error messages (the file and the block).
        keys: the fields it must have.

    Returns:
        ``data``, as a mapping.

    Raises:
        UsageError: not a table, or a field missing.
    """
    if not isinstance(data, Mapping):
        raise UsageError(f"{where} must be a table, not {type(data).__name__}")
    for key in keys:
        if key not in data:
            raise UsageError(f"{where} needs {key!r}")
    return data


CHAIN_OCTAVES = 1.0
"""The width of :meth:`Calibration.chain_factor`'s smoothing, in octaves of activation bytes:
chains of different layers at about one size are averaged, chains twice or half as large count
``exp(-1/2)`` as much."""


@dataclass(frozen=True)
class ChainPoint:
    """A chain of layers over fresh outputs, timed whole (:mod:`flopscope.estimate.chains`).

    Attributes:
        what: what ran (``"conv3x3+bn+relu 48x32x32 x3"``).
        families: the families of its calls that move bytes (:data:`FAMILIES`).
        calls: its operator calls.
        activation_bytes: the bytes of each activation it passes on (its calls' outputs).
        seconds: its measured time per forward (the calibration's clock).
        predicted_s: what its calls' points predicted for it when it was calibrated (the
            model without chains: host plus device per call).
        reduction: its products' or convolutions' reduction length (MACs per output element:
            a depthwise 3x3 convolution's 9, a dense one's 9 x channels); 0: not recorded.
    """

    what: str
    families: tuple[str, ...]
    calls: int
    activation_bytes: int
    seconds: float
    predicted_s: float
    reduction: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The chain in the file format."""
        out = {"what": self.what, "families": list(self.families), "calls": self.calls,
               "activation_bytes": self.activation_bytes, "seconds": self.seconds,
               "predicted_s": self.predicted_s}
        return {**out, "reduction": self.reduction} if self.reduction else out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ChainPoint:
        """Read one chain (:meth:`to_dict`'s format).

        Args:
            data: the chain's table.
            where: what to name in error messages.

        Returns:
            The chain.

        Raises:
            UsageError: a missing or malformed field, an unknown family, a time not positive.
        """
        try:
            chain = cls(str(data.get("what", "")), tuple(str(f) for f in data["families"]),
                        int(data["calls"]), int(data["activation_bytes"]),
                        float(data["seconds"]), float(data["predicted_s"]),
                        float(data.get("reduction", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"{where} is malformed ({type(e).__name__}: {e}); each needs "
                             "families, calls, activation_bytes, seconds, predicted_s") from None
        unknown = sorted(set(chain.families) - set(FAMILIES))
        if unknown:
            raise UsageError(f"{where}: unknown famil{'y' if len(unknown) == 1 else 'ies'} "
                             f"{', '.join(unknown)}; known: {', '.join(FAMILIES)}")
        if not (chain.seconds > 0 and chain.predicted_s > 0 and chain.activation_bytes > 0):
            raise UsageError(f"{where}: seconds, predicted_s and activation_bytes must be "
                             "positive")
        return chain


@dataclass(frozen=True)
class Point:
    """One microbenchmark: an operator on one shape, timed per eager call.

    Attributes:
        family: its family (:data:`FAMILIES`).
        dtype: its dtype key (``"fp32"``).
        what: what ran (``"mm 1x1024x1024"``), for people reading the file.
        flops: the FLOPs flopscope counts for it.
        bytes: the bytes flopscope counts for it (read plus written).
        seconds: measured time per call, the host's time included (median of batches).
        function: the special function it evaluates (``"exp"``), for the special family.
        inplace: it writes into one of its inputs (no new output storage).
        op: the ATen operator's base name (``"add_"``, ``"convolution"``); empty in files
            written before operators were recorded (the family's curve only).
        reduction: products and convolutions: MACs per output element (a product's K, a
            convolution's input channels per group times its window); 0 where not recorded.
        fresh: bytes of new output storage the call allocated (0 where in place or not
            recorded): above the calibration's ``mmap_bytes`` its page faults are in
            ``seconds`` and are taken out of its rate.
    """

    family: str
    dtype: str
    what: str
    flops: int
    bytes: int
    seconds: float
    function: str = ""
    inplace: bool = False
    op: str = ""
    reduction: float = 0.0
    fresh: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The point in the file format."""
        out: dict[str, Any] = {"family": self.family, "dtype": self.dtype, "what": self.what,
                               "flops": self.flops, "bytes": self.bytes, "seconds": self.seconds}
        if self.function:
            out["function"] = self.function
        if self.inplace:
            out["inplace"] = True
        if self.op:
            out["op"] = self.op
        if self.reduction:
            out["reduction"] = self.reduction
        if self.fresh:
            out["fresh"] = self.fresh
        return out


@dataclass(frozen=True)
class Calibration:
    """What a calibration measured on one machine.

    Attributes:
        date: when (ISO 8601, UTC).
        device: ``"cpu"`` or ``"cuda"`` (and the device's name where known).
        threads: torch's intra-op threads during the run.
        versions: torch, flopscope and Python versions.
        host_s: family -> seconds per eager call of a tiny operator of that family.
        points: the microbenchmarks.
        error_bars: family (or ``"total"``: whole models) -> relative error from a validation
            (empty: not validated).
        host_op_s: ATen operator base name -> seconds per eager call of its tiniest variant
            (the family's ``host_s`` for operators not in it).
        clock: what timed the points: ``"wall"``, ``"thread CPU time"`` (a CPU at one
            thread: the core's time, not other processes'), ``"CUDA events"`` (around an eager
            loop: the device's time, or the host's where it is slower) or ``"CUDA graph
            replay"`` (CUDA events around a captured loop: the device's time always).
        evictions: bytes moved before the timed calls of ``host_evicted_s``, ascending.
        host_evicted_s: ATen operator base name -> its tiny call's seconds after a call that
            moved each of ``evictions`` bytes (empty: not measured; the host time is then
            ``host_op_s``'s whatever came before).
        mmap_bytes: a fresh allocation of at least this many bytes is mapped anew from the
            operating system on every call (glibc's malloc: above its largest dynamic mmap
            threshold, 32 MiB on 64-bit); 0: not modelled (no such allocator found).
        fault_s_per_byte: seconds per byte such an allocation costs beyond the work written
            into it: a page fault per page when first written, the unmapping when freed.
        module_call_s: Python's time per ``nn.Module`` call outside its operators
            (``Module.__call__`` and a one-line ``forward``); 0: not measured.
        dtensor_call_s: host seconds per operator on DTensors beyond its local calls; 0: not
            measured.
        dtensor_pointwise_s: the same for an operator with torch's ``pointwise`` tag on
            like-sharded DTensors; 0: not measured (``dtensor_call_s`` prices them).
        fsdp_collective_s: host seconds of FSDP2's hooks per all-gather or reduce-scatter
            beyond the operators they run; 0: not measured.
        chains: chains of layers over fresh outputs timed whole (:meth:`chain_factor`);
            empty: not measured.
        host_after_s: family of the call before (``"conv"``, ``"matmul"``) -> how much longer
            a tiny call takes after it than after an in-place add of its bytes
            (:func:`~flopscope.estimate.host_probes.after_host_times`); empty: not measured.
        reference: empty where the points were measured on the profile's own machine; else
            what they were measured on and how they were carried to this profile
            (:mod:`flopscope.estimate.reference`): the prediction is then marked
            uncalibrated, and the planner keeps to the bound.
        parallel_add_s: the regime's probe when calibrated (:mod:`flopscope.estimate.regime`:
            seconds per add of 2^16 elements at the calibration's threads); 0: not measured.
        validation: what the validation that wrote :attr:`error_bars` ran (its date, threads,
            load, models) and, split by the regime, its 90th percentiles; empty: not recorded.
        compiled: predict a compiled step (CUDA graphs, torch.compile): no host time per call
            (kernels as eager's, no fusion); a planning option, not stored in the file.
    """

    date: str
    device: str
    threads: int
    versions: Mapping[str, str] = field(default_factory=dict)
    host_s: Mapping[str, float] = field(default_factory=dict)
    points: tuple[Point, ...] = ()
    error_bars: Mapping[str, float] = field(default_factory=dict)
    host_op_s: Mapping[str, float] = field(default_factory=dict)
    clock: str = "wall"
    host_evicted_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    evictions: tuple[int, ...] = ()
    mmap_bytes: int = 0
    fault_s_per_byte: float = 0.0
    module_call_s: float = 0.0
    dtensor_call_s: float = 0.0
    dtensor_pointwise_s: float = 0.0
    fsdp_collective_s: float = 0.0
    chains: tuple[ChainPoint, ...] = ()
    reference: str = ""
    host_after_s: Mapping[str, float] = field(default_factory=dict)
    parallel_add_s: float = 0.0
    validation: Mapping[str, Any] = field(default_factory=dict)
    compiled: bool = False

    def source(self) -> str:
        """Where a prediction from it comes from, for a report's line: ``calibrated DATE,
        DEVICE`` (a CPU's thread count after it), or ``uncalibrated: REFERENCE``."""
        threads = ("" if self.device.startswith("cuda") else
                   f", {self.threads} thread{'s' if self.threads != 1 else ''}")
        made = (f"uncalibrated: {self.reference}" if self.reference
                else f"calibrated {self.date[:10]}, {self.device}{threads}")
        return made + ("; compiled: no host time per call" if self.compiled else "")

    def chain_factor(self, family: str, written: int, reduction: float = 0.0) -> float:
        """How much longer (or shorter) a call of ``family`` writing ``written`` bytes takes in
        a chain of layers over fresh outputs than its points predict: over the :attr:`chains`
        holding the family, the geometric mean of measured / predicted weighted by
        ``exp(-d^2 / 2)``, ``d`` the octaves between ``written`` and the chain's activation
        bytes over :data:`CHAIN_OCTAVES` (``written`` taken at the chains' smallest or largest
        size beyond them); for a product or convolution (``reduction`` > 0), times the same
        weight of the octaves between its reduction length and the chain's (a depthwise
        convolution takes the depthwise chains', a dense one the dense chains').

        Args:
            family: the call's family.
            written: the bytes it writes.
            reduction: its reduction length (0: none, or not a product).

        Returns:
            The factor; 1 without chains of the family or without bytes written.
        """
        chains = [c for c in self.chains if family in c.families] if written > 0 else []
        if not chains:
            return 1.0
        sizes = [math.log2(c.activation_bytes) for c in chains]
        x = min(max(math.log2(written), min(sizes)), max(sizes))
        weights = []
        for c, a in zip(chains, sizes, strict=True):
            d = (x - a) ** 2 + (math.log2(reduction / c.reduction) ** 2
                                if reduction > 0 and c.reduction > 0 else 0.0)
            weights.append((math.exp(-d / CHAIN_OCTAVES**2 / 2), math.log(c.seconds / c.predicted_s)))
        return math.exp(sum(w * r for w, r in weights) / sum(w for w, _ in weights))

    def fault_s(self, fresh: int) -> float:
        """Seconds a call's fresh allocation of ``fresh`` bytes costs in page faults and
        unmapping: ``fresh`` x :attr:`fault_s_per_byte` where it is at least
        :attr:`mmap_bytes` (mapped anew on every call), else 0 (the allocator's heap reuses
        memory already mapped).

        Args:
            fresh: bytes of new output storage.

        Returns:
            Seconds.
        """
        if self.mmap_bytes <= 0 or fresh < self.mmap_bytes:
            return 0.0
        return fresh * self.fault_s_per_byte

    def to_dict(self) -> dict[str, Any]:
        """The block in the file format (see the module docstring)."""
        out: dict[str, Any] = {
            "date": self.date, "device": self.device, "threads": self.threads,
            "versions": dict(self.versions), "host_s": dict(self.host_s),
            "points": [p.to_dict() for p in self.points],
        }
        if self.error_bars:
            out["error_bars"] = dict(self.error_bars)
        if self.host_op_s:
            out["host_op_s"] = dict(self.host_op_s)
        out["clock"] = self.clock
        if self.host_evicted_s:
            out["host_evicted"] = {"bytes": list(self.evictions),
                                   "seconds": {k: list(v) for k, v in
                                               self.host_evicted_s.items()}}
        if self.mmap_bytes:
            out["mmap_bytes"] = self.mmap_bytes
            out["fault_s_per_byte"] = self.fault_s_per_byte
        if self.module_call_s:
            out["module_call_s"] = self.module_call_s
        for name in ("dtensor_call_s", "dtensor_pointwise_s", "fsdp_collective_s"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.chains:
            out["chains"] = [c.to_dict() for c in self.chains]
        if self.host_after_s:
            out["host_after_s"] = dict(self.host_after_s)
        if self.reference:
            out["reference"] = self.reference
        if self.parallel_add_s:
            out["parallel_add_s"] = self.parallel_add_s
        if self.validation:
            out["validation"] = dict(self.validation)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "profile") -> Calibration:
        """Read the block (see the module docstring).

        Args:
            data: the ``"calibration"`` value of a profile.
            where: what to name in error messages.

        Returns:
            The calibration.

        Raises:
            UsageError: a missing or malformed field.
        """
        where = f"{where}: calibration"
        data = table_with(data, where, ("date", "device", "threads", "points"))

        def families(table: Any, name: str, extra: tuple[str, ...] = ()) -> dict[str, float]:
            if not isinstance(table, Mapping):
                raise UsageError(f"{where}: {name} must be a table of family -> number")
            unknown = sorted(set(table) - set(FAMILIES) - set(extra))
            if unknown:
                raise UsageError(f"{where}: {name}: unknown famil{'y' if len(unknown) == 1 else 'ies'} "
                                 f"{', '.join(unknown)}; known: {', '.join(FAMILIES)}")
            try:
                return {str(k): float(v) for k, v in table.items()}
            except (TypeError, ValueError) as e:
                raise UsageError(f"{where}: {name}: {e}") from None

        raw = data["points"]
        if not isinstance(raw, list):
            raise UsageError(f"{where}: points must be a list")
        points = []
        for i, p in enumerate(raw):
            try:
                point = Point(str(p["family"]), str(p["dtype"]), str(p.get("what", "")),
                              int(p["flops"]), int(p["bytes"]), float(p["seconds"]),
                              str(p.get("function", "")), bool(p.get("inplace", False)),
                              str(p.get("op", "")), float(p.get("reduction", 0.0)),
                              int(p.get("fresh", 0)))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise UsageError(f"{where}: point {i} is malformed ({type(e).__name__}: {e}); "
                                 "each needs family, dtype, flops, bytes, seconds") from None
            if point.family not in FAMILIES:
                raise UsageError(f"{where}: point {i}: unknown family {point.family!r}; known: "
                                 f"{', '.join(FAMILIES)}")
            if not point.seconds > 0:
                raise UsageError(f"{where}: point {i}: seconds must be positive")
            points.append(point)
        versions = data.get("versions", {})
        if not isinstance(versions, Mapping):
            raise UsageError(f"{where}: versions must be a table")
        try:
            threads = int(data["threads"])
        except (TypeError, ValueError):
            raise UsageError(f"{where}: threads must be an integer") from None
        host_op = data.get("host_op_s", {})
        if not isinstance(host_op, Mapping):
            raise UsageError(f"{where}: host_op_s must be a table of operator -> seconds")
        try:
            host_op_s = {str(k): float(v) for k, v in host_op.items()}
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: host_op_s: {e}") from None
        evictions, evicted = _evicted(data.get("host_evicted"), where)
        try:
            mmap_bytes = int(data.get("mmap_bytes", 0))
            fault = float(data.get("fault_s_per_byte", 0.0))
            module = float(data.get("module_call_s", 0.0))
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: mmap_bytes, fault_s_per_byte and module_call_s must be "
                             f"numbers ({e})") from None
        if mmap_bytes < 0 or fault < 0 or module < 0:
            raise UsageError(f"{where}: mmap_bytes, fault_s_per_byte and module_call_s must not "
                             "be negative")
        framework: dict[str, Any] = {}
        for name in ("dtensor_call_s", "dtensor_pointwise_s", "fsdp_collective_s",
                     "parallel_add_s"):
            try:
                framework[name] = float(data.get(name, 0.0))
            except (TypeError, ValueError):
                raise UsageError(f"{where}: {name} must be a number of seconds, not "
                                 f"{data.get(name)!r}") from None
            if framework[name] < 0:
                raise UsageError(f"{where}: {name} must not be negative")
        chains, validation = data.get("chains", []), data.get("validation", {})
        if not isinstance(chains, list) or not isinstance(validation, Mapping):
            raise UsageError(f"{where}: chains must be a list, validation a table")
        return cls(str(data["date"]), str(data["device"]), threads,
                   {str(k): str(v) for k, v in versions.items()},
                   families(data.get("host_s", {}), "host_s"), tuple(points),
                   families(data.get("error_bars", {}), "error_bars", ("total",)), host_op_s,
                   str(data.get("clock", "wall")), evicted, evictions, mmap_bytes, fault,
                   module, **framework,
                   chains=tuple(ChainPoint.from_dict(c, f"{where}: chain {i}")
                                for i, c in enumerate(chains)),
                   reference=str(data.get("reference", "")),
                   host_after_s=families(data.get("host_after_s", {}), "host_after_s"),
                   validation=dict(validation))


def _evicted(block: Any, where: str) -> tuple[tuple[int, ...], dict[str, tuple[float, ...]]]:
    """The ``host_evicted`` block: ``{"bytes": [...], "seconds": {op: [one per size]}}``."""
    if block is None:
        return (), {}
    try:
        sizes = tuple(int(n) for n in block["bytes"])
        table = {str(k): tuple(float(x) for x in v) for k, v in block["seconds"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"{where}: host_evicted is malformed ({type(e).__name__}: {e}); it "
                         "needs bytes (a list) and seconds (operator -> one per size)") from None
    if list(sizes) != sorted(sizes) or any(len(v) != len(sizes) for v in table.values()):
        raise UsageError(f"{where}: host_evicted: bytes must ascend and every operator needs "
                         f"one time per size ({len(sizes)})")
    return sizes, table
