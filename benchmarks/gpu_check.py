"""GPU truth (issue 28): flopscope's counts, memory and time checked on a real GPU, in one command.

    python -m benchmarks.gpu_check --out DIR [--parts attention,memory,time,calib,predict,flops,serve]
                                   [--budget SECONDS] [--force]

Parts (each writes ``DIR/<part>.json``; a part whose file is complete is skipped unless
``--force``, and ``flops`` keeps each workload it finished, so a run cut short resumes):

- ``attention``: every SDPA backend (flash, memory-efficient, cuDNN, math; causal and not):
  flopscope's MACs against ``FlopCounterMode``'s.
- ``memory``: ``peak_memory`` (inference under no_grad, a training step with AdamW) against
  ``torch.cuda.max_memory_allocated`` for resnet50, GPT-2 small and a Llama-style decoder.
- ``time``: ``flopscope.profile`` on CUDA (kernels joined to operators): every call's roofline
  bound against its measured kernel time, and the share of the run outside every kernel
  (launch-bound), at batch 1 and a large batch, inference and a training step.
- ``calib``: raw calibration points (GEMMs, streaming operators, attention, convolutions, host
  time per call in a loop and in rotation, chains of layers timed eagerly) for the prediction
  issue (``benchmarks/gpu_calib.py``).
- ``predict``: the calibrated prediction (a profile made from this run's ``calib`` part when it
  is complete; beside it the same calib's profiles without its mixed-operator host times)
  against measured eager and CUDA-graph times of whole-model forwards and training steps, per
  family against the joined kernels (``benchmarks/gpu_predict.py``).
- ``flops``: counted FLOPs against the floating-point instructions the GPU executed, from Nsight
  Compute's SASS and tensor-pipe counters (``benchmarks/gpu_ncu.py``), per workload: GEMMs (fp32,
  fp64, fp16), a convolution, layer norm, softmax, element-wise operators, SDPA, and whole models
  (resnet50, vit_b_16, BERT-base, a Llama-style decoder layer; forward, and forward + backward).
  Each workload runs in a child process under ``ncu`` (the region between
  ``cudaProfilerStart/Stop``, after a warm-up run).

- ``serve``: the serving planner's four forwards (prefill, first and last decode steps,
  continuous batching's mixed step) of Llama-shaped 1B and 8B decoders in bfloat16, timed
  eagerly (``benchmarks/gpu_serve.py``, which predicts them afterwards on the CPU).

``--budget`` stops starting new ``flops`` workloads after that many seconds from the start (the
rest are left for a rerun). Without CUDA (here, and in CI) every part runs in a dry mode on CPU
tensors with small shapes: the workloads are built and counted, nothing is measured by ncu, and the
results say so.
"""

from __future__ import annotations

import argparse
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
from benchmarks import gpu_ncu
from benchmarks.gpu_calib import part_calib
from benchmarks.gpu_models import free, hf_model
from benchmarks.gpu_predict import part_predict, walls
from benchmarks.gpu_serve import part_serve

PARTS = ("attention", "memory", "time", "calib", "predict", "flops", "serve")
Build = Callable[[], tuple[nn.Module, tuple[Any, ...]]]


