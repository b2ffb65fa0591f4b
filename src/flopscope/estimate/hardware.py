"""Hardware profiles by name: the shipped table of accelerators and CPUs, user profiles from a
file, and ``this-machine`` (measured on the spot).

Shipped profiles (:data:`PROFILES`) hold dense (no structured sparsity) datasheet figures, each
with its source in a comment; :func:`load_hardware` reads user profiles from a JSON (or, on
Python >= 3.11, TOML) file; :func:`get_hardware` finds one by name, file or ``this-machine``
(:func:`~flopscope.estimate.this_machine.measure_this_machine`). The profile type is
:class:`~flopscope.estimate.profile.Hardware`.

File format (JSON; TOML takes the same keys), one profile or ``{"profiles": [...]}``::

    {"name": "my-gpu", "memory_bandwidth_gb_s": 2000,
     "matrix_tflops": {"bf16": 500, "fp16": 500, "tf32": 250},
     "vector_tflops": {"fp32": 60, "fp64": 30},
     "memory_gb": 80, "cache_mib": 50, "cache_bandwidth_gb_s": 7000,
     "special_gelem_s": {"fp32": {"exp": 1.5, "tanh": 0.45}},
     "intra_node_gb_s": 450, "intra_node_latency_us": 12,
     "inter_node_gb_s": 50, "inter_node_latency_us": 25,
     "description": "...", "source": "..."}

A profile may also carry a ``"calibration"`` block (raw microbenchmark points that
``flopscope calibrate`` writes, :mod:`flopscope.estimate.calibration`): estimates on it then
predict time beside the bound.

The link keys (bytes one device sends per second in one direction, inside its node and to other
nodes, and the latency of one collective call) are what :mod:`flopscope.plan` charges a layout's
collectives at; the shipped NVIDIA data-centre profiles carry them (sources below).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopscope.errors import UsageError
from flopscope.estimate.profile import (
    DTYPE_KEYS,
    SPECIAL_FUNCTIONS,
    Hardware,
    dtype_key,
)
from flopscope.estimate.reference import MEASURED, reference
from flopscope.estimate.this_machine import (
    best_seconds,
    last_level_cache_bytes,
    measure_this_machine,
)

__all__ = [
    "DTYPE_KEYS",
    "PROFILES",
    "SPECIAL_FUNCTIONS",
    "Hardware",
    "best_seconds",
    "dtype_key",
    "get_hardware",
    "last_level_cache_bytes",
    "load_hardware",
    "measure_this_machine",
]

THIS_MACHINE = ("this", "this-machine", "this_machine", "local")
_TERA = 1e12  # the table's units: TFLOP/s, GB/s, GB
_GIGA = 1e9


def _gpu(name: str, description: str, source: str, bandwidth_gb_s: float,
         memory_gb: float | None, matrix: dict[str, float], vector: dict[str, float],
         cache_mib: float | None = None, cache_gb_s: float | None = None,
         links: tuple[float, float] | None = None) -> Hardware:
    intra, inter = links if links is not None else (None, None)
    return Hardware(name, bandwidth_gb_s * _GIGA, {k: v * _TERA for k, v in matrix.items()},
                    {k: v * _TERA for k, v in vector.items()},
                    None if memory_gb is None else int(memory_gb * _GIGA), description, source,
                    cache_bytes=None if cache_mib is None else int(cache_mib * 2**20),
                    cache_bandwidth=None if cache_gb_s is None else cache_gb_s * _GIGA,
                    intra_node_bandwidth=None if intra is None else intra * _GIGA,
                    intra_node_latency=_NVLINK_LATENCY_S if intra is not None else 0.0,
                    inter_node_bandwidth=None if inter is None else inter * _GIGA,
                    inter_node_latency=_NETWORK_LATENCY_S if inter is not None else 0.0)


# Links (GB/s one direction per GPU: intra-node NVLink, inter-node network adapter):
# - H100 SXM / H200 SXM: NVLink 4, 900 GB/s total per GPU (H100 and H200 datasheets), i.e. 450
#   GB/s each way; network: one 400 Gb/s InfiniBand NDR adapter (ConnectX-7) per GPU, as in DGX
#   H100 / HGX H200 systems (NVIDIA DGX H100 user guide), 400 / 8 = 50 GB/s.
# - H100 PCIe: NVLink bridge 600 GB/s total (H100 datasheet, PCIe), 300 each way; the same NDR
#   network assumed.
# - A100 SXM: NVLink 3, 600 GB/s total (A100 datasheet), 300 each way; network: one 200 Gb/s
#   InfiniBand HDR adapter per GPU, as in DGX A100 (DGX A100 user guide), 25 GB/s.
# Latency per collective call: NCCL's own cost model for the ring algorithm with its Simple
# protocol (src/graph/tuning.cc: base latency 8.4 us plus 3.4 us of NVLink hardware latency per
# step, one step counted) ~ 12 us inside a node; across nodes 25 us assumed (two network hops more).
# Other profiles (PCIe-only cards, AMD, CPUs) carry no link figures: a plan asks for them.
_NVLINK_LATENCY_S = 12e-6
_NETWORK_LATENCY_S = 25e-6


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
         cache_mib=50, links=(450, 50)),  # 50 MB L2 (H100 SXM5 and PCIe): NVIDIA, "NVIDIA Hopper Architecture
    # In-Depth" (developer blog, 2022): "A 50 MB L2 cache in H100 is 1.25x larger than the A100
    # 40 MB L2"; the GH100 die has 60 MB, of which the products enable 50.
    # Same datasheet, H100 PCIe: FP64 26, FP64 TC 51, FP32 51, TF32 756/2 = 378, BF16/FP16
    # 1513/2 = 756.5, FP8 3026/2 = 1513, INT8 3026/2 = 1513; 80 GB HBM2e at 2.0 TB/s.
    # Non-tensor FP16/BF16: whitepaper Table 3 (PCIe) 102.4.
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80 GB", "NVIDIA H100 datasheet (PCIe); H100 whitepaper "
         "Table 3 for non-tensor FP16/BF16", 2000, 80,
         {"fp64": 51, "tf32": 378, "bf16": 756.5, "fp16": 756.5, "fp8": 1513, "int8": 1513},
         {"fp64": 26, "fp32": 51, "bf16": 102.4, "fp16": 102.4}, cache_mib=50,
         links=(300, 50)),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200, 2024), H200 SXM:
    # the same compute as H100 SXM (FP64 34, FP64 TC 67, FP32 67, TF32 989/2, BF16/FP16 1979/2,
    # FP8 3958/2, INT8 3958/2); 141 GB HBM3e at 4.8 TB/s.
    # L2: the same GH100 configuration as H100 SXM (50 MB, see above).
    _gpu("h200", "NVIDIA H200 SXM 141 GB", "NVIDIA H200 datasheet (SXM)", 4800, 141,
         {"fp64": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979, "int8": 1979},
         {"fp64": 34, "fp32": 67, "bf16": 133.8, "fp16": 133.8}, cache_mib=50,
         links=(450, 50)),
    # NVIDIA A100 Tensor Core GPU datasheet (2021), A100 SXM: FP64 9.7, FP64 TC 19.5, FP32 19.5,
    # TF32 TC 312/2 = 156, BF16/FP16 TC 624/2 = 312, INT8 TC 1248/2 = 624 (no FP8); 40 GB HBM2 at
    # 1,555 GB/s, 80 GB HBM2e at 2,039 GB/s. Non-tensor FP16/BF16 78 (NVIDIA A100 Tensor Core
    # GPU Architecture whitepaper, Table 1).
    # L2: 40 MB (A100 whitepaper; NVIDIA's Hopper blog above compares against "the A100 40 MB L2").
    _gpu("a100-40gb", "NVIDIA A100 SXM4 40 GB", "NVIDIA A100 datasheet (SXM 40GB); A100 "
         "whitepaper Table 1 for non-tensor FP16/BF16", 1555, 40,
         {"fp64": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
         {"fp64": 9.7, "fp32": 19.5, "bf16": 78, "fp16": 78}, cache_mib=40,
         links=(300, 25)),
    _gpu("a100-80gb", "NVIDIA A100 SXM4 80 GB", "NVIDIA A100 datasheet (SXM 80GB); A100 "
         "whitepaper Table 1 for non-tensor FP16/BF16", 2039, 80,
         {"fp64": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
         {"fp64": 9.7, "fp32": 19.5, "bf16": 78, "fp16": 78}, cache_mib=40,
         links=(300, 25)),
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
"""The shipped profiles by name, as their datasheets give them (no calibration)."""
ACCELERATORS = ("h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l4", "l40s", "mi300x")
"""The shipped GPU profiles: :func:`get_hardware` gives each a reference calibration
(:mod:`flopscope.estimate.reference`); the shipped CPUs predict only once calibrated."""


@functools.cache
def _shipped(name: str) -> Hardware:
    """A shipped profile as :func:`get_hardware` gives it: a GPU with its reference calibration."""
    hw = PROFILES[name]
    if name not in ACCELERATORS:
        return hw
    return dataclasses.replace(hw, calibration=reference(hw, {n: PROFILES[n] for n in MEASURED}))


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
        UsageError: an empty name, no such profile, or a profile file that does not exist (close
            matches are suggested; the shipped profiles are listed).
    """
    if isinstance(spec, Hardware):
        return spec
    known = f"{', '.join(PROFILES)}, this-machine, or a JSON or TOML file of profiles"
    if not isinstance(spec, str):
        raise UsageError(f"hardware must be a profile name, a file or a Hardware, not "
                         f"{type(spec).__name__}; known: {known}")
    if not spec.strip():
        raise UsageError(f"the hardware name is empty ({spec!r}): name one of {known}")
    key = spec.strip().lower()
    key = _ALIASES.get(key, key)
    if key in PROFILES:
        return _shipped(key)
    if key in THIS_MACHINE:
        return measure_this_machine()
    path, _, name = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    if Path(path).suffix.lower() in (".json", ".toml") and not Path(path).is_file():
        raise UsageError(
            f"hardware profile file {path!r} does not exist"
            + (" (it is a directory)" if Path(path).is_dir() else "")
            + f"; give an existing file or a shipped profile: {known}")
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
        f"{known}"
    )
