"""Agreement: every tool's MACs on every benchmark model, forward and forward+backward.

Results are cached per model in a JSON file, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flopscope
from benchmarks import tools
from benchmarks.models import Bench

# Modules that thop/ptflops/calflops have a hook for and whose MACs any module counter sees.
HOOKED = {"Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
          "Linear", "NonDynamicallyQuantizableLinear", "LazyLinear", "Bilinear"}


class _TupleOutput(nn.Module):
    """Returns ``model(...)`` as a tuple: fvcore's JIT tracer rejects dict (ModelOutput) outputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        out = self.model(*args)
        return out.to_tuple() if hasattr(out, "to_tuple") else out


def where_macs_are(report: flopscope.Report) -> dict[str, int]:
    """Forward MACs by the type of the innermost module that ran the operator."""
    by_type: dict[str, int] = {}
    for rec in report.records:
        if rec.phase.value != "forward" or not rec.cost.macs:
            continue
        kind = report.modules.get(rec.module, ("", 0))[0] or "(functional, outside modules)"
        by_type[kind] = by_type.get(kind, 0) + rec.cost.macs
    return dict(sorted(by_type.items(), key=lambda kv: -kv[1]))


def measure_model(bench: Bench, tool_names: Iterable[str], *, no_grad: bool = False) -> dict[str, Any]:
    """Count one model with every tool, forward and forward+backward."""
    device = torch.device(bench.device)
    model = bench.build(device)
    inputs = bench.inputs(device)
    row: dict[str, Any] = {"model": bench.name, "family": bench.family, "device": bench.device,
                           "published_gmacs": bench.published_gmacs, "no_grad": no_grad,
                           "params": sum(p.numel() for p in model.parameters()),
                           "forward": {}, "backward": {}, "missing": {}, "seconds": {}}
    for name in tool_names:
        target = _TupleOutput(model) if name == "fvcore" and bench.family != "torchvision" else model
        for phase, backward in (("forward", False), ("backward", True)):
            if backward and no_grad:
                continue
            start = time.perf_counter()
            with torch.no_grad() if no_grad else torch.enable_grad():
                result = tools.measure(name, target, inputs, backward)
            row["seconds"][f"{name}/{phase}"] = round(time.perf_counter() - start, 3)
            row[phase][name] = result.macs if result.macs is not None else result.error
            if result.missing and not backward:
                row["missing"][name] = result.missing
    with torch.no_grad() if no_grad else torch.enable_grad():
        report = flopscope.count(model, *inputs, warn=False)
    row["where"] = where_macs_are(report)
    row["flopscope_uncounted"] = dict(report.uncounted)
    del model, inputs
    gc.collect()
    return row


def run(benches: list[Bench], tool_names: list[str], cache: Path, *, no_grad: bool = False,
        log: Any = print) -> list[dict[str, Any]]:
    """Measure every model not yet in ``cache``; returns all rows (cached and new) in order."""
    done: dict[str, dict[str, Any]] = {}
    if cache.exists():
        done = {r["model"]: r for r in json.loads(cache.read_text())}
    rows = []
    for bench in benches:
        row = done.get(bench.name)
        if row is None or set(tool_names) - set(row["forward"]):
            start = time.perf_counter()
            row = measure_model(bench, tool_names, no_grad=no_grad)
            log(f"  {bench.name:24s} {bench.device:4s} {time.perf_counter() - start:6.1f} s")
            done[bench.name] = row
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(list(done.values()), indent=1))
        rows.append(row)
    return rows


FVCORE_CPU_GMACS_LIMIT = 40.0


def fvcore_on_cpu(benches: list[Bench], cache: Path, log: Any = print) -> None:
    """Re-count with fvcore on real CPU tensors the models that were counted on ``meta``.

    fvcore's JIT trace fails on meta tensors (a ``torch._check`` gets a tensor); the other tools
    count meta models fine. Models heavier than :data:`FVCORE_CPU_GMACS_LIMIT` are left as failed.
    """
    if not cache.exists():
        return
    rows = json.loads(cache.read_text())
    by_name = {b.name: b for b in benches}
    for row in rows:
        bench = by_name.get(row["model"])
        value = row["forward"].get("fvcore")
        if (bench is None or row["device"] != "meta" or not isinstance(value, str)
                or value.startswith("n/a") or row.get("fvcore_device") == "cpu"
                or (bench.published_gmacs or 0) > FVCORE_CPU_GMACS_LIMIT):
            continue
        start = time.perf_counter()
        model = bench.build(torch.device("cpu"))
        result = tools.measure("fvcore", model, bench.inputs(torch.device("cpu")), False)
        row["forward"]["fvcore"] = result.macs if result.macs is not None else result.error
        row["fvcore_device"] = "cpu"
        if result.missing:
            row["missing"]["fvcore"] = result.missing
        log(f"  fvcore on cpu: {row['model']:20s} {time.perf_counter() - start:6.1f} s")
        del model
        gc.collect()
        cache.write_text(json.dumps(rows, indent=1))