# -- workloads -----------------------------------------------------------------------------------
class _Fn(nn.Module):
    """A function as a module, so that flopscope counts it as a model."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def workloads(device: str, dry: bool) -> dict[str, Build]:
    """Name -> builder of (module, inputs); small shapes in dry mode, the smallest that show the
    effect on a GPU (ncu replays each kernel once per pass). A name ending ``_bwd`` runs forward
    and backward (gradients of the parameters from ones, as ``count(backward=True)``)."""
    import torchvision

    n = 64 if dry else 1024
    f16 = torch.float32 if dry else torch.float16

    def mm(dtype: torch.dtype) -> Build:
        return lambda: (_Fn(torch.mm), (torch.randn(n, n, device=device, dtype=dtype),
                                        torch.randn(n, n, device=device, dtype=dtype)))

    def pointwise(fn: Callable[..., Any]) -> Build:
        return lambda: (_Fn(fn), (torch.randn(n, n, device=device),))

    def sdpa(causal: bool) -> Build:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            q = torch.randn(1, 8, 128 if dry else 1024, 64, device=device, dtype=f16)
            return (_Fn(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
                a, b, c, is_causal=causal)), (q, q.clone(), q.clone()))
        return build

    def vision(name: str) -> Build:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            if name == "vit_b_16":
                model = (torchvision.models.VisionTransformer(32, 16, 1, 2, 32, 64) if dry
                         else torchvision.models.vit_b_16())
                size = 32 if dry else 224
            else:
                model, size = torchvision.models.resnet50(), 64 if dry else 224
            return model.to(device).eval(), (torch.randn(1, 3, size, size, device=device),)
        return build

    def hf(kind: str) -> Build:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            model, ids = hf_model(kind, dry, device)
            return model, (ids,)
        return build

    micro: dict[str, Build] = {
        "mm_fp32": mm(torch.float32), "mm_fp64": mm(torch.float64), "mm_fp16": mm(f16),
        "conv3x3_fp32": lambda: (nn.Conv2d(64, 64, 3, padding=1).to(device), (torch.randn(
            8, 64, 16 if dry else 56, 16 if dry else 56, device=device),)),
        "layer_norm": lambda: (nn.LayerNorm(n).to(device), (torch.randn(64, n, device=device),)),
        "softmax": pointwise(lambda x: torch.softmax(x, -1)),
        "gelu": pointwise(torch.nn.functional.gelu),
        "add": lambda: (_Fn(torch.add), (torch.randn(n, n, device=device),
                                         torch.randn(n, n, device=device))),
        "sdpa": sdpa(False), "sdpa_causal": sdpa(True),
    }
    models = {"llama_layer": hf("llama_layer"), "bert": hf("bert"),
              "resnet50": vision("resnet50"), "vit_b_16": vision("vit_b_16")}
    return {**micro, **models, **{f"{k}_bwd": v for k, v in models.items()}}


def _forward(module: nn.Module, inputs: tuple[Any, ...], backward: bool) -> None:
    """The measured region: one forward (no_grad), or forward and backward as count does it."""
    if not backward:
        with torch.no_grad():
            module(*inputs)
        return
    out = module(*inputs)
    params = [p for p in module.parameters() if p.requires_grad]
    torch.autograd.grad(out, params, grad_outputs=torch.ones_like(out), allow_unused=True)


def counted(module: nn.Module, inputs: tuple[Any, ...], backward: bool) -> dict[str, int]:
    """flopscope's count of the same region."""
    if backward:
        report = flopscope.count(module, *inputs, backward=True, warn=False)
    else:
        with torch.no_grad():
            report = flopscope.count(module, *inputs, warn=False)
    return {"macs": report.macs, "flops": report.flops}


def _run_one(name: str) -> None:
    """In the ncu child: build one workload, warm it up, run it once between
    cudaProfilerStart/Stop."""
    module, inputs = workloads("cuda", False)[name]()
    backward = name.endswith("_bwd")
    _forward(module, inputs, backward)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    _forward(module, inputs, backward)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# -- parts ---------------------------------------------------------------------------------------
