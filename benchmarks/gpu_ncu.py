"""Nsight Compute for the GPU check: which counters the device has, one workload under ``ncu``,
and its report read back as executed floating-point operations.

The seed study counted PAPI_DP_OPS on the CPU (an FMA as two operations); on the GPU the same
arithmetic comes from the SASS instruction counters
``smsp__sass_thread_inst_executed_op_{f,d,h}{add,mul,fma}_pred_on`` (thread-level, predicated-on
instructions: FFMA = 2). Tensor-core work is not in those counters; it is read from the tensor
pipe's operation counters (``sm__ops_path_tensor_*``) where the device has them, raw, beside.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SASS = {  # metric suffix -> (precision, operations per instruction)
    "fadd": ("fp32", 1), "fmul": ("fp32", 1), "ffma": ("fp32", 2),
    "dadd": ("fp64", 1), "dmul": ("fp64", 1), "dfma": ("fp64", 2),
    "hadd": ("fp16", 1), "hmul": ("fp16", 1), "hfma": ("fp16", 2),
}
# The tensor pipe's operations per source type (each the sum over its hmma/hgmma/... paths, dense
# and sparse), as Nsight Compute 2025.3 lists them on an H200; every operation a FLOP (an FP64
# 1024^3 product read 2 * 1024^3). Where a source type has destination variants only (bf16, tf32)
# the fp32-destination one is the one the GPUs have.
TENSOR = ("sm__ops_path_tensor_src_fp16", "sm__ops_path_tensor_src_bf16_dst_fp32",
          "sm__ops_path_tensor_src_tf32_dst_fp32", "sm__ops_path_tensor_src_fp64",
          "sm__ops_path_tensor_src_fp8")
SASS_METRICS = [f"smsp__sass_thread_inst_executed_op_{k}_pred_on" for k in SASS]
ROOT = Path(__file__).resolve().parent.parent


def find_ncu() -> str | None:
    """``ncu`` on the PATH, or in Nsight Compute's and CUDA's usual folders."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")) + [
        Path("/usr/local/cuda/bin/ncu")]
    return next((str(c) for c in reversed(candidates) if c.exists()), None)


def available_metrics(ncu: str) -> tuple[list[str], list[str]]:
    """The metrics to ask for on this device, and what is missing.

    ``ncu`` refuses a whole run when one metric name is unknown, so the wanted names are checked
    against ``ncu --query-metrics`` first; every ``sm__ops_path_tensor*`` counter the device
    lists is asked for too (read raw; only :data:`TENSOR` enters the total).

    Args:
        ncu: the ``ncu`` executable.

    Returns:
        ``(metrics with .sum, wanted base names the device does not list)``; when the query fails,
        every wanted metric (the run will say what is wrong).
    """
    wanted = SASS_METRICS + list(TENSOR)
    try:
        text = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True,
                              timeout=120, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    listed = set(re.findall(r"\b([a-z0-9]+__[a-z0-9_]+)\b", text))
    if not listed:
        return [f"{m}.sum" for m in wanted], []
    tensor = sorted(m for m in listed if m.startswith("sm__ops_path_tensor"))
    keep = [m for m in wanted if m in listed] + [m for m in tensor if m not in wanted]
    return [f"{m}.sum" for m in keep], [m for m in wanted if m not in listed]


def parse_csv(text: str) -> dict[str, float]:
    """Each metric summed over every kernel of an ``ncu --csv --metrics ...`` report.

    Args:
        text: ncu's standard output (lines before the CSV header are skipped).

    Returns:
        Metric name -> total; ``"kernels"`` -> how many kernels the report holds.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}
    totals: dict[str, float] = {}
    kernels: set[str] = set()
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name, value = row.get("Metric Name"), (row.get("Metric Value") or "").replace(",", "")
        if not name:
            continue
        kernels.add(row.get("ID") or "")
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue  # "n/a" for a metric the architecture does not have
    totals["kernels"] = float(len(kernels))
    return totals


def per_kernel(text: str, top: int = 15) -> list[dict[str, Any]]:
    """The kernels of a report that executed the most operations, each with its executed
    operations (:func:`executed`), so a whole model's ratio can be attributed to kernels.

    Args:
        text: ncu's standard output.
        top: how many to keep.

    Returns:
        ``[{"id", "name", "fp32", "fp64", "fp16", "tensor_ops", "total"}, ...]``, most first.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        kid, name = row.get("ID") or "", row.get("Metric Name")
        value = (row.get("Metric Value") or "").replace(",", "")
        entry = kernels.setdefault(kid, {"name": (row.get("Kernel Name") or "")[:160],
                                         "metrics": {}})
        try:
            entry["metrics"][name] = float(value)
        except ValueError:
            continue
    rows = [{"id": kid, "name": k["name"], **executed(k["metrics"])} for kid, k in kernels.items()]
    return sorted(rows, key=lambda r: -r["total"])[:top]


def executed(metrics: dict[str, float]) -> dict[str, float]:
    """Floating-point operations per precision from the SASS counters (an FMA as 2), and the
    tensor pipe's operations as reported.

    Args:
        metrics: from :func:`parse_csv`.

    Returns:
        ``{"fp32": ..., "fp64": ..., "fp16": ..., "tensor_ops": ..., "total": ...}``.
    """
    out = {"fp32": 0.0, "fp64": 0.0, "fp16": 0.0}
    for key, (precision, ops) in SASS.items():
        out[precision] += ops * metrics.get(f"smsp__sass_thread_inst_executed_op_{key}_pred_on.sum",
                                            0.0)
    out["tensor_ops"] = sum(metrics.get(f"{m}.sum", 0.0) for m in TENSOR)
    out["total"] = out["fp32"] + out["fp64"] + out["fp16"] + out["tensor_ops"]
    return out


def measure(name: str, metrics: list[str], timeout: float) -> tuple[dict[str, float],
                                                                   list[dict[str, Any]]]:
    """Run workload ``name`` in a child under ``ncu`` (only the region between
    ``cudaProfilerStart/Stop``) and return its summed metrics.

    Args:
        name: a workload of ``benchmarks.gpu_check``.
        metrics: from :func:`available_metrics`.
        timeout: seconds.

    Returns:
        From :func:`parse_csv`, and the top kernels from :func:`per_kernel`.

    Raises:
        RuntimeError: ncu failed or printed no report.
    """
    ncu = find_ncu()
    if ncu is None:
        raise RuntimeError("ncu not found")
    cmd = [ncu, "--csv", "--profile-from-start", "off", "--target-processes", "all",
           "--cache-control", "none", "--metrics", ",".join(metrics),
           sys.executable, "-m", "benchmarks.gpu_check", "--run-one", name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT)
    found = parse_csv(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"ncu exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    return found, per_kernel(done.stdout)
