"""The roofline bound of a run: :class:`Estimate` (per call, operator, module and phase) for one
:class:`~flopscope.estimate.profile.Hardware`, from what a :class:`~flopscope.estimate.roofline.CallLog`
wrote down; the model is in :mod:`flopscope.estimate.roofline`'s docstring. A lower bound, never a
prediction: what it ignores is :data:`IGNORES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from flopscope.estimate.call_record import CallRecord, fields_but, is_convolution
from flopscope.estimate.families import family
from flopscope.estimate.predict import overlapped, predictor
from flopscope.estimate.profile import Hardware, dtype_key
from flopscope.estimate.regime import of_calibration

__all__ = ["HOST_BOUND_ADVICE", "IGNORES", "Estimate", "Row", "ancestors", "call_row",
           "predicted_step_s", "prediction_summary", "resolve_tf32"]

IGNORES = (
    "kernel launch and framework overhead",
    "caches above the last level (and, for hardware without last-level cache figures, every "
    "cache: each byte counted once to and from main memory)",
    "fusion (see the fused view), tile/wave quantisation, clocks below peak",
)



def ancestors(path: str) -> list[str]:
    """A module path and every module above it, root (``""``) first.

    Args:
        path: a dotted module path.

    Returns:
        ``["", "a", "a.b"]`` for ``"a.b"``.
    """
    if not path:
        return [""]
    parts = path.split(".")
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


@dataclass
class Row:
    """Roofline sums over a set of calls (a module, an operator, a phase, or all).

    Attributes:
        calls: operator calls.
        macs: multiply-accumulates.
        flops: floating-point operations.
        bytes: bytes read plus written.
        time_s: estimated time (a lower bound), seconds.
        compute_s: compute time summed over calls.
        memory_s: memory time summed over calls.
        compute_bound_s: time of the calls that are compute-bound.
        memory_bound_s: time of the calls that are memory-bound.
        fused_bytes: bytes in the fused view.
        fused_time_s: time in the fused view.
        dram_bytes: bytes to and from main memory (``bytes`` less what the last-level cache
            serves; equal to ``bytes`` for hardware without cache figures).
        predicted_s: predicted time from the profile's calibration
            (:mod:`flopscope.estimate.predict`): host plus device time; 0 when uncalibrated.
        host_s: the host time in ``predicted_s``.
        uncalibrated_s: the part of ``predicted_s`` of calls whose family had no calibration
            points (taken at their bound).
    """

    calls: int = 0
    macs: int = 0
    flops: int = 0
    bytes: int = 0
    time_s: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    compute_bound_s: float = 0.0
    memory_bound_s: float = 0.0
    fused_bytes: int = 0
    fused_time_s: float = 0.0
    dram_bytes: int = 0
    predicted_s: float = 0.0
    host_s: float = 0.0
    uncalibrated_s: float = 0.0

    def add(self, other: Row) -> None:
        """Add ``other``'s sums to this row."""
        self.calls += other.calls
        self.macs += other.macs
        self.flops += other.flops
        self.bytes += other.bytes
        self.time_s += other.time_s
        self.compute_s += other.compute_s
        self.memory_s += other.memory_s
        self.compute_bound_s += other.compute_bound_s
        self.memory_bound_s += other.memory_bound_s
        self.fused_bytes += other.fused_bytes
        self.fused_time_s += other.fused_time_s
        self.dram_bytes += other.dram_bytes
        self.predicted_s += other.predicted_s
        self.host_s += other.host_s
        self.uncalibrated_s += other.uncalibrated_s

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOPs per byte (``None`` when no byte moves)."""
        return self.flops / self.bytes if self.bytes else None

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which bound holds for most of the time; ``"-"`` when
        the time is zero."""
        if self.time_s == 0:
            return "-"
        return "compute" if self.compute_bound_s >= self.memory_bound_s else "memory"

    @property
    def attained_flops_per_s(self) -> float:
        """FLOPs / estimated time: the rate the roofline allows (0 for no time)."""
        return self.flops / self.time_s if self.time_s else 0.0

    def to_dict(self, predicted: bool = False) -> dict[str, Any]:
        """A JSON-ready dict (integers, seconds, and the derived fields); with ``predicted``,
        the predicted time and its host part too."""
        extra = ({"predicted_s": self.predicted_s, "host_s": self.host_s} if predicted else {})
        return {**extra,
            "calls": self.calls, "macs": self.macs, "flops": self.flops, "bytes": self.bytes,
            "intensity": self.intensity, "time_s": self.time_s, "compute_s": self.compute_s,
            "memory_s": self.memory_s, "bound": self.bound,
            "fused_bytes": self.fused_bytes, "fused_time_s": self.fused_time_s,
            "dram_bytes": self.dram_bytes,
        }