def part_flops(device: str, dry: bool, path: Path, deadline: float) -> dict[str, Any]:
    """Counted against executed per workload; each finished row is written at once, and rows
    already in ``path`` are kept (a rerun goes on where the last stopped)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    done = {r["workload"]: r for r in old.get("rows", []) if "error" not in r}
    ncu = None if dry else gpu_ncu.find_ncu()
    data: dict[str, Any] = {"note": "dry mode: counted only (no CUDA)" if dry else
                            "executed from ncu's SASS and tensor-pipe counters", "rows": []}
    metrics: list[str] = []
    if ncu is not None:
        if "metrics" in old:
            metrics, missing = old["metrics"], old.get("metrics_missing", [])
        else:
            metrics, missing = gpu_ncu.available_metrics(ncu)
        data.update(metrics=metrics, metrics_missing=missing,
                    ncu_version=subprocess.run([ncu, "--version"], capture_output=True,
                                               text=True, check=False).stdout.strip()[-80:])
    elif not dry:
        data["note"] = "ncu not found: counted only"
    for name, build in workloads(device, dry).items():
        if name in done:
            data["rows"].append(done[name])
            continue
        row: dict[str, Any] = {"workload": name}
        try:
            module, inputs = build()
            row.update(counted(module, inputs, name.endswith("_bwd")))
            del module, inputs
            left = deadline - time.time()
            if ncu is not None and left < 20:
                row["error"] = "not run: out of budget (rerun to go on)"
            elif ncu is not None:
                start = time.time()
                raw, kernels = gpu_ncu.measure(name, metrics, timeout=min(240.0, left))
                row.update(executed=gpu_ncu.executed(raw), raw=raw, top_kernels=kernels,
                           ncu_seconds=round(time.time() - start, 1))
                row["ratio"] = row["executed"]["total"] / row["flops"] if row["flops"] else None
        except subprocess.TimeoutExpired:
            row["error"] = "timeout under ncu"
        except Exception as e:  # noqa: BLE001 - one workload failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:600]
        data["rows"].append(row)
        path.write_text(json.dumps(data, indent=2) + "\n")
        free()
    return data


class _Attention(nn.Module):
    """SDPA over query, key and value held as parameters, so that ``count(backward=True)``
    counts the attention's backward (gradients of the parameters)."""

    def __init__(self, q: torch.Tensor, causal: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Parameter(q.clone()) for _ in range(3))
        self.causal = causal

    def forward(self) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v,
                                                                 is_causal=self.causal)


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
            for backward in (False, True):
                row: dict[str, Any] = {"backend": backend.name, "causal": causal,
                                       "backward": backward}
                try:
                    module = _Attention(q, causal)
                    with sdpa_kernel(backend):
                        with torch.set_grad_enabled(backward):
                            report = flopscope.count(module, backward=backward, warn=False)
                        with FlopCounterMode(display=False) as mode, \
                                torch.set_grad_enabled(backward):
                            out = module()
                            if backward:
                                out.backward(torch.ones_like(out))
                    row.update(macs=report.macs, flop_counter_macs=mode.get_total_flops() // 2,
                               ops=sorted(report.by_op()))
                except RuntimeError as e:  # a backend this device or dtype does not support
                    row["error"] = str(e).splitlines()[0][:200]
                rows.append(row)
    return {"rows": rows}


def _memory_models(device: str, dry: bool) -> dict[str, Build]:
    import torchvision

    def resnet() -> tuple[nn.Module, tuple[Any, ...]]:
        size = 64 if dry else 224
        return (torchvision.models.resnet50().to(device),
                (torch.randn(1 if dry else 8, 3, size, size, device=device),))

    def hf(kind: str) -> Build:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            model, ids = hf_model(kind, dry, device)
            return model, (ids.repeat(1 if dry else 4, 1),)
        return build

    return {"resnet50": resnet, "gpt2": hf("gpt2"), "llama": hf("llama")}


