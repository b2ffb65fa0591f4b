"""The hardware profile type: peak FLOP/s per dtype (matrix and vector units), memory bandwidth,
the last-level cache and special-function rates, and the dtype keys they are given under.

A :class:`Hardware` is what the roofline model needs to know about a machine. Where profiles come
from (the shipped datasheet table, user files, a measurement of this machine) is
:mod:`flopscope.estimate.hardware`; the measurement itself is
:mod:`flopscope.estimate.this_machine`.

Dtype keys: ``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``. ``matrix`` peaks
are those of the units that only multiply matrices (tensor cores, matrix cores, AMX); ``vector``
peaks those of the general units (CUDA cores, SIMD FMA units). A dtype a unit does not list falls
back as :meth:`Hardware.peak` says.

A profile may also give *special-function rates* (:attr:`Hardware.special`): evaluations per
second of element-wise functions that cost far more than the one FLOP per element they are
counted as (``exp``, ``log``, ``tanh``, ``erf``, ``sin``, GELU, softmax, ...; the names are
:data:`SPECIAL_FUNCTIONS`), per dtype. With a rate for a call's function and dtype, the roofline
charges its elements at that rate as compute time. A measured profile has fp32 rates (short
probes, see :func:`flopscope.estimate.this_machine.measure_this_machine`); the shipped profiles
have none (not applied: see ``docs/roofline.md`` for why).

A profile may also describe its last-level cache (L2 on GPUs, L3 on most CPUs): capacity
(``cache_bytes``) and bandwidth (``cache_bandwidth``). With both, the roofline charges data that a
call finds in the cache at cache bandwidth (see :mod:`flopscope.estimate.roofline`); with either
missing, every byte goes at main-memory bandwidth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from flopscope.errors import UsageError
from flopscope.estimate.calibration import Calibration
from flopscope.estimate.link_calibration import LinkCalibration

__all__ = ["DTYPE_KEYS", "SPECIAL_FUNCTIONS", "Hardware", "dtype_key"]

DTYPE_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
SPECIAL_FUNCTIONS = ("exp", "exp2", "log", "log2", "log10", "tanh", "sigmoid", "erf", "erfc",
                     "sin", "cos", "tan", "atan", "pow", "silu", "gelu", "gelu_tanh", "softmax",
                     "log_softmax")
"""Element-wise functions that can have a rate of their own (:attr:`Hardware.special`): the
ATen operators of the same name (in place and ``out=`` too), ``pow`` with a scalar exponent that
is not an integer or +-0.5 (those have cheaper kernels), ``gelu`` (erf) and ``gelu_tanh``
(``approximate="tanh"``), and ``softmax``/``log_softmax`` (``aten._softmax``,
``aten._log_softmax``)."""

_TERA = 1e12
_GIGA = 1e9


@dataclass(frozen=True)
class Hardware:
    """Peak rates of one machine.

    Attributes:
        name: the profile's name (``"h100-sxm"``).
        memory_bandwidth: main-memory (HBM/DRAM) bandwidth, bytes per second.
        matrix: dtype key -> FLOP/s (or int ops/s) of matrix units, dense.
        vector: dtype key -> FLOP/s of vector (general-purpose) units.
        memory_bytes: memory capacity in bytes, when known.
        description: a human name.
        source: where the figures come from.
        measured: the figures were measured on this machine (not taken from a datasheet).
        cache_bytes: capacity of the last-level cache (GPU L2, CPU L3), when known.
        cache_bandwidth: its bandwidth, bytes per second, when known. The roofline uses the
            cache level only when both are known (:attr:`has_cache`).
        write_bandwidth: main-memory bandwidth for writes, when it differs from reads
            (``memory_bandwidth`` is then the read bandwidth): the roofline charges reads and
            writes separately, reads / read bandwidth + writes / write bandwidth (they share
            the memory channels). ``None``: one bandwidth for both.
        convolution: dtype key -> FLOP/s of convolutions, where they attain a rate of their own
            (a measured CPU profile: oneDNN's convolutions and the BLAS GEMM reach different
            fractions of the same cores); empty: convolutions run at the ``matrix`` rate.
            Convolutions with a 1x1 kernel and one group are matrix products (a GEMM over the
            channels) and run at the ``matrix`` rate whatever this says.
        special: dtype key -> {function (:data:`SPECIAL_FUNCTIONS`) -> evaluations per second}:
            the attained element rate of an element-wise special function (a transcendental
            evaluation costs tens of instructions, not the one FLOP it is counted as); empty:
            no such rate, the function's elements cost what its FLOPs cost.
        calibration: microbenchmarks run on the machine (:mod:`flopscope.estimate.calibration`),
            from which estimates predict time beside the bound; ``None``: uncalibrated, the
            bound only.
        intra_node_bandwidth: bytes per second one device sends (one direction) to the others
            of its node (NVLink), for collectives' bus bytes; ``None``: unknown.
        intra_node_latency: seconds per collective call inside a node.
        inter_node_bandwidth: bytes per second one device sends to other nodes (its network
            adapter, one direction); ``None``: unknown.
        inter_node_latency: seconds per collective call that crosses nodes.
        link_calibration: collectives timed on a real process group
            (:mod:`flopscope.estimate.link_calibration`), whose fit set the link fields of the
            link it measured; ``None``: the link figures are datasheet values (or absent).
    """

    name: str
    memory_bandwidth: float
    matrix: Mapping[str, float] = field(default_factory=dict)
    vector: Mapping[str, float] = field(default_factory=dict)
    memory_bytes: int | None = None
    description: str = ""
    source: str = ""
    measured: bool = False
    cache_bytes: int | None = None
    cache_bandwidth: float | None = None
    write_bandwidth: float | None = None
    convolution: Mapping[str, float] = field(default_factory=dict)
    special: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    calibration: Calibration | None = None
    intra_node_bandwidth: float | None = None
    intra_node_latency: float = 0.0
    inter_node_bandwidth: float | None = None
    inter_node_latency: float = 0.0
    link_calibration: LinkCalibration | None = None

    def __post_init__(self) -> None:
        for what in ("intra_node_bandwidth", "inter_node_bandwidth"):
            value = getattr(self, what)
            if value is not None and not value > 0:
                raise UsageError(f"hardware {self.name!r}: {what.replace('_', ' ')} must be "
                                 "positive")
        for what in ("intra_node_latency", "inter_node_latency"):
            if not getattr(self, what) >= 0:
                raise UsageError(f"hardware {self.name!r}: {what.replace('_', ' ')} must not be "
                                 "negative")
        if not self.memory_bandwidth > 0:
            raise UsageError(f"hardware {self.name!r}: memory bandwidth must be positive")
        if self.cache_bytes is not None and not self.cache_bytes > 0:
            raise UsageError(f"hardware {self.name!r}: cache capacity must be positive")
        if self.cache_bandwidth is not None and not self.cache_bandwidth > 0:
            raise UsageError(f"hardware {self.name!r}: cache bandwidth must be positive")
        if self.write_bandwidth is not None and not self.write_bandwidth > 0:
            raise UsageError(f"hardware {self.name!r}: write bandwidth must be positive")
        for unit in (self.matrix, self.vector, self.convolution):
            for key, value in unit.items():
                if key not in DTYPE_KEYS:
                    raise UsageError(
                        f"hardware {self.name!r}: unknown dtype {key!r}; use one of "
                        f"{', '.join(DTYPE_KEYS)}"
                    )
                if not value > 0:
                    raise UsageError(f"hardware {self.name!r}: peak for {key} must be positive")
        if "fp32" not in self.vector:
            raise UsageError(f"hardware {self.name!r}: needs at least a vector fp32 peak")
        for key, functions in self.special.items():
            if key not in DTYPE_KEYS:
                raise UsageError(
                    f"hardware {self.name!r}: special-function rates for unknown dtype {key!r}; "
                    f"use one of {', '.join(DTYPE_KEYS)}"
                )
            for function, value in functions.items():
                if function not in SPECIAL_FUNCTIONS:
                    raise UsageError(
                        f"hardware {self.name!r}: no special function {function!r}; use one of "
                        f"{', '.join(SPECIAL_FUNCTIONS)}"
                    )
                if not value > 0:
                    raise UsageError(f"hardware {self.name!r}: the {key} rate of {function} must "
                                     f"be positive")

    @property
    def has_cache(self) -> bool:
        """Whether the roofline models a cache level (capacity and bandwidth both known)."""
        return bool(self.cache_bytes and self.cache_bandwidth)

    def peak(self, key: str, matrix: bool, convolution: bool = False) -> float:
        """Peak rate for work of dtype ``key``.

        Matrix work (sums of products) uses the matrix units when they take this dtype, else the
        vector units; vector work uses the vector units. A dtype the vector units do not list runs
        at their fp32 rate (fp8 and tf32 arithmetic outside matrix units is done in fp32; bf16 and
        fp16 without a listed rate likewise).

        Args:
            key: a dtype key (:data:`DTYPE_KEYS`).
            matrix: whether the work is a matrix product.
            convolution: whether it is a convolution's (its own rate when the profile has one).

        Returns:
            Operations per second.
        """
        if matrix and convolution:
            rate = self.convolution.get(key)
            if rate is not None:
                return rate
        if matrix:
            rate = self.matrix.get(key)
            if rate is not None:
                return rate
        rate = self.vector.get(key)
        return rate if rate is not None else self.vector["fp32"]

    def special_rate(self, key: str, function: str) -> float | None:
        """Evaluations per second of special function ``function`` in dtype ``key``, or ``None``
        when the profile has no rate for them (the roofline then does not apply one)."""
        return self.special.get(key, {}).get(function)

    def to_dict(self) -> dict[str, Any]:
        """The profile in the file format (TFLOP/s, GB/s), plus ``measured``."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "memory_bandwidth_gb_s": self.memory_bandwidth / _GIGA,
            "matrix_tflops": {k: v / _TERA for k, v in self.matrix.items()},
            "vector_tflops": {k: v / _TERA for k, v in self.vector.items()},
            "source": self.source,
            "measured": self.measured,
        }
        if self.memory_bytes is not None:
            out["memory_gb"] = self.memory_bytes / _GIGA
        if self.cache_bytes is not None:
            out["cache_mib"] = self.cache_bytes / 2**20
        if self.cache_bandwidth is not None:
            out["cache_bandwidth_gb_s"] = self.cache_bandwidth / _GIGA
        if self.write_bandwidth is not None:
            out["write_bandwidth_gb_s"] = self.write_bandwidth / _GIGA
        if self.convolution:
            out["convolution_tflops"] = {k: v / _TERA for k, v in self.convolution.items()}
        for key, value in (("intra_node_gb_s", self.intra_node_bandwidth),
                           ("inter_node_gb_s", self.inter_node_bandwidth)):
            if value is not None:
                out[key] = value / _GIGA
        for key, seconds in (("intra_node_latency_us", self.intra_node_latency),
                             ("inter_node_latency_us", self.inter_node_latency)):
            if seconds:
                out[key] = seconds * 1e6
        if self.special:
            out["special_gelem_s"] = {k: {f: v / _GIGA for f, v in table.items()}
                                      for k, table in self.special.items()}
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        if self.link_calibration is not None:
            out["link_calibration"] = self.link_calibration.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "profile") -> Hardware:
        """Build a profile from the file format (see the module docstring).

        Args:
            data: the profile's keys.
            where: what to name in error messages (a file name).

        Returns:
            The profile.

        Raises:
            UsageError: a missing or malformed field.
        """
        known = {"name", "description", "memory_bandwidth_gb_s", "matrix_tflops", "vector_tflops",
                 "memory_gb", "source", "measured", "cache_mib", "cache_bandwidth_gb_s",
                 "write_bandwidth_gb_s", "convolution_tflops", "special_gelem_s", "calibration",
                 "intra_node_gb_s", "intra_node_latency_us", "inter_node_gb_s",
                 "inter_node_latency_us", "link_calibration"}
        if not isinstance(data, Mapping):
            raise UsageError(f"{where}: a hardware profile is a table of keys, not "
                             f"{type(data).__name__}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known))}")
        for key in ("name", "memory_bandwidth_gb_s", "vector_tflops"):
            if key not in data:
                raise UsageError(f"{where}: a hardware profile needs {key!r}")

        def rates(key: str) -> dict[str, float]:
            table = data.get(key, {})
            if not isinstance(table, Mapping):
                raise UsageError(f"{where}: {key} must be a table of dtype -> TFLOP/s")
            try:
                return {str(k): float(v) * _TERA for k, v in table.items()}
            except (TypeError, ValueError) as e:
                raise UsageError(f"{where}: {key}: {e}") from e

        def special() -> dict[str, dict[str, float]]:
            table = data.get("special_gelem_s", {})
            if not isinstance(table, Mapping) or not all(isinstance(v, Mapping)
                                                         for v in table.values()):
                raise UsageError(f"{where}: special_gelem_s must be a table of dtype -> "
                                 f"{{function -> G evaluations/s}}")
            try:
                return {str(k): {str(f): float(v) * _GIGA for f, v in rates.items()}
                        for k, rates in table.items()}
            except (TypeError, ValueError) as e:
                raise UsageError(f"{where}: special_gelem_s: {e}") from e

        try:
            bandwidth = float(data["memory_bandwidth_gb_s"]) * _GIGA
            memory = data.get("memory_gb")
            memory_bytes = None if memory is None else int(float(memory) * _GIGA)
            cache = data.get("cache_mib")
            cache_bytes = None if cache is None else int(float(cache) * 2**20)
            cache_bw = data.get("cache_bandwidth_gb_s")
            cache_bandwidth = None if cache_bw is None else float(cache_bw) * _GIGA
            write_bw = data.get("write_bandwidth_gb_s")
            write_bandwidth = None if write_bw is None else float(write_bw) * _GIGA
            links = {key: None if data.get(key) is None else float(data[key]) * _GIGA
                     for key in ("intra_node_gb_s", "inter_node_gb_s")}
            latencies = {key: float(data.get(key, 0.0)) * 1e-6
                         for key in ("intra_node_latency_us", "inter_node_latency_us")}
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: {e}") from e
        return cls(
            name=str(data["name"]),
            memory_bandwidth=bandwidth,
            matrix=rates("matrix_tflops"),
            vector=rates("vector_tflops"),
            memory_bytes=memory_bytes,
            description=str(data.get("description", "")),
            source=str(data.get("source", "")),
            measured=bool(data.get("measured", False)),
            cache_bytes=cache_bytes,
            cache_bandwidth=cache_bandwidth,
            write_bandwidth=write_bandwidth,
            convolution=rates("convolution_tflops"),
            special=special(),
            calibration=(Calibration.from_dict(data["calibration"], where=where)
                         if data.get("calibration") is not None else None),
            intra_node_bandwidth=links["intra_node_gb_s"],
            intra_node_latency=latencies["intra_node_latency_us"],
            inter_node_bandwidth=links["inter_node_gb_s"],
            inter_node_latency=latencies["inter_node_latency_us"],
            link_calibration=(LinkCalibration.from_dict(data["link_calibration"], where=where)
                              if data.get("link_calibration") is not None else None),
        )