def resolve_tf32(tf32: bool | None) -> tuple[bool, bool]:
    """Whether float32 matrix products and float32 convolutions run as TF32.

    PyTorch has a switch for each, with different defaults: matrix products stay float32
    (``torch.get_float32_matmul_precision() == "highest"``), while cuDNN takes TF32 for float32
    convolutions (``torch.backends.cudnn.allow_tf32`` is True). Measured on an H200
    (docs/gpu.md): a float32 3x3 convolution ran on the tensor pipe as TF32 by default.

    Args:
        tf32: ``True`` or ``False`` for both; ``None``: each as torch is set now.

    Returns:
        ``(matrix products, convolutions)``.
    """
    if tf32 is not None:
        return tf32, tf32
    return (torch.get_float32_matmul_precision() != "highest",
            bool(torch.backends.cudnn.allow_tf32))


def call_row(rec: CallRecord, hw: Hardware, tf32: bool, tf32_convolution: bool = False) -> Row:
    """One call's roofline row on ``hw``; float32 products as TF32 where ``tf32`` (matrix
    products) or ``tf32_convolution`` (convolutions) says so and the machine has TF32 units."""
    dtype = rec.dtype
    key = dtype_key(dtype) if dtype is not None else None
    key = key or "fp32"
    matrix = 2 * rec.macs
    other = max(rec.flops - matrix, 0)
    as_tf32 = tf32_convolution if is_convolution(rec.op) else tf32  # 1x1 ones too: cuDNN's
    mkey = ("tf32" if key == "fp32" and as_tf32 and dtype is not torch.complex64
            and "tf32" in hw.matrix else key)
    special = 0.0
    if rec.special is not None and dtype is not None and not dtype.is_complex:
        rate = hw.special_rate(key, rec.special[0])
        if rate is not None:
            special = rec.special[1] / rate
    compute = max(matrix / hw.peak(mkey, True, rec.convolution) if matrix else 0.0,
                  other / hw.peak(key, False) if other else 0.0, special)
    if hw.cache_bytes and hw.cache_bandwidth:
        cached_read, cached_written = rec.cached(hw.cache_bytes)
        dram_read = rec.bytes_read - cached_read
        dram_written = rec.bytes_written - cached_written
    else:
        dram_read, dram_written = rec.bytes_read, rec.bytes_written
    dram = dram_read + dram_written
    # fusion drops an intermediate's write and read: from main memory only if it missed
    fused_dram = min(rec.fused_bytes, dram)
    if hw.write_bandwidth is None:
        dram_s = dram / hw.memory_bandwidth
        fused_dram_s = fused_dram / hw.memory_bandwidth
    else:  # reads and writes share the memory channels
        dram_s = dram_read / hw.memory_bandwidth + dram_written / hw.write_bandwidth
        fused_dram_s = dram_s * fused_dram / dram if dram else 0.0
    if hw.cache_bytes and hw.cache_bandwidth:
        memory = max(rec.bytes / hw.cache_bandwidth, dram_s)
        fused_memory = max(rec.fused_bytes / hw.cache_bandwidth, fused_dram_s)
    else:
        memory = dram_s
        fused_memory = fused_dram_s
    time_s = max(compute, memory)
    fused_time = max(compute, fused_memory)
    row = Row(1, rec.macs, rec.flops, rec.bytes, time_s, compute, memory,
              fused_bytes=rec.fused_bytes, fused_time_s=fused_time, dram_bytes=dram)
    if time_s > 0:
        if compute >= memory:
            row.compute_bound_s = time_s
        else:
            row.memory_bound_s = time_s
    if hw.calibration is not None:
        guess = predictor(hw.calibration).call(rec, time_s, hw.cache_bytes or 0)
        row.predicted_s, row.host_s = guess.seconds, guess.host_s
        row.uncalibrated_s = 0.0 if guess.calibrated else guess.seconds
    return row


