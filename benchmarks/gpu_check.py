"""GPU truth (issue 28): flopscope's counts, memory and time checked on a real GPU, in one command.

    python -m benchmarks.gpu_check --out DIR [--parts flops,attention,memory,time] [--force]

Parts (each writes ``DIR/<part>.json``; a part whose file exists is skipped unless ``--force``, so
a run cut short resumes):

- ``flops``: counted FLOPs against the floating-point instructions the GPU executed, from Nsight
  Compute's SASS counters (``smsp__sass_thread_inst_executed_op_{f,d,h}{add,mul,fma}_pred_on``,
  an FMA as 2, as the seed study counted PAPI_DP_OPS on the CPU) and the tensor pipe's operation
  counters (``sm__ops_path_tensor_src_*``), per workload: GEMMs (fp32, fp64), a convolution, layer
  norm, softmax, element-wise operators, SDPA. Each workload runs in a child process under
  ``ncu`` (``--profile-from-start off``, the region between ``cudaProfilerStart/Stop``).
- ``attention``: every SDPA backend (flash, memory-efficient, cuDNN, math; causal and not):
  flopscope's MACs against ``FlopCounterMode``'s, and the causal flash kernel's executed work
  (from ``flops``) against flopscope's block-skipping model.
- ``memory``: ``peak_memory`` (inference under no_grad, a training step with AdamW) against
  ``torch.cuda.max_memory_allocated`` minus what was allocated before.
- ``time``: ``flopscope.profile`` on CUDA (kernels joined to operators): every call's roofline
  bound against its measured kernel time, and where the run is launch-bound.

Without CUDA (here, and in CI) every part runs in a dry mode on CPU tensors with small shapes:
the workloads are built and counted, nothing is measured, and the results say so; the ncu output
parser and the ratios are tested on recorded output.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flopscope

PARTS = ("flops", "attention", "memory", "time")
SASS = {  # metric suffix -> (precision, operations per instruction)
    "fadd": ("fp32", 1), "fmul": ("fp32", 1), "ffma": ("fp32", 2),
    "dadd": ("fp64", 1), "dmul": ("fp64", 1), "dfma": ("fp64", 2),
    "hadd": ("fp16", 1), "hmul": ("fp16", 1), "hfma": ("fp16", 2),
}
TENSOR = ("sm__ops_path_tensor_src_fp16_dst_fp32", "sm__ops_path_tensor_src_bf16_dst_fp32",
          "sm__ops_path_tensor_src_fp16_dst_fp16", "sm__ops_path_tensor_src_tf32_dst_fp32",
          "sm__ops_path_tensor_src_fp64")
METRICS = [f"smsp__sass_thread_inst_executed_op_{k}_pred_on.sum" for k in SASS] + [
    f"{m}.sum" for m in TENSOR]


# -- workloads -----------------------------------------------------------------------------------
class _Fn(nn.Module):
    """A function as a module, so that flopscope counts it as a model."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def workloads(device: str, dry: bool) -> dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]]:
    """Name -> builder of (module, inputs); small shapes in dry mode, the smallest that show the
    effect on a GPU (ncu replays each kernel once per metric group)."""
    n = 64 if dry else 1024
    f16 = torch.float32 if dry else torch.float16

    def mm(dtype: torch.dtype) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
        return lambda: (_Fn(torch.mm), (torch.randn(n, n, device=device, dtype=dtype),
                                        torch.randn(n, n, device=device, dtype=dtype)))

    def conv() -> tuple[nn.Module, tuple[Any, ...]]:
        return (nn.Conv2d(64, 64, 3, padding=1).to(device),
                (torch.randn(8, 64, 16 if dry else 56, 16 if dry else 56, device=device),))

    def pointwise(fn: Callable[..., Any]) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
        return lambda: (_Fn(fn), (torch.randn(n, n, device=device),))

    def sdpa(causal: bool) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            q = torch.randn(1, 8, 128 if dry else 1024, 64, device=device, dtype=f16)
            return (_Fn(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
                a, b, c, is_causal=causal)), (q, q.clone(), q.clone()))
        return build

    return {
        "mm_fp32": mm(torch.float32),
        "mm_fp64": mm(torch.float64),
        "conv3x3_fp32": conv,
        "layer_norm": lambda: (nn.LayerNorm(n).to(device), (torch.randn(64, n, device=device),)),
        "softmax": pointwise(lambda x: torch.softmax(x, -1)),
        "gelu": pointwise(torch.nn.functional.gelu),
        "add": lambda: (_Fn(torch.add), (torch.randn(n, n, device=device),
                                         torch.randn(n, n, device=device))),
        "sdpa": sdpa(False),
        "sdpa_causal": sdpa(True),
    }


