"""Hardware profiles: peak FLOP/s per dtype (matrix and vector units) and memory bandwidth.

A :class:`Hardware` is what the roofline model needs to know about a machine. Shipped profiles
(:data:`PROFILES`) hold dense (no structured sparsity) datasheet figures, each with its source in
a comment; :func:`load_hardware` reads user profiles from a JSON (or, on Python >= 3.11, TOML)
file; :func:`measure_this_machine` measures the machine it runs on with a short GEMM and a
streaming copy (and says so: ``measured=True``).

Dtype keys: ``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``. ``matrix`` peaks
are those of the units that only multiply matrices (tensor cores, matrix cores, AMX); ``vector``
peaks those of the general units (CUDA cores, SIMD FMA units). A dtype a unit does not list falls
back as :meth:`Hardware.peak` says.

A profile may also give *special-function rates* (:attr:`Hardware.special`): evaluations per
second of element-wise functions that cost far more than the one FLOP per element they are
counted as (``exp``, ``log``, ``tanh``, ``erf``, ``sin``, GELU, softmax, ...; the names are
:data:`SPECIAL_FUNCTIONS`), per dtype. With a rate for a call's function and dtype, the roofline
charges its elements at that rate as compute time. A measured profile has fp32 rates (short
probes, see :func:`measure_this_machine`); the shipped profiles have none (not applied: see
``docs/roofline.md`` for why).

A profile may also describe its last-level cache (L2 on GPUs, L3 on most CPUs): capacity
(``cache_bytes``) and bandwidth (``cache_bandwidth``). With both, the roofline charges data that a
call finds in the cache at cache bandwidth (see :mod:`flopscope.estimate.roofline`); with either
missing, every byte goes at main-memory bandwidth.

File format (JSON; TOML takes the same keys), one profile or ``{"profiles": [...]}``::

    {"name": "my-gpu", "memory_bandwidth_gb_s": 2000,
     "matrix_tflops": {"bf16": 500, "fp16": 500, "tf32": 250},
     "vector_tflops": {"fp32": 60, "fp64": 30},
     "memory_gb": 80, "cache_mib": 50, "cache_bandwidth_gb_s": 7000,
     "special_gelem_s": {"fp32": {"exp": 1.5, "tanh": 0.45}},
     "description": "...", "source": "..."}
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flopscope.errors import UsageError

__all__ = [
    "DTYPE_KEYS",
    "Hardware",
    "PROFILES",
    "SPECIAL_FUNCTIONS",
    "best_seconds",
    "dtype_key",
    "get_hardware",
    "last_level_cache_bytes",
    "load_hardware",
    "measure_this_machine",
]

DTYPE_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
THIS_MACHINE = ("this", "this-machine", "this_machine", "local")
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

    def __post_init__(self) -> None:
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
        if self.special:
            out["special_gelem_s"] = {k: {f: v / _GIGA for f, v in table.items()}
                                      for k, table in self.special.items()}
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
                 "write_bandwidth_gb_s", "convolution_tflops", "special_gelem_s"}
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


def _gpu(name: str, description: str, source: str, bandwidth_gb_s: float,
         memory_gb: float | None, matrix: dict[str, float], vector: dict[str, float],
         cache_mib: float | None = None, cache_gb_s: float | None = None) -> Hardware:
    return Hardware(name, bandwidth_gb_s * _GIGA, {k: v * _TERA for k, v in matrix.items()},
                    {k: v * _TERA for k, v in vector.items()},
                    None if memory_gb is None else int(memory_gb * _GIGA), description, source,
                    cache_bytes=None if cache_mib is None else int(cache_mib * 2**20),
                    cache_bandwidth=None if cache_gb_s is None else cache_gb_s * _GIGA)


# Dense figures only (datasheets print "with sparsity" figures twice as large; those are not used).
# Units below: TFLOP/s (TOPS for int8), GB/s, GB; last-level cache in MiB and GB/s.
# Last-level caches: NVIDIA publishes L2 capacities but no L2 bandwidth, so the NVIDIA profiles
# carry the capacity only and the roofline charges every byte at HBM/GDDR bandwidth for them (a
# user profile can add "cache_bandwidth_gb_s"); AMD publishes both for MI300X's Infinity Cache.
_SHIPPED = [
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100, 2023), H100 SXM:
    # FP64 34, FP64 Tensor Core 67, FP32 67, TF32 TC 989/2 = 494.5 dense, BF16/FP16 TC 1979/2 =
    # 989.5, FP8 TC 3958/2 = 1979, INT8 TC 3958/2 = 1979; GPU memory 80 GB, 3.35 TB/s.
    # FP16/BF16 on CUDA cores (non-tensor) 133.8: NVIDIA H100 Tensor Core GPU Architecture
    # whitepaper (2022), Table 3 (SXM5).
    _gpu("h100-sxm", "NVIDIA H100 SXM5 80 GB", "NVIDIA H100 datasheet (SXM); H100 whitepaper "
         "Table 3 for non-tensor FP16/BF16", 3350, 80,
         {"fp64": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979, "int8": 1979},
         {"fp64": 34, "fp32": 67, "bf16": 133.8, "fp16": 133.8},
         cache_mib=50),  # 50 MB L2 (H100 SXM5 and PCIe): NVIDIA, "NVIDIA Hopper Architecture
    # In-Depth" (developer blog, 2022): "A 50 MB L2 cache in H100 is 1.25x larger than the A100
    # 40 MB L2"; the GH100 die has 60 MB, of which the products enable 50.
    # Same datasheet, H100 PCIe: FP64 26, FP64 TC 51, FP32 51, TF32 756/2 = 378, BF16/FP16
    # 1513/2 = 756.5, FP8 3026/2 = 1513, INT8 3026/2 = 1513; 80 GB HBM2e at 2.0 TB/s.
    # Non-tensor FP16/BF16: whitepaper Table 3 (PCIe) 102.4.
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80 GB", "NVIDIA H100 datasheet (PCIe); H100 whitepaper "
         "Table 3 for non-tensor FP16/BF16", 2000, 80,
         {"fp64": 51, "tf32": 378, "bf16": 756.5, "fp16": 756.5, "fp8": 1513, "int8": 1513},
         {"fp64": 26, "fp32": 51, "bf16": 102.4, "fp16": 102.4}, cache_mib=50),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200, 2024), H200 SXM:
    # the same compute as H100 SXM (FP64 34, FP64 TC 67, FP32 67, TF32 989/2, BF16/FP16 1979/2,
    # FP8 3958/2, INT8 3958/2); 141 GB HBM3e at 4.8 TB/s.
    # L2: the same GH100 configuration as H100 SXM (50 MB, see above).
    _gpu("h200", "NVIDIA H200 SXM 141 GB", "NVIDIA H200 datasheet (SXM)", 4800, 141,
         {"fp64": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979, "int8": 1979},
         {"fp64": 34, "fp32": 67, "bf16": 133.8, "fp16": 133.8}, cache_mib=50),
    # NVIDIA A100 Tensor Core GPU datasheet (2021), A100 SXM: FP64 9.7, FP64 TC 19.5, FP32 19.5,
    # TF32 TC 312/2 = 156, BF16/FP16 TC 624/2 = 312, INT8 TC 1248/2 = 624 (no FP8); 40 GB HBM2 at
    # 1,555 GB/s, 80 GB HBM2e at 2,039 GB/s. Non-tensor FP16/BF16 78 (NVIDIA A100 Tensor Core
    # GPU Architecture whitepaper, Table 1).
    # L2: 40 MB (A100 whitepaper; NVIDIA's Hopper blog above compares against "the A100 40 MB L2").
    _gpu("a100-40gb", "NVIDIA A100 SXM4 40 GB", "NVIDIA A100 datasheet (SXM 40GB); A100 "
         "whitepaper Table 1 for non-tensor FP16/BF16", 1555, 40,
         {"fp64": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
         {"fp64": 9.7, "fp32": 19.5, "bf16": 78, "fp16": 78}, cache_mib=40),
    _gpu("a100-80gb", "NVIDIA A100 SXM4 80 GB", "NVIDIA A100 datasheet (SXM 80GB); A100 "
         "whitepaper Table 1 for non-tensor FP16/BF16", 2039, 80,
         {"fp64": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
         {"fp64": 9.7, "fp32": 19.5, "bf16": 78, "fp16": 78}, cache_mib=40),
    # NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3, TF32 TC 120/2 = 60, BF16/FP16 TC
    # 242/2 = 121, FP8 485/2 = 242.5, INT8 485/2 = 242.5; 24 GB GDDR6 at 300 GB/s. FP64 is not
    # in the datasheet: 1/64 of FP32 (Ada Lovelace architecture whitepaper) = 0.47.
    _gpu("l4", "NVIDIA L4 24 GB", "NVIDIA L4 datasheet; FP64 = FP32/64 (Ada whitepaper)", 300, 24,
         {"tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5},
         {"fp64": 0.47, "fp32": 30.3}),
    # NVIDIA L40S datasheet (2023): FP32 91.6, TF32 TC 183 (366 sparse), BF16/FP16 TC 362.05
    # (733 sparse), FP8 733 (1466 sparse), INT8 733 (1466 sparse); 48 GB GDDR6 at 864 GB/s.
    # FP64 is not in the datasheet: FP32/64 = 1.43.
    _gpu("l40s", "NVIDIA L40S 48 GB", "NVIDIA L40S datasheet; FP64 = FP32/64 (Ada whitepaper)",
         864, 48,
         {"tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733, "int8": 733},
         {"fp64": 1.43, "fp32": 91.6}),
    # AMD Instinct MI300X data sheet (amd.com, 2023): FP64 vector 81.7, FP64 matrix 163.4, FP32
    # vector 163.4, FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4, FP8 2614.9, INT8 2614.9
    # (dense); 192 GB HBM3 at 5.3 TB/s. Last level: 256 MB AMD Infinity Cache at 17 TB/s peak
    # (AMD's MI300X launch material, Dec 2023, as reported by ServeTheHome, "AMD Instinct MI300X
    # GPU and MI300A APUs launched for AI era": "256MB of Infinity Cache with 17TB/s of peak
    # bandwidth").
    _gpu("mi300x", "AMD Instinct MI300X 192 GB", "AMD Instinct MI300X data sheet; AMD launch "
         "material for the Infinity Cache", 5300, 192,
         {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
          "fp8": 2614.9, "int8": 2614.9},
         {"fp64": 81.7, "fp32": 163.4}, cache_mib=256, cache_gb_s=17000),
    # CPUs (no capacity figure: it depends on the DIMMs): peak = cores x base clock x FLOP per cycle per core (two FMA pipes: 2 x 2 x lanes),
    # bandwidth = memory channels x transfer rate x 8 bytes.
    # AMD EPYC 9654 (amd.com product page): 96 cores, 2.4 GHz base, 12 channels DDR5-4800
    # (460.8 GB/s). Zen 4 runs AVX-512 on 256-bit datapaths: 2 FMA x 4 doubles x 2 = 16 FP64
    # FLOP/cycle, 32 FP32, and AVX512_BF16 dot products at 64 BF16 FLOP/cycle.
    # 96 x 2.4e9 x 16 = 3.686 TFLOP/s FP64; x 32 = 7.373 FP32; x 64 = 14.75 BF16.
    _gpu("epyc-9654", "AMD EPYC 9654 (Genoa, 96 cores, one socket)", "AMD product page: cores, "
         "base clock, memory channels; Zen 4 FLOP/cycle", 460.8, None,
         {"bf16": 14.75},
         {"fp64": 3.686, "fp32": 7.373}),
    # Intel Xeon Platinum 8480+ (ark.intel.com): 56 cores, 2.0 GHz base, 8 channels DDR5-4800
    # (307.2 GB/s). Two AVX-512 FMA units: 2 x 2 x 8 = 32 FP64 FLOP/cycle, 64 FP32; AMX: 1024
    # BF16 FLOP/cycle and 2048 INT8 ops/cycle per core (Intel Architecture Instruction Set
    # Extensions reference, AMX chapter; Intel's AMX overview). 56 x 2.0e9 x 32 = 3.584 FP64,
    # x 64 = 7.168 FP32, x 1024 = 114.7 BF16/FP16 (AMX-FP16 is Granite Rapids; BF16 only here),
    # x 2048 = 229.4 INT8.
    _gpu("xeon-8480", "Intel Xeon Platinum 8480+ (Sapphire Rapids, 56 cores, one socket)",
         "ark.intel.com: cores, base clock, memory channels; AMX/AVX-512 FLOP/cycle", 307.2, None,
         {"bf16": 114.7, "int8": 229.4},
         {"fp64": 3.584, "fp32": 7.168}),
    # AWS Graviton3 (aws.amazon.com/ec2/graviton; Neoverse V1 technical reference): 64 cores at
    # 2.6 GHz, 8 channels DDR5-4800 (307.2 GB/s). Two 256-bit SVE pipes: 2 x 2 x 4 = 16 FP64
    # FLOP/cycle, 32 FP32, BFMMLA bf16 matrix multiply 2 x 32 = 64 BF16 FLOP/cycle.
    # 64 x 2.6e9 x 16 = 2.662 FP64; x 32 = 5.325 FP32; x 64 = 10.65 BF16.
    _gpu("graviton3", "AWS Graviton3 (64 cores)", "AWS Graviton page; Arm Neoverse V1 TRM",
         307.2, None,
         {"bf16": 10.65},
         {"fp64": 2.662, "fp32": 5.325}),
]

PROFILES: dict[str, Hardware] = {hw.name: hw for hw in _SHIPPED}
"""The shipped profiles by name."""
# aliases people type
_ALIASES = {"h100": "h100-sxm", "h200-sxm": "h200", "a100": "a100-80gb", "a100-40": "a100-40gb",
            "a100-80": "a100-80gb"}


def load_hardware(path: str | Path) -> list[Hardware]:
    """Read hardware profiles from a JSON file (or TOML on Python >= 3.11).

    Args:
        path: the file: one profile, or ``{"profiles": [...]}`` (TOML: ``[[profiles]]``).

    Returns:
        The profiles in file order.

    Raises:
        UsageError: the file is missing, unreadable, not JSON/TOML, or a profile is malformed.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read hardware file {str(path)!r}: {e.strerror or e}") from None
    data: Any
    if file.suffix.lower() == ".toml":
        if sys.version_info < (3, 11):
            raise UsageError(f"{path}: TOML hardware files need Python >= 3.11; use JSON")
        tomllib: Any = importlib.import_module("tomllib")  # stdlib from 3.11 (mypy checks 3.10)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: not valid TOML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}: not valid JSON: {e}") from None
    if isinstance(data, Mapping) and "profiles" in data:
        items = data["profiles"]
        if not isinstance(items, list) or not items:
            raise UsageError(f"{path}: 'profiles' must be a non-empty list of profiles")
        return [Hardware.from_dict(item, where=f"{path} (profile {i})")
                for i, item in enumerate(items)]
    return [Hardware.from_dict(data, where=str(path))]