def dtype_key(dtype: torch.dtype, *, tf32: bool = False) -> str | None:
    """The profile key of a torch dtype, or ``None`` for dtypes with no arithmetic rate (bool,
    wide integers).

    Args:
        dtype: the dtype the arithmetic is done in.
        tf32: float32 matrix products run as TF32 (``torch.set_float32_matmul_precision("high")``).

    Returns:
        A key of :data:`DTYPE_KEYS`, or ``None``.
    """
    if dtype in (torch.float32, torch.complex64):
        return "tf32" if tf32 else "fp32"
    if dtype in (torch.float64, torch.complex128):
        return "fp64"
    if dtype is torch.bfloat16:
        return "bf16"
    if dtype in (torch.float16, torch.complex32):
        return "fp16"
    if dtype.is_floating_point and dtype.itemsize == 1:  # every float8 variant
        return "fp8"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    return None


def compiled_hardware(hw: Hardware, compiled: bool) -> Hardware:
    """``hw`` as a prediction of a compiled step uses it: with ``compiled``, its calibration
    with :attr:`~flopscope.estimate.Calibration.compiled` set (no host time per call, as CUDA
    graphs and torch.compile issue a step; DTensor's dispatch included; the kernels as eager's,
    no fusion); a profile without a calibration as it is (the roofline bound has no host
    time)."""
    if not compiled or hw.calibration is None:
        return hw
    return dataclasses.replace(hw, calibration=dataclasses.replace(hw.calibration,
                                                                   compiled=True))