def counted(module: nn.Module, inputs: tuple[Any, ...]) -> dict[str, int]:
    """flopscope's count of one forward (no_grad)."""
    with torch.no_grad():
        report = flopscope.count(module, *inputs, warn=False)
    return {"macs": report.macs, "flops": report.flops}


# -- ncu -----------------------------------------------------------------------------------------
def parse_ncu_csv(text: str) -> dict[str, float]:
    """Each metric summed over every kernel of an ``ncu --csv --metrics ...`` report.

    Args:
        text: ncu's standard output (lines before the CSV header are skipped).

    Returns:
        Metric name -> total.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}
    totals: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name, value = row.get("Metric Name"), (row.get("Metric Value") or "").replace(",", "")
        if not name:
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue  # "n/a" for a metric the architecture does not have
    return totals


def executed(metrics: dict[str, float]) -> dict[str, float]:
    """Floating-point operations per precision from the SASS counters (an FMA as 2), and the
    tensor pipe's operations as reported.

    Args:
        metrics: from :func:`parse_ncu_csv`.

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


def _run_one(name: str) -> None:
    """In the ncu child: build one workload, warm it up, run it once between
    cudaProfilerStart/Stop."""
    module, inputs = workloads("cuda", False)[name]()
    with torch.no_grad():
        module(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        module(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def measure_flops(name: str, timeout: int = 300) -> dict[str, float] | None:
    """Run one workload under ncu; ``None`` without ncu."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    cmd = [ncu, "--csv", "--profile-from-start", "off", "--target-processes", "all",
           "--metrics", ",".join(METRICS), sys.executable, "-m", "benchmarks.gpu_check",
           "--run-one", name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise RuntimeError(f"ncu failed for {name}: {done.stderr[-800:]}")
    return executed(parse_ncu_csv(done.stdout))


# -- parts ---------------------------------------------------------------------------------------
def part_flops(device: str, dry: bool) -> dict[str, Any]:
    rows = []
    for name, build in workloads(device, dry).items():
        module, inputs = build()
        row: dict[str, Any] = {"workload": name, **counted(module, inputs)}
        ex = None if dry else measure_flops(name)
        if ex is not None:
            row["executed"] = ex
            row["ratio"] = ex["total"] / row["flops"] if row["flops"] else None
        rows.append(row)
    return {"rows": rows, "note": "executed from ncu's SASS and tensor-pipe counters"
            if not dry else "dry mode: counted only (no CUDA)"}


def part_attention(device: str, dry: bool) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    backends = [SDPBackend.MATH] if dry else [SDPBackend.FLASH_ATTENTION,
                                              SDPBackend.EFFICIENT_ATTENTION,
                                              SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    dtype = torch.float32 if dry else torch.float16
    q = torch.randn(1, 8, 128 if dry else 1024, 64, device=device, dtype=dtype)
    rows = []
    for backend in backends:
        for causal in (False, True):
            def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   causal: bool = causal) -> torch.Tensor:
                return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=causal)
            row: dict[str, Any] = {"backend": backend.name, "causal": causal}
            try:
                with sdpa_kernel(backend), torch.no_grad():
                    report = flopscope.count(_Fn(fn), q, q.clone(), q.clone(), warn=False)
                    with FlopCounterMode(display=False) as mode:
                        fn(q, q.clone(), q.clone())
                row.update(macs=report.macs, flop_counter_macs=mode.get_total_flops() // 2,
                           ops=sorted(report.by_op()))
            except RuntimeError as e:  # a backend this device or dtype does not support
                row["error"] = str(e).splitlines()[0][:200]
            rows.append(row)
    return {"rows": rows}


def part_memory(device: str, dry: bool) -> dict[str, Any]:
    import torchvision

    from flopscope.estimate import peak_memory

    size = 64 if dry else 224
    rows = []
    for name, build in (("resnet50", lambda: torchvision.models.resnet50()),):
        for train in (False, True):
            model = build().to(device)
            x = torch.randn(1 if dry else 8, 3, size, size, device=device)
            kw = {"train": True, "optimizer": "adamw"} if train else {}
            _, mem = peak_memory(model, x, **kw)
            row: dict[str, Any] = {"model": name, "train": train, "predicted": mem.peak_bytes}
            if not dry:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                if train:
                    opt = torch.optim.AdamW(model.parameters())
                    model(x).sum().backward()
                    opt.step()  # warm-up: the optimizer's state
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    model(x).sum().backward()
                    opt.step()
                else:
                    with torch.no_grad():
                        model.eval()(x)
                torch.cuda.synchronize()
                measured = torch.cuda.max_memory_allocated() - before
                row.update(measured_above_before=measured, allocated_before=before,
                           note="the training step's prediction includes what was allocated "
                                "before it (parameters, optimizer state)")
            rows.append(row)
    return {"rows": rows}


def part_time(device: str, dry: bool) -> dict[str, Any]:
    import torchvision

    if dry:
        model, x = torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32)
        report, timing = flopscope.profile(model, x, warmup=0, repeat=1, hardware="xeon-8480")
    else:
        name = torch.cuda.get_device_name().lower()
        hardware = "h200" if "h200" in name else "h100-sxm"
        model, x = torchvision.models.resnet50().eval().to(device), torch.randn(
            1, 3, 224, 224, device=device)
        report, timing = flopscope.profile(model, x, warmup=3, repeat=5, hardware=hardware)
    above = [c for c in timing.calls if c.bound is not None and c.seconds
             and c.bound.time_s > c.seconds]
    return {"device": timing.device, "wall_s": timing.wall_s, "outside_s": timing.outside_s,
            "calls": len(timing.calls), "unmatched": timing.unmatched,
            "bound_above_measured": [{"op": c.op, "module": c.module, "bound_s": c.bound.time_s,
                                      "measured_s": c.seconds} for c in above if c.bound],
            "launch_bound_share": timing.outside_s / timing.wall_s if timing.wall_s else None}


PART_FUNCTIONS = {"flops": part_flops, "attention": part_attention, "memory": part_memory,
                  "time": part_time}


def run(out: Path, parts: list[str], force: bool, dry: bool | None = None) -> dict[str, Any]:
    """Run the parts (skipping those already written unless ``force``); write the summary."""
    dry = not torch.cuda.is_available() if dry is None else dry
    device = "cpu" if dry else "cuda"
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"dry": dry, "torch": torch.__version__,
                               "device": "cpu (dry)" if dry else torch.cuda.get_device_name(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "parts": {}}
    for part in parts:
        path = out / f"{part}.json"
        if path.exists() and not force:
            summary["parts"][part] = "kept"
            continue
        start = time.perf_counter()
        try:
            data = PART_FUNCTIONS[part](device, dry)
            status = "ok"
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            data, status = {"error": f"{type(e).__name__}: {e}"}, "failed"
        data["seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(data, indent=2) + "\n")
        summary["parts"][part] = status
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check")))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--force", action="store_true", help="run parts already written again")
    parser.add_argument("--dry", action="store_true", help="dry mode even where CUDA exists")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)  # the ncu child
    args = parser.parse_args(argv)
    if args.run_one:
        _run_one(args.run_one)
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    summary = run(args.out, parts, args.force, True if args.dry else None)
    print(json.dumps(summary, indent=2))
    return 0 if all(v != "failed" for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