#: what a call's row is a function of: every field of its record but where it ran (its module
#: path and phase; :func:`call_row` and the prediction read neither)
_ROW_KEY = fields_but("path", "phase")
_ROW_MEMO = 1 << 18  # rows kept per (hardware, TF32 flags), then forgotten to start again
_ROWS: dict[tuple[int, bool, bool], tuple[Hardware, dict[tuple[Any, ...], Row]]] = {}


def _rows(hw: Hardware, tf32: bool, tf32_convolution: bool) -> Callable[[CallRecord], Row]:
    """:func:`call_row` on ``hw`` memoised per distinct record but its place (a plan's small
    runs repeat each call per layer, microbatch and run): the same row object for the same
    fields, read only (:meth:`Estimate.from_records` adds it into its sums, never to it)."""
    at = (id(hw), tf32, tf32_convolution)
    entry = _ROWS.get(at)
    if entry is None or entry[0] is not hw:
        entry = _ROWS[at] = (hw, {})
    memo = entry[1]

    def row_of(rec: CallRecord) -> Row:
        key = _ROW_KEY(rec)
        row = memo.get(key)
        if row is None:
            if len(memo) >= _ROW_MEMO:
                memo.clear()
            row = memo[key] = call_row(rec, hw, tf32, tf32_convolution)
        return row

    return row_of


def _sorted(rows: Mapping[str, Row]) -> dict[str, Row]:
    return dict(sorted(rows.items(), key=lambda kv: (-kv[1].time_s, kv[0])))


def _inclusive(own: Mapping[str, Row]) -> dict[str, Row]:
    """Module path -> the sums of the module and everything below it, from each module's own."""
    inclusive: dict[str, Row] = {}
    for path, row in own.items():
        for p in ancestors(path):
            inclusive.setdefault(p, Row()).add(row)
    return inclusive


