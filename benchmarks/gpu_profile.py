"""A calibrated H200 profile from the GPU check's raw points (docs/gpu/calib.json, measured by
``benchmarks/gpu_calib.py`` on an H200 with torch 2.11): the shipped ``h200`` profile (its peaks
stay the bound's) with a ``calibration`` block made of those points.

Each raw point is rebuilt on the ``meta`` device (no GPU needed) and counted by flopscope, so its
FLOPs, bytes and operator are what flopscope counts for the same call, as a calibration run on the
device would record them; its seconds are the CUDA-event time per call the check measured. Host
times: the check's tiny eager calls (``add`` for the element-wise family and operator, ``mm``,
``linear`` as ``addmm``, ``gelu``, ``layer_norm``, ``softmax``, ``conv2d`` as ``convolution``,
``sdpa`` for attention, ``view``).

What the points do not cover is predicted at the bound and said so (``uncalibrated_s``):
pooling, batch norm, every backward operator, the optimizers' in-place updates, embeddings, and
reductions other than a full sum.

    PYTHONPATH=src:. python -m benchmarks.gpu_profile [docs/gpu/calib.json] [OUT.json]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flopscope.estimate import get_hardware
from flopscope.estimate.calibrate import counted_call
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.profile import Hardware, dtype_key

GPU = Path(__file__).parent.parent / "docs" / "gpu"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_STREAM = {  # as benchmarks/gpu_calib.stream_points calls them
    "add": lambda x: torch.add(x, torch.empty_like(x)), "mul_scalar": lambda x: x * 2.0,
    "gelu": F.gelu, "sum": lambda x: x.sum(),
    "softmax": lambda x: torch.softmax(x.view(-1, 1024), -1),
    "layer_norm": lambda x: F.layer_norm(x.view(-1, 1024), (1024,)), "copy": lambda x: x.clone(),
}
# the check's tiny host calls -> (family, operator)
_HOST = {"add": ("elementwise", "add"), "mm": ("matmul", "mm"), "linear": ("", "addmm"),
         "gelu": ("special", "gelu"), "layer_norm": ("normalization", "native_layer_norm"),
         "softmax": ("", "_softmax"), "conv2d": ("conv", "convolution"),
         "sdpa": ("attention", ""), "view": ("view", "view")}


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=dtype)


def _point(what: str, dtype: str, fn: Any, seconds: float) -> Point:
    c = counted_call(fn)
    return Point(c.family, dtype, what, c.flops, c.bytes, seconds, c.function, c.inplace, c.op,
                 c.reduction)


def points(raw: dict[str, Any]) -> list[Point]:
    """The raw points as calibration points (counted on the meta device)."""
    out: list[Point] = []
    for g in raw["gemm"]:
        dt = _DTYPES[g["dtype"]]
        a, b = _meta((g["m"], g["k"]), dt), _meta((g["k"], g["n"]), dt)
        key = "tf32" if dt is torch.float32 and raw.get("tf32_matmul") else dtype_key(dt) or "fp32"
        out.append(_point(f"mm {g['m']}x{g['n']}x{g['k']}", key,
                          lambda a=a, b=b: torch.mm(a, b), g["seconds"]))
    for s in raw["stream"]:
        dt = _DTYPES[s["dtype"]]
        x = _meta((s["numel"],), dt)
        out.append(_point(f"{s['op']} {s['numel']}", dtype_key(dt) or "fp32",
                          lambda f=_STREAM[s["op"]], x=x: f(x), s["seconds"]))
    for a in raw["attention"]:
        dt = _DTYPES[a["dtype"]]
        q = _meta((1, a["heads"], a["seq"], a["head_dim"]), dt)
        out.append(_point(f"sdpa {a['heads']}x{a['seq']}x{a['head_dim']}"
                          f"{' causal' if a['causal'] else ''}", dtype_key(dt) or "fp32",
                          lambda q=q, c=a["causal"]: F.scaled_dot_product_attention(
                              q, q, q, is_causal=c), a["seconds"]))
    for c in raw["conv"]:
        x = _meta((c["batch"], c["cin"], c["hw"], c["hw"]), torch.float32)
        w = _meta((c["cout"], c["cin"], c["k"], c["k"]), torch.float32)
        out.append(_point(f"conv2d {c['batch']}x{c['cin']}->{c['cout']} {c['hw']}x{c['hw']} "
                          f"k{c['k']}", "fp32", lambda x=x, w=w, k=c["k"]: F.conv2d(
                              x, w, padding=k // 2), c["seconds"]))
    return out


def calibrated_h200(raw: dict[str, Any], summary: dict[str, Any]) -> Hardware:
    """The shipped ``h200`` profile with the check's points as its calibration block."""
    family_host: dict[str, float] = {}
    op_host: dict[str, float] = {}
    for h in raw["host"]:
        fam, op = _HOST[h["op"]]
        if fam:
            family_host[fam] = h["host_s_per_call"]
        if op:
            op_host[op] = h["host_s_per_call"]
    date = summary["date"].replace(" UTC", "").replace(" ", "T") + ":00+00:00"
    cal = Calibration(date, f"cuda ({summary['device']})", 1,
                      {"torch": summary["torch"], "cuda": summary["cuda"],
                       "source": "docs/gpu/calib.json (benchmarks/gpu_calib.py)"},
                      family_host, tuple(points(raw)), host_op_s=op_host, clock="CUDA events")
    return dataclasses.replace(get_hardware("h200"), name="h200-calibrated",
                               description="NVIDIA H200 SXM 141 GB, calibrated on one H200 "
                                           "(torch 2.11, CUDA 13.0)",
                               calibration=cal)


def main(argv: list[str] | None = None) -> int:
    """Write the calibrated profile (default docs/gpu/h200_calibrated.json)."""
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else GPU / "calib.json"
    out = Path(args[1]) if len(args) > 1 else GPU / "h200_calibrated.json"
    raw = json.loads(src.read_text())
    summary = json.loads((src.parent / "summary.json").read_text())
    hw = calibrated_h200(raw, summary)
    out.write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
    assert hw.calibration is not None
    print(f"{out}: {len(hw.calibration.points)} points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