def get_hardware(spec: str | Hardware) -> Hardware:
    """A profile by name (:data:`PROFILES`, case-insensitive), from a file (JSON/TOML; the
    first profile, or ``FILE:NAME`` for a named one), or ``"this-machine"`` (measured now).

    Args:
        spec: a name, a file path, ``"this-machine"``, or a :class:`Hardware` (returned as is).

    Returns:
        The profile.

    Raises:
        UsageError: no such profile or file (close matches are suggested).
    """
    if isinstance(spec, Hardware):
        return spec
    key = spec.strip().lower()
    key = _ALIASES.get(key, key)
    if key in PROFILES:
        return PROFILES[key]
    if key in THIS_MACHINE:
        return measure_this_machine()
    path, _, name = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    if Path(path).is_file():
        profiles = load_hardware(path)
        if not name:
            return profiles[0]
        for hw in profiles:
            if hw.name.lower() == name.lower():
                return hw
        raise UsageError(f"{path} has no profile named {name!r}; it has "
                         f"{', '.join(hw.name for hw in profiles)}")
    from flopscope._text import did_you_mean

    raise UsageError(
        f"unknown hardware {spec!r}{did_you_mean(key, [*PROFILES, 'this-machine'])}; known: "
        f"{', '.join(PROFILES)}, this-machine, or a JSON file of profiles"
    )