def _measured_step(model: nn.Module, x: Any, train: bool) -> dict[str, int]:
    """The allocator's peak over one inference forward, or one steady-state AdamW step (a
    warm-up step first), as flopscope's step runs it."""
    free()
    torch.cuda.synchronize()
    if train:
        model.train()
        opt = torch.optim.AdamW(model.parameters())
        model(*x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    else:
        model.eval()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    if train:
        model(*x).sum().backward()
        opt.step()
    else:
        with torch.no_grad():
            model(*x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"allocated_before": before, "max_allocated": peak,
            "max_reserved": torch.cuda.max_memory_reserved()}


def part_memory(device: str, dry: bool) -> dict[str, Any]:
    from flopscope.estimate import peak_memory

    rows = []
    for name, build in _memory_models(device, dry).items():
        for train in (False, True):
            row: dict[str, Any] = {"model": name, "train": train}
            try:
                model, x = build()
                kw: dict[str, Any] = {"train": True, "optimizer": "adamw"} if train else {}
                row["predicted"] = peak_memory(model, *x, **kw).memory.to_dict()
                row["predicted"].pop("by_module", None)
                # what a user sizing the GPU from a laptop gets: shape-only, the GPU's foreach AdamW
                if train:
                    kw["optimizer"] = lambda p: torch.optim.AdamW(p, foreach=True)
                meta = peak_memory(model, *x, shape_only=True, **kw).memory
                row["predicted_shape_only"] = meta.peak_bytes
                if not dry:
                    row["measured"] = _measured_step(model, x, train)
                del model, x
            except Exception as e:  # noqa: BLE001 - one model failing must not lose the others
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            free()
    return {"rows": rows, "note": "predicted peak_bytes counts every live tensor (parameters, "
            "gradients and optimizer state included); measured max_allocated is the allocator's "
            "absolute peak in a process that holds only this model and its inputs"}


def _hardware() -> str:
    from benchmarks.gpu_profile import base_profile

    return base_profile(torch.cuda.get_device_name())


def part_time(device: str, dry: bool) -> dict[str, Any]:
    import torchvision

    runs = []
    cases = [(1, False), (32, False), (32, True)] if not dry else [(1, False), (2, True)]
    for batch, train in cases:
        model = (torchvision.models.resnet18() if dry else torchvision.models.resnet50()).to(device)
        x = torch.randn(batch, 3, 32 if dry else 224, 32 if dry else 224, device=device)
        case: dict[str, Any] = {"model": "resnet18" if dry else "resnet50", "batch": batch,
                                "train": train}
        try:
            _, timing = flopscope.profile(model.eval(), x, train=train, warmup=0 if dry else 3,
                                          repeat=1 if dry else 5,
                                          hardware="xeon-8480" if dry else _hardware())
            calls = [c for c in timing.calls if c.seconds]
            above = [c for c in calls if c.bound is not None and c.bound.time_s > c.seconds]
            top = sorted(calls, key=lambda c: c.seconds or 0.0, reverse=True)[:12]
            case.update(
                device=timing.device, wall_s=timing.wall_s, outside_s=timing.outside_s,
                calls=len(timing.calls), unmatched=timing.unmatched,
                bound_sum_s=sum(c.bound.time_s for c in calls if c.bound),
                measured_sum_s=sum(c.seconds or 0.0 for c in calls),
                launch_bound_share=timing.outside_s / timing.wall_s if timing.wall_s else None,
                unmatched_by_phase={  # as Timing.unmatched: calls that do work
                    str(p): sum(1 for c in timing.calls if not c.matched and c.phase == p
                                and (c.cost.flops or c.cost.bytes))
                    for p in {c.phase for c in timing.calls}},
                bound_above_measured=[{"op": c.op, "module": c.module, "bound_s": c.bound.time_s,
                                       "measured_s": c.seconds} for c in above if c.bound][:20],
                top=[{"op": c.op, "module": c.module, "measured_s": c.seconds,
                      "bound_s": c.bound.time_s if c.bound else None} for c in top])
            case.update(walls(model, x, train, device))
        except Exception as e:  # noqa: BLE001
            case["error"] = f"{type(e).__name__}: {e}"[:400]
        runs.append(case)
        del model, x
        free()
    return {"runs": runs}


def run(out: Path, parts: list[str], force: bool, dry: bool | None = None,
        budget: float = 1e9) -> dict[str, Any]:
    """Run the parts (skipping those complete unless ``force``); write the summary."""
    deadline = time.time() + budget
    dry = not torch.cuda.is_available() if dry is None else dry
    device = "cpu" if dry else "cuda"
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"dry": dry, "torch": torch.__version__,
                               "cuda": torch.version.cuda,
                               "device": "cpu (dry)" if dry else torch.cuda.get_device_name(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "parts": {}}
    if not dry:
        smi = shutil.which("nvidia-smi")
        summary["driver"] = subprocess.run(
            [smi, "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, check=False).stdout.strip() if smi else None
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")  # the parts read it
    for part in parts:
        path = out / f"{part}.json"
        if path.exists() and not force and json.loads(path.read_text()).get("complete"):
            summary["parts"][part] = "kept"
            continue
        if force and path.exists():
            path.unlink()
        start = time.perf_counter()
        print(f"[gpu_check] {part} ...", file=sys.stderr, flush=True)
        try:
            data = (part_flops(device, dry, path, deadline) if part == "flops"
                    else part_predict(device, dry, out) if part == "predict"
                    else PART_FUNCTIONS[part](device, dry))
            status = "ok"
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            data, status = {"error": f"{type(e).__name__}: {e}"}, "failed"
        unfinished = [r["workload"] for r in data.get("rows", []) if part == "flops"
                      and str(r.get("error", "")).startswith("not run")]
        data["complete"] = status == "ok" and not unfinished
        data["seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(data, indent=2) + "\n")
        summary["parts"][part] = status if not unfinished else f"partial: {len(unfinished)} left"
        print(f"[gpu_check] {part}: {summary['parts'][part]} in {data['seconds']:.0f} s",
              file=sys.stderr, flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


PART_FUNCTIONS: dict[str, Callable[[str, bool], dict[str, Any]]] = {
    "attention": part_attention, "memory": part_memory, "time": part_time, "calib": part_calib,
    "serve": part_serve}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check")))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--budget", type=float, default=1e9,
                        help="seconds after which no new flops workload starts")
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
    summary = run(args.out, parts, args.force, True if args.dry else None, args.budget)
    print(json.dumps(summary, indent=2))
    return 0 if all(v == "ok" or v == "kept" for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
