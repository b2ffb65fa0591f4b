"""A calibrated GPU profile from the GPU check's raw points (docs/gpu/calib.json, measured by
``benchmarks/gpu_calib.py`` on an H200 with torch 2.11; an H100's the same way): the shipped
profile of the device that ran them (``h200`` or ``h100-sxm``: its peaks stay the bound's) with a
``calibration`` block made of those points.

Each raw point is rebuilt on the ``meta`` device (no GPU needed) and counted by flopscope, so its
FLOPs, bytes and operator are what flopscope counts for the same call, as a calibration run on the
device would record them; its seconds are the CUDA-event time per call the check measured. Host
times: the check's tiny eager calls (``add`` for the element-wise family and operator, ``mm``,
``linear`` as ``addmm``, ``gelu``, ``layer_norm``, ``softmax``, ``conv2d`` as ``convolution``,
``sdpa`` for attention, ``view``).

Host times in a model's mixed sequence (when the calib has them; a calib without them makes the
same profile as before): each tiny call's host time *in rotation* with the others
(``host_rotation``) is its operator's and family's host time, in place of its tight loop's (a
model's call follows other operators, not itself); and the chains of layers timed eagerly at
tiny sizes (``chains``) are predicted here from the points (:func:`flopscope.estimate.chains
.chain_point`, the step with host and device overlapping) and kept where host-bound (their
device time, a CUDA graph's replay where measured, under half their eager time): the
calibration's ``chains``, whose measured / predicted multiplies the host time of their
families' calls (:meth:`flopscope.estimate.calibration.Calibration.chain_factor`; on a GPU
calibration the host's only, ``flopscope.estimate.predict.Predictor.call``).

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

from benchmarks.errors import quantile
from benchmarks.gpu_calib import GPU_CHAINS, GPU_CHAINS_SIZED, STREAM_OPS
from flopscope.estimate import get_hardware
from flopscope.estimate.calibration import GRAPH_CLOCK, Calibration, ChainPoint, Point
from flopscope.estimate.chains import chain_point, chains
from flopscope.estimate.predict import HOST_DOMINATED
from flopscope.estimate.profile import Hardware, dtype_key
from flopscope.estimate.timers import counted_call

GPU = Path(__file__).parent.parent / "docs" / "gpu"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the check's tiny host calls -> (the family whose host time it gives, the operator where a
# row does not name the ATen operators its call dispatched (files before it))
_HOST = {"add": ("elementwise", "add"), "mm": ("matmul", "mm"), "linear": ("", "addmm"),
         "gelu": ("special", "gelu"), "layer_norm": ("normalization", "native_layer_norm"),
         "softmax": ("", "_softmax"), "conv2d": ("conv", "convolution"),
         "sdpa": ("attention", ""), "view": ("view", "view"), "max_pool2d": ("pooling", "")}
MIXED_HOST = ("host_rotation", "chains", "chains_sized")
"""The calib's groups of host time in a model's mixed sequence of operators: a calib without them
makes the profile as before (host times of tight loops, no chains), which the validation
predicts beside (``benchmarks/gpu_predict.py``, :func:`baselines`). ``chains_sized``, the chains
at a batch-1 model's sizes, join the tiny ones: a call's chain factor is taken at its own size
(:meth:`flopscope.estimate.calibration.Calibration.chain_factor`), so a model's 0.2-3 MiB calls
take the factor of chains of their size, not the largest tiny chain's."""
_NOT_WORK = {"view", "t", "transpose", "expand", "unsqueeze", "_unsafe_view", "reshape",
             "detach", "alias", "as_strided", "empty", "empty_like"}  # beside the operator


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
        if "error" in s:
            continue
        dt = _DTYPES[s["dtype"]]
        x = _meta((s["numel"],), dt)
        fn = STREAM_OPS[s["op"]][0]
        fn(x)  # once uncounted: what it makes once per tensor (add's other, the running stats)
        out.append(_point(f"{s['op']} {s['numel']}", dtype_key(dt) or "fp32",
                          lambda f=fn, x=x: f(x), s["seconds"]))
    for a in raw["attention"]:
        if "error" in a:
            continue
        dt = _DTYPES[a["dtype"]]
        if a["op"] == "sdpa_cached":  # a few queries on a cache (gpu_calib.cached_attention_points)
            q = _meta((a["batch"], a["heads"], a["queries"], a["head_dim"]), dt)
            k, v = (_meta((a["batch"], a["kv_heads"], a["keys"], a["head_dim"]), dt)
                    for _ in range(2))
            out.append(_point(f"sdpa {a['batch']}x{a['heads']}x{a['queries']} on "
                              f"{a['kv_heads']}x{a['keys']}x{a['head_dim']}", dtype_key(dt) or "fp32",
                              lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                                  q, k, v, enable_gqa=True), a["seconds"]))
            continue
        q = _meta((1, a["heads"], a["seq"], a["head_dim"]), dt)
        out.append(_point(f"sdpa {a['heads']}x{a['seq']}x{a['head_dim']}"
                          f"{' causal' if a['causal'] else ''}", dtype_key(dt) or "fp32",
                          lambda q=q, c=a["causal"]: F.scaled_dot_product_attention(
                              q, q, q, is_causal=c), a["seconds"]))
    for c in raw["conv"]:
        groups = c.get("groups", 1)
        x = _meta((c["batch"], c["cin"], c["hw"], c["hw"]), torch.float32)
        w = _meta((c["cout"], c["cin"] // groups, c["k"], c["k"]), torch.float32)
        out.append(_point(f"conv2d {c['batch']}x{c['cin']}->{c['cout']} {c['hw']}x{c['hw']} "
                          f"k{c['k']}{f' groups {groups}' if groups > 1 else ''}", "fp32",
                          lambda x=x, w=w, k=c["k"], g=groups: F.conv2d(
                              x, w, padding=k // 2, groups=g), c["seconds"]))
    return out


def validations(folder: Path, date: str) -> dict[str, dict[str, Any]]:
    """The predictions beside a calib made with a profile of that calibration (their
    ``calibrated`` date, which ``benchmarks/gpu_predict.py`` writes, equal to ``date``): the
    run's own ``predict.json`` and the later runs that predicted with the shipped profile on
    other sessions' machines. A predict file without the date is the calib's own run's."""
    found = {}
    for path in sorted(folder.glob("predict*.json")):
        data = json.loads(path.read_text())
        if data.get("calibrated", date if path.name == "predict.json" else None) == date:
            found[path.name] = data
    return found


def error_bars(predicts: list[dict[str, Any]]) -> dict[str, float]:
    """The validation's error bars (``benchmarks/gpu_predict.py``'s cases, seen and held out,
    over every run of them that predicted with this calibration): per family the 90th
    percentile over the cases of |predicted / measured - 1| of the family's device time (the
    calls joined to kernels: their predicted device time against their kernels'), and
    ``total``: of the whole step against its eager time."""
    per: dict[str, list[float]] = {}
    for r in (row for predict in predicts for row in predict["rows"]):
        if "ratio" not in r:
            continue
        per.setdefault("total", []).append(abs(r["ratio"] - 1))
        for fam, f in r["families"].items():
            if f["measured_s"] > 0 and f["predicted_device_s"] > 0:
                per.setdefault(fam, []).append(abs(f["predicted_device_s"] / f["measured_s"] - 1))
    return {k: round(quantile(v, 0.9), 3) for k, v in sorted(per.items())}


def loop_only(raw: dict[str, Any]) -> dict[str, Any]:
    """The calib without its :data:`MIXED_HOST` groups: the profile made from it is the one
    made before they existed."""
    return {k: v for k, v in raw.items() if k not in MIXED_HOST}


def baselines(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The calibs whose profiles the validation predicts beside the full one's, each without
    some of the :data:`MIXED_HOST` groups the calib has: ``loop_host`` without any (tight-loop
    host times, no chains), and where it has both, ``rotation_only`` (no chains), so each
    mechanism's part is seen on the same measured times; where it has the chains at model sizes
    too, ``tiny_chains`` (the tiny chains only)."""
    has = {k for k in MIXED_HOST if isinstance(raw.get(k), list) and raw[k]}
    out = {"loop_host": loop_only(raw)} if has else {}
    if {"host_rotation", "chains"} <= has:
        out["rotation_only"] = {k: v for k, v in raw.items() if k not in ("chains", "chains_sized")}
    if {"chains", "chains_sized"} <= has:
        out["tiny_chains"] = {k: v for k, v in raw.items() if k != "chains_sized"}
    return out


def host_times(raw: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(family -> seconds, operator -> seconds) of host time per eager call, from the check's
    tiny calls: each one's time in rotation with the others where the calib has it
    (``host_rotation``), else in a tight loop of itself (``host``)."""
    rotation = {r["op"]: r["rotation_s_per_call"] for r in raw.get("host_rotation", [])
                if isinstance(r, dict) and "rotation_s_per_call" in r}
    family_host: dict[str, float] = {}
    op_host: dict[str, float] = {}
    for h in raw["host"]:
        seconds = rotation.get(h["op"], h["host_s_per_call"])
        fam, op = _HOST.get(h["op"], ("", ""))
        if fam:
            family_host[fam] = seconds
        work = [o for o in h.get("aten", []) if o not in _NOT_WORK]
        # the operator the call dispatched (the one that is not a view), else the table's
        op = work[0] if len(set(work)) == 1 else op if "aten" not in h or not work else ""
        if h["op"] in ("view", "transpose"):
            op = h["aten"][0] if h.get("aten") else op
        if op:
            op_host[op] = seconds
    return family_host, op_host


def host_bound_chains(hw: Hardware, rows: Any) -> tuple[ChainPoint, ...]:
    """The calib's chains (``benchmarks.gpu_calib.chain_rows``), rebuilt on the meta device and
    predicted by ``hw``'s calibration without chains; those whose device time (a CUDA graph's
    replay where measured, else the predicted) is under :data:`HOST_DOMINATED` of their eager
    time: host-bound, their measured / predicted the host's."""
    built = {what: (m, x) for table in (GPU_CHAINS, GPU_CHAINS_SIZED)
             for what, m, x in chains("meta", **table)}
    out = []
    for r in rows if isinstance(rows, list) else []:
        if r.get("what") not in built or not r.get("seconds", 0) > 0:
            continue
        module, x = built[r["what"]]
        point, estimate = chain_point(hw, r["what"], module, x, r["seconds"])
        device = r.get("graph_s", estimate.total.predicted_s - estimate.total.host_s)
        if device < HOST_DOMINATED * point.seconds:
            out.append(point)
    return tuple(out)


def base_profile(device: str) -> str:
    """The shipped profile whose peaks a calibration on ``device`` (a CUDA device's name) keeps:
    ``h200`` for an H200, else ``h100-sxm`` (the lent machines are H100s and H200s)."""
    return "h200" if "h200" in device.lower() else "h100-sxm"


def profile_file(summary: dict[str, Any]) -> str:
    """The calibrated profile's file name for the device in ``summary``: ``h200_calibrated.json``
    for an H200, ``h100-sxm_calibrated.json`` for an H100."""
    return f"{base_profile(summary['device'])}_calibrated.json"


def _framework(raw: dict[str, Any]) -> dict[str, float]:
    """The calib's DTensor and FSDP2 host times (:func:`benchmarks.gpu_calib.framework_points`);
    none where the calib has none (runs before round 17) or the group failed."""
    group = raw.get("framework", {})
    names = ("dtensor_call_s", "dtensor_pointwise_s", "fsdp_collective_s")
    return {k: float(group[k]) for k in names if isinstance(group, dict) and k in group}


def calibration_date(summary: dict[str, Any]) -> str:
    """The calibration's date (ISO, UTC) from the check's ``summary.json``."""
    return str(summary["date"]).replace(" UTC", "").replace(" ", "T") + ":00+00:00"


def calibrated(raw: dict[str, Any], summary: dict[str, Any],
               bars: dict[str, float] | None = None,
               validation: dict[str, Any] | None = None) -> Hardware:
    """The shipped profile of the device the check ran on (:func:`base_profile`: its peaks stay
    the bound's) with the check's points as its calibration block."""
    family_host, op_host = host_times(raw)
    date = calibration_date(summary)
    cal = Calibration(date, f"cuda ({summary['device']})", 1,
                      {"torch": summary["torch"], "cuda": summary["cuda"],
                       "source": "docs/gpu/calib.json (benchmarks/gpu_calib.py)"},
                      family_host, tuple(points(raw)), host_op_s=op_host,
                      module_call_s=raw.get("module", {}).get("module_call_s", 0.0),
                      **_framework(raw), error_bars=bars or {}, validation=validation or {},
                      clock=(GRAPH_CLOCK if raw.get("timing") == GRAPH_CLOCK else "CUDA events"))
    base = get_hardware(base_profile(summary["device"]))
    hw = dataclasses.replace(base, name=f"{base.name}-calibrated",
                             description=f"{base.description}, calibrated on one "
                                         f"{summary['device']} (torch {summary['torch']}, "
                                         f"CUDA {summary['cuda']})",
                             calibration=cal)
    rows = [r for k in ("chains", "chains_sized") if isinstance(raw.get(k), list) for r in raw[k]]
    chained = host_bound_chains(hw, rows)  # last: predicted by the rest
    return dataclasses.replace(hw, calibration=dataclasses.replace(cal, chains=chained))


def main(argv: list[str] | None = None) -> int:
    """Write the calibrated profile (default: beside the calib, named by :func:`profile_file`)."""
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else GPU / "calib.json"
    raw = json.loads(src.read_text())
    summary = json.loads((src.parent / "summary.json").read_text())
    out = Path(args[1]) if len(args) > 1 else src.parent / profile_file(summary)
    runs = validations(src.parent, calibration_date(summary))  # of profiles made from this calib
    cases = {(r["model"], r["batch"], r["train"], r["dtype"])
             for data in runs.values() for r in data["rows"] if "ratio" in r}
    validation = {"runs": len(runs), "models": len(cases), "files": sorted(runs)} if runs else None
    hw = calibrated(raw, summary, error_bars(list(runs.values())) if runs else None, validation)
    out.write_text(json.dumps(hw.to_dict(), indent=1) + "\n")
    assert hw.calibration is not None
    print(f"{out}: {len(hw.calibration.points)} points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