@dataclass(frozen=True)
class Estimate:
    """A roofline estimate (a lower bound on time) of counted work on one machine.

    Attributes:
        hardware: the machine.
        tf32: whether float32 matrix products were taken as TF32.
        tf32_convolution: whether float32 convolutions were (cuDNN's default).
        total: sums over every call.
        by_phase: phase name -> sums.
        by_op: operator -> sums, longest first.
        by_module: module path -> inclusive sums (the module and everything below it), in the
            order modules were first seen.
        by_module_self: module path -> the module's own calls.
        by_op_dtype: (operator, dtype key) -> sums, for plots (one roof per dtype).
        by_family: operator family (:func:`flopscope.estimate.families.family`) -> sums.
        by_phase_op: when more than one phase ran, phase -> operator -> sums (the HTML page's
            phase filter); empty otherwise.
        by_phase_module: likewise, phase -> module path -> inclusive sums.
        overlapped: on a GPU calibration, (step time, device idle time) with the host issuing
            and the device running each call in order (:func:`flopscope.estimate.predict
            .overlapped`); ``None`` otherwise (a CPU's host and device are one timeline).
    """

    hardware: Hardware
    tf32: bool
    total: Row
    by_phase: dict[str, Row] = field(default_factory=dict)
    by_op: dict[str, Row] = field(default_factory=dict)
    by_module: dict[str, Row] = field(default_factory=dict)
    by_module_self: dict[str, Row] = field(default_factory=dict)
    by_op_dtype: dict[tuple[str, str], Row] = field(default_factory=dict)
    tf32_convolution: bool = False
    by_family: dict[str, Row] = field(default_factory=dict)
    by_phase_op: dict[str, dict[str, Row]] = field(default_factory=dict)
    by_phase_module: dict[str, dict[str, Row]] = field(default_factory=dict)
    overlapped: tuple[float, float] | None = None

    @property
    def calibrated(self) -> bool:
        """Whether the hardware has calibration data: the rows then carry a prediction."""
        return self.hardware.calibration is not None

    @classmethod
    def from_records(cls, records: Iterable[CallRecord], hardware: Hardware, *,
                     tf32: bool = False, tf32_convolution: bool = False) -> Estimate:
        """Sum per-call roofline rows (see the module docstring).

        Args:
            records: the calls (``CallLog.records``).
            hardware: the machine.
            tf32: float32 matrix products as TF32.
            tf32_convolution: float32 convolutions as TF32.

        Returns:
            The estimate.
        """
        total = Row()
        phases: dict[str, Row] = {}
        ops: dict[str, Row] = {}
        own: dict[str, Row] = {}
        op_dtype: dict[tuple[str, str], Row] = {}
        families: dict[str, Row] = {}
        records = list(records)
        rows: list[Row] = []  # each record's row, for the per-phase tables
        cal = hardware.calibration
        timeline: list[tuple[float, float]] | None = (
            [] if cal is not None and cal.device.startswith("cuda") else None)
        row_of = _rows(hardware, tf32, tf32_convolution)
        for rec in records:
            row = row_of(rec)
            rows.append(row)
            if timeline is not None:
                timeline.append((row.host_s, row.predicted_s - row.host_s))
            total.add(row)
            phases.setdefault(rec.phase, Row()).add(row)
            ops.setdefault(rec.op, Row()).add(row)
            own.setdefault(rec.path, Row()).add(row)
            key = (dtype_key(rec.dtype) if rec.dtype is not None else None) or "fp32"
            op_dtype.setdefault((rec.op, key), Row()).add(row)
            families.setdefault(family(rec), Row()).add(row)
        phase_ops: dict[str, dict[str, Row]] = {}
        phase_modules: dict[str, dict[str, Row]] = {}
        if len(phases) > 1:  # a training step: each phase's operators and modules apart
            phase_own: dict[str, dict[str, Row]] = {}
            for rec, row in zip(records, rows, strict=True):
                phase_ops.setdefault(rec.phase, {}).setdefault(rec.op, Row()).add(row)
                phase_own.setdefault(rec.phase, {}).setdefault(rec.path, Row()).add(row)
            phase_ops = {k: _sorted(v) for k, v in phase_ops.items()}
            phase_modules = {k: _inclusive(v) for k, v in phase_own.items()}
        return cls(hardware, tf32, total, phases, _sorted(ops), _inclusive(own), own, op_dtype,
                   tf32_convolution, _sorted(families), phase_ops, phase_modules,
                   overlapped(timeline) if timeline is not None else None)

    def share(self, row: Row) -> float:
        """A row's share of the total estimated time (0 when the total is 0)."""
        return row.time_s / self.total.time_s if self.total.time_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the hardware, what the estimate ignores, totals, per phase, per
        operator and per module (inclusive), each with its share of the time; when more than one
        phase ran, ``"phases"``: per phase its ``"by_op"`` and ``"by_module"`` (shares of the
        whole estimate)."""

        predicted = self.calibrated

        def rows(table: Mapping[str, Row]) -> dict[str, Any]:
            return {k: {**r.to_dict(predicted), "share": self.share(r)}
                    for k, r in table.items()}

        return {
            "kind": "roofline lower bound",
            "ignores": list(IGNORES),
            "fused_view": "chains of element-wise operators fused: intermediates not written "
                          "or read again",
            "hardware": self.hardware.to_dict(),
            "tf32": self.tf32,
            "tf32_convolution": self.tf32_convolution,
            "total": self.total.to_dict(predicted),
            "prediction": prediction_summary(self),
            "by_phase": rows(self.by_phase),
            "by_op": rows(self.by_op),
            "by_module": rows(self.by_module),
            "by_family": rows(self.by_family),
            **({"phases": {p: {"by_op": rows(self.by_phase_op[p]),
                               "by_module": rows(self.by_phase_module.get(p, {}))}
                           for p in self.by_phase_op}} if self.by_phase_op else {}),
        }


HOST_BOUND_ADVICE = ("host-bound: the time per operator call outside the kernels dominates; "
                     "fewer, larger calls help (on a GPU: CUDA graphs or torch.compile's "
                     "mode='reduce-overhead'; anywhere: torch.compile fuses calls, a larger "
                     "batch amortises them)")


def predicted_step_s(estimate: Estimate) -> float:
    """The predicted time of an estimate's whole run: on a GPU calibration the step with host
    and device overlapping, else the sum of its calls' predictions (one timeline).

    Args:
        estimate: a calibrated estimate.

    Returns:
        Seconds.
    """
    if estimate.overlapped is not None:
        return estimate.overlapped[0]
    return estimate.total.predicted_s


def prediction_summary(estimate: Estimate) -> dict[str, Any]:
    """The prediction of an estimate as JSON: whether the hardware is calibrated, when and
    where, the predicted total, its host and device parts, whether the run is host-bound
    (host time above device time) and by how much, and the error bars per family.

    Args:
        estimate: the estimate.

    Returns:
        ``{"status": "uncalibrated", ...}`` without calibration data.
    """
    cal = estimate.hardware.calibration
    if cal is None:
        return {"status": "uncalibrated",
                "note": "the hardware profile has no calibration data: the bound only "
                        "(flopscope calibrate writes a calibrated profile)"}
    total = estimate.total
    device = total.predicted_s - total.host_s
    host_bound = total.host_s > device
    import torch
    out: dict[str, Any] = {
        "status": "reference" if cal.reference else "calibrated", "calibrated": cal.date,
        "device": cal.device, "compiled": cal.compiled, "source": cal.source(),
        "threads": cal.threads, "threads_now": torch.get_num_threads(),
        "model": "per call: host time of its operator + max(work at the attained rate, the "
                 "roofline bound); "
                 + ("host and device on one timeline (CPU)" if estimate.overlapped is None else
                    "the step: host and device overlapping, each kernel started once launched "
                    "and once the previous one is done (step_s)"),
        "predicted_s": total.predicted_s, "host_s": total.host_s, "device_s": device,
        "uncalibrated_s": total.uncalibrated_s,
        "host_bound": host_bound,
        "host_over_device": total.host_s / device if device > 0 else None,
        "error_bars": dict(cal.error_bars),
        "by_family": {k: {"calls": r.calls, "predicted_s": r.predicted_s, "host_s": r.host_s,
                          "bound_s": r.time_s}
                      for k, r in estimate.by_family.items()},
    }
    if cal.reference:
        out["reference"] = cal.reference
    if cal.validation:
        out["validation"] = dict(cal.validation)
    regime = of_calibration(cal)  # the process's regime against the calibration's
    if regime is not None:
        out["regime"] = regime
    if estimate.overlapped is not None:
        out["step_s"], out["device_idle_s"] = estimate.overlapped
    if host_bound:
        out["suggestion"] = HOST_BOUND_ADVICE
    return out