def best_seconds(fn: Any, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``fn``, after one untimed warm-up call.

    Args:
        fn: what to time (called with no arguments).
        repeats: timed calls.

    Returns:
        Seconds.
    """
    fn()  # warm-up: first-touch page faults, library initialisation
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def last_level_cache_bytes() -> int | None:
    """Capacity of this CPU's last-level cache, as the operating system reports it (Linux
    ``/sys/devices/system/cpu/cpu0/cache``: the highest level of a data or unified cache; else
    ``sysconf(SC_LEVEL3_CACHE_SIZE)``/``SC_LEVEL2_CACHE_SIZE``), or ``None`` when it is not
    reported.

    Returns:
        Bytes, or ``None``.
    """
    import os

    best: tuple[int, int] | None = None
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for entry in root.glob("index*"):
            kind = (entry / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((entry / "level").read_text())
            text = (entry / "size").read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * scale
            if best is None or level > best[0]:
                best = (level, size)
    except (OSError, ValueError):
        best = None
    if best is not None and best[1] > 0:
        return best[1]
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if size > 0:
            return int(size)
    return None


def _counted_bytes(fn: Any) -> tuple[int, int]:
    """(bytes read, bytes written) that flopscope counts for ``fn()``: the roofline's own
    accounting, so that measured bandwidths and estimates use one unit (``copy_`` counts the
    destination as read too, which is what a CPU does: a store to a line not in cache first
    reads it, write-allocate)."""
    from flopscope.counter import Counter

    with Counter(warn=False) as counter:
        fn()
    total = counter.report.total()
    return int(total.bytes_read), int(total.bytes_written)


def _matrix_probes(dtype: torch.dtype, n: int) -> list[tuple[int, Any]]:
    """(FLOPs, a call) of the matrix products whose best rate is a profile's matrix rate: the
    n^3 GEMM, a 512^3 GEMM (its operands stay in cache, where BLAS runs fastest) and, in fp32, a
    1x1 convolution (a GEMM over the channels, run by the convolution library's own 1x1 kernel:
    ResNet-50's 1024 -> 256 channels on 14 x 14, batch 8, 2 x 8 x 14 x 14 x 1024 x 256 FLOPs).
    A roofline is a bound only if no kernel runs faster than its roof, so the roof is the fastest
    of them; the roofline charges 1x1 convolutions at this rate."""
    probes: list[tuple[int, Any]] = []
    for size in sorted({n, min(n, 512)}):
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        c = torch.empty(size, size, dtype=dtype)
        probes.append((2 * size**3, lambda a=a, b=b, c=c: torch.mm(a, b, out=c)))
    if dtype is torch.float32:
        x = torch.randn(8, 1024, 14, 14)
        w = torch.randn(256, 1024, 1, 1)
        probes.append((2 * 8 * 14 * 14 * 1024 * 256,
                       lambda: torch.nn.functional.conv2d(x, w)))
    return probes


def _special_probes(numel: int) -> list[tuple[str, Any, Any]]:
    """(function, a call over ``numel`` fp32 elements, the same call over one element) for each of
    :data:`SPECIAL_FUNCTIONS`, writing into preallocated outputs (``out=``: a fresh output would
    add the allocator's page faults to the function's time). Inputs are standard normal; the
    logarithms' and ``pow``'s are ``|x| + 0.5`` (positive). ``pow`` raises to 2.5, softmax and
    log-softmax run over rows of 1,024 elements."""
    aten = torch.ops.aten
    calls: dict[str, Any] = {
        "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2,
        "log10": torch.log10, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
        "erfc": torch.erfc, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
        "atan": torch.atan,
        "pow": lambda x, out: torch.pow(x, 2.5, out=out),
        "silu": lambda x, out: aten.silu.out(x, out=out),
        "gelu": lambda x, out: aten.gelu.out(x, out=out),
        "gelu_tanh": lambda x, out: aten.gelu.out(x, approximate="tanh", out=out),
        "softmax": lambda x, out: aten._softmax.out(x, -1, False, out=out),
        "log_softmax": lambda x, out: aten._log_softmax.out(x, -1, False, out=out),
    }
    row = 1024
    numel = max(numel // row, 1) * row
    probes: list[tuple[str, Any, Any]] = []
    for function in SPECIAL_FUNCTIONS:
        fn = calls[function]
        pair = []
        for shape in ((numel // row, row), (1, 1)):
            x = torch.randn(shape)
            if function.startswith("log") and function != "log_softmax" or function == "pow":
                x = x.abs() + 0.5
            out = torch.empty(shape)
            pair.append(lambda fn=fn, x=x, out=out: fn(x, out=out))
        probes.append((function, pair[0], pair[1]))
    return probes


def _special_rates(repeats: int, cache_bytes: int | None) -> dict[str, float]:
    """Evaluations per second of each special function in fp32 (:func:`_special_probes`), over a
    tensor whose input and output take a quarter of the last-level cache (at most 2^21
    elements; 2^18 when the capacity is unknown), so the function's arithmetic, not memory, sets
    the time. The rate is the marginal one, (n - 1) / (t(n) - t(1)): the time of a one-element
    call (dispatch, the fixed cost the roofline ignores) is taken off; n / t(n) when the
    difference is not positive. Each call is timed 4 x ``max(repeats, 5)`` times (best of)."""
    numel = min(max(cache_bytes // 32, 2**16), 2**21) if cache_bytes else 2**18
    rates: dict[str, float] = {}
    # short calls: timed more often than the GEMMs (a best of more runs is nearer the best rate
    # the machine attains, which is what a bound needs)
    runs = max(repeats, 5) * 4
    for function, fn, one in _special_probes(numel):
        elements = (numel // 1024) * 1024
        seconds = best_seconds(fn, runs)
        fixed = best_seconds(one, runs)
        marginal = seconds - fixed
        rates[function] = ((elements - 1) / marginal if marginal > 0 and elements > 1
                           else elements / seconds)
    return rates


def _convolution_probes() -> list[tuple[int, Any]]:
    """(FLOPs, a call) of fp32 3x3 convolutions, whose best rate is the profile's convolution
    rate (oneDNN's kernels, not the BLAS GEMM: on a CPU the two reach different fractions of
    the cores): 64 channels on 56 x 56 and 256 channels on 14 x 14, batch 8 (ResNet's shapes),
    2 x batch x C_out x H x W x C_in x 9 FLOPs each (padding 1 keeps H x W)."""
    probes: list[tuple[int, Any]] = []
    for channels, side in ((64, 56), (256, 14)):
        x = torch.randn(8, channels, side, side)
        w = torch.randn(channels, channels, 3, 3)
        flops = 2 * 8 * channels * side * side * channels * 9
        probes.append((flops, lambda x=x, w=w: torch.nn.functional.conv2d(x, w, padding=1)))
    return probes


def measure_this_machine(*, gemm_size: int = 2048, copy_mib: int = 256,
                         repeats: int = 3,
                         dtypes: tuple[str, ...] = ("fp32", "fp64", "bf16"),
                         special: bool = True) -> Hardware:
    """Measure the CPU this runs on: the best rate of an n^3 and a 512^3 GEMM per dtype (FP32,
    FP64, BF16; in FP32 also a 1x1 convolution, a GEMM over channels), the best of two FP32 3x3
    convolutions (the convolution rate), the FP32 element rate of each special function
    (:data:`SPECIAL_FUNCTIONS`, over a tensor in the last-level cache), main memory's
    read bandwidth (a sum over a buffer well beyond the caches) and write bandwidth (a copy of
    it: the time the copy takes beyond reading at the read bandwidth), and a copy that fits in
    the last-level cache (whose capacity the operating system reports:
    :func:`last_level_cache_bytes`), with torch's current thread count. Best of ``repeats``
    timings (after one warm-up; the cache copy, being short, is timed more often); the figures
    are *attained* rates, not the vendor's peaks, and the profile says so (``measured=True``).
    Bandwidths are the bytes flopscope counts for the sum and the copy (the copy's source
    read, destination read and written) over their times, the unit the roofline's estimates
    use; so the roofline gives the sum and the copy exactly their measured times.

    Args:
        gemm_size: n of the n x n x n GEMMs (2 n^3 FLOPs each).
        copy_mib: size of the summed and copied buffer in MiB (well beyond the last-level
            cache).
        repeats: timed runs per measurement.
        dtypes: the GEMM dtypes to measure, of ``fp32``, ``fp64``, ``bf16`` (``fp32`` always).
        special: measure the special-function rates (about 0.8 s with a 32 MiB L3, one
            thread); ``False``: the profile has none.

    Returns:
        The profile, named ``"this-machine"``.

    Raises:
        UsageError: a dtype that is not measured.
    """
    n = gemm_size
    rates: dict[str, float] = {}
    known = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
    unknown = sorted(set(dtypes) - set(known))
    if unknown:
        raise UsageError(f"measure_this_machine: cannot measure {', '.join(unknown)}; use "
                         f"{', '.join(known)}")
    for key, dtype in known.items():
        if key != "fp32" and key not in dtypes:
            continue
        # the roof is the best rate a GEMM attains: several probes, the fastest wins
        rates[key] = max(flops / best_seconds(fn, repeats)
                         for flops, fn in _matrix_probes(dtype, n))
    convolution = {"fp32": max(flops / best_seconds(fn, repeats)
                               for flops, fn in _convolution_probes())}
    numel = copy_mib * 2**20 // 4
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.empty_like(src)
    # reads: a read-only stream (a sum); writes: what a copy takes beyond its reads at that rate
    read_s = best_seconds(lambda: src.sum(), max(repeats, 10))
    sum_read, sum_written = _counted_bytes(lambda: src.sum())
    bandwidth = (sum_read + sum_written) / read_s
    copy_s = best_seconds(lambda: dst.copy_(src), max(repeats, 10))
    copy_read, copy_written = _counted_bytes(lambda: dst.copy_(src))
    write_s = copy_s - copy_read / bandwidth
    # a copy no slower than its reads alone: the machine's writes cost nothing extra that can be
    # measured, one bandwidth for both (the copy's, if it was the faster)
    write_bandwidth = copy_written / write_s if write_s > 0 else None
    if write_bandwidth is None:
        bandwidth = max(bandwidth, (copy_read + copy_written) / copy_s)
    cache_bytes = last_level_cache_bytes()
    cache_bandwidth = None
    what = ""
    if cache_bytes:
        # source and destination together a quarter of the cache: resident after the warm-up,
        # and beyond the private L1/L2 of one core on the CPUs this targets
        small = max(cache_bytes // 8 // 4, 1024)
        csrc = torch.ones(small, dtype=torch.float32)
        cdst = torch.empty_like(csrc)
        seconds = best_seconds(lambda: cdst.copy_(csrc), max(repeats, 5) * 20)
        cache_bandwidth = sum(_counted_bytes(lambda: cdst.copy_(csrc))) / seconds
        what = f", {small * 4 // 2**10} KiB copy in the {cache_bytes // 2**20} MiB last-level cache"
    special_rates = {"fp32": _special_rates(repeats, cache_bytes)} if special else {}
    threads = torch.get_num_threads()
    # a CPU GEMM runs on the same FMA units as everything else: one rate for matrix and vector
    return Hardware(
        name="this-machine",
        memory_bandwidth=bandwidth,
        matrix=dict(rates),
        vector=dict(rates),
        description=f"this machine, measured ({threads} threads): best of {n}^3 and 512^3 GEMM "
                    f"and a 1x1 convolution, best of two 3x3 convolutions, "
                    f"{'fp32 special-function element rates, ' if special else ''}"
                    f"{copy_mib} MiB sum and copy{what}",
        source="measured by flopscope.estimate.measure_this_machine (cache capacity from the "
               "operating system)",
        measured=True,
        cache_bytes=cache_bytes,
        cache_bandwidth=cache_bandwidth,
        write_bandwidth=write_bandwidth,
        convolution=convolution,
        special=special_rates,
    )
