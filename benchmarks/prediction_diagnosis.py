"""Where the calibrated prediction's error comes from (issue 29), call by call.

For one model (a forward at batch 1, or a training step), every ATen call is captured with its
arguments by a dispatch mode and timed three ways:

- **in the model**: the wall time of the call inside a plain run (the mode reads the clock
  before and after the kernel; its own work is outside), the median of three runs;
  all by :func:`flopscope.estimate.timers.clock` (at one thread the thread's CPU time);
- **isolated**: the same call replayed alone in a loop on the same tensors
  (:func:`flopscope.estimate.timers.time_per_call`: what a calibration point measures);
- **predicted**: flopscope's prediction of that call from a calibrated profile.

predicted / isolated is the model's error (the grid, the interpolation, the host time);
in-model / isolated is what the context adds (cold caches, fresh allocations, the operators
before it); the plain run's wall time less the sum of in-model times is the time outside every
operator (Python, modules, autograd's bookkeeping). Grouped by family and by operator.

    PYTHONPATH=src:. python -m benchmarks.prediction_diagnosis --profile P.json resnet18 ...
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from flopscope.estimate import load_hardware
from flopscope.estimate.bound import call_row, resolve_tf32
from flopscope.estimate.families import family
from flopscope.estimate.profile import Hardware
from flopscope.estimate.timers import clock, time_per_call


class Capture(TorchDispatchMode):
    """Records every call (with its arguments, ``keep``) and the time of its kernel by
    :func:`flopscope.estimate.timers.clock`, and the page faults it took."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.ops: list[str] = []
        self.times: list[float] = []
        self.faults: list[int] = []
        self.now = clock("cpu")[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = self.now()
        out = func(*args, **kwargs)
        self.times.append(self.now() - start)
        self.ops.append(str(func))
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
        if self.keep:
            self.calls.append((func, tree_map(_hold, args), tree_map(_hold, kwargs)))
        return out


class Held:
    """A large floating-point argument kept as its layout alone: a training step's arguments
    cloned whole are gigabytes (14 GB for GPT-2's), and a machine short of free memory makes
    every page fault of the calls replayed then several times dearer. :func:`_made` makes it
    again, filled with values in [0.5, 1.5) (no NaN from a square root or a division)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.size, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype
        self.offset = t.storage_offset()

    def made(self) -> torch.Tensor:
        from torch._prims_common import compute_required_storage_length

        numel = compute_required_storage_length(self.size, self.stride, self.offset)
        base = torch.empty(numel, dtype=self.dtype).uniform_(0.5, 1.5)
        return base.as_strided(self.size, self.stride, self.offset)


def _hold(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    if t.is_floating_point() and t.nbytes >= 1 << 20:
        return Held(t)
    return t.detach().clone()


def _made(x: Any) -> Any:
    return x.made() if isinstance(x, Held) else x


def _shape(args: tuple[Any, ...]) -> str:
    return " ".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))


def _predict(func: Any, args: Any, kwargs: Any,
             hw: Hardware) -> tuple[str, float, float, float, int]:
    from flopscope.core.counter import Counter
    from flopscope.estimate.roofline import CallLog

    log = CallLog()
    with Counter(warn=False, observers=[log]):
        func(*args, **kwargs)
    matmul, conv = resolve_tf32(None)
    fam, pred, host, bound = "view", 0.0, 0.0, 0.0
    fresh = sum(r.fresh_bytes or 0 for r in log.records)
    for i, rec in enumerate(log.records):
        row = call_row(rec, hw, matmul, conv)
        pred += row.predicted_s
        host += row.host_s
        bound += row.time_s
        if i == 0 or rec.flops + rec.bytes > 0:
            fam = family(rec)
    return fam, pred, host, bound, fresh


def diagnose(name: str, run: Callable[[], None], hw: Hardware) -> dict[str, Any]:
    """Per-call rows and the plain wall time of ``run``."""
    now = clock("cpu")[1]
    for _ in range(2):
        run()
    walls = []
    for _ in range(3):
        start = now()
        run()
        walls.append(now() - start)
    runs = []
    faults = []
    for _ in range(3):  # timed before the calls are kept: their clones (every argument of a
        # training step, gigabytes) would leave the kernel reclaiming memory on every page fault
        mode = Capture(keep=False)
        with mode:
            run()
        runs.append(mode.times)
        faults.append(mode.faults)
    capture = Capture(keep=True)
    with capture:
        run()
    rows = []
    for i, (func, held_args, held_kwargs) in enumerate(capture.calls):
        args, kwargs = tree_map(_made, held_args), tree_map(_made, held_kwargs)
        in_model = statistics.median(r[i] for r in runs if i < len(r))
        in_model_faults = statistics.median(f[i] for f in faults if i < len(f))
        fam, pred, host, bound, fresh = _predict(func, args, kwargs, hw)
        with torch.no_grad():
            isolated = time_per_call(lambda f=func, a=args, k=kwargs: f(*a, **k), "cpu",
                                     budget_s=0.003)
        rows.append({"op": str(func), "shape": _shape(args), "family": fam,
                     "predicted_s": pred, "host_s": host, "bound_s": bound,
                     "isolated_s": isolated, "in_model_s": in_model,
                     "in_model_page_faults": in_model_faults, "fresh_bytes": fresh})
    wall = statistics.median(walls)
    print(f"{name}: wall {wall * 1e3:.2f} ms, in-model sum "
          f"{sum(r['in_model_s'] for r in rows) * 1e3:.2f} ms, isolated sum "
          f"{sum(r['isolated_s'] for r in rows) * 1e3:.2f} ms, predicted "
          f"{sum(r['predicted_s'] for r in rows) * 1e3:.2f} ms, {len(rows)} calls",
          file=sys.stderr, flush=True)
    return {"model": name, "wall_s": wall, "rows": rows}


def table(result: dict[str, Any], key: str = "family", top: int = 12) -> str:
    """Sums per ``key`` (family or op): predicted, isolated, in the model."""
    groups: dict[str, list[float]] = {}
    for r in result["rows"]:
        k = r[key] if key != "opshape" else f"{r['op']} {r['shape']}"
        g = groups.setdefault(k, [0, 0.0, 0.0, 0.0])
        g[0] += 1
        g[1] += r["predicted_s"]
        g[2] += r["isolated_s"]
        g[3] += r["in_model_s"]
    lines = [f"{result['model']}: wall {result['wall_s'] * 1e3:.2f} ms",
             f"  {key:50s} {'calls':>5s} {'pred ms':>9s} {'isol ms':>9s} {'model ms':>9s} "
             f"{'p/isol':>6s} {'model/isol':>10s}"]
    for k, (n, p, i, m) in sorted(groups.items(), key=lambda kv: -abs(kv[1][3] - kv[1][1]))[:top]:
        lines.append(f"  {k[:50]:50s} {n:5d} {p * 1e3:9.3f} {i * 1e3:9.3f} {m * 1e3:9.3f} "
                     f"{p / i if i else 0:6.2f} {m / i if i else 0:10.2f}")
    return "\n".join(lines)


def _model(name: str) -> tuple[nn.Module, tuple[Any, ...], bool]:
    from benchmarks.models import torchvision_benches, transformer_benches

    for bench in transformer_benches():
        if bench.name == name:
            return bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu")), True
    bench = torchvision_benches([name])[0]
    return bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu")), False


def main(argv: list[str] | None = None) -> int:
    """Diagnose the models named; print the tables, write the rows as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--profile", required=True, help="a calibrated profile file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", help="JSON of every call")
    parser.add_argument("--by", default="family,op,opshape")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    hw = load_hardware(opts.profile)[0]
    results = []
    for name in opts.models:
        torch.manual_seed(0)
        model, args, train = _model(name)
        if train:
            from flopscope.execution.training import default_loss

            model.train()
            opt = torch.optim.AdamW(model.parameters())

            def run(model: nn.Module = model, args: Any = args, opt: Any = opt) -> None:
                opt.zero_grad(set_to_none=True)
                default_loss(model(*args)).backward()
                opt.step()
        else:
            def run(model: nn.Module = model, args: Any = args) -> None:
                with torch.no_grad():
                    model(*args)
        result = diagnose(name, run, hw)
        if not train:  # the whole model's prediction (its calls in order: host times by what
            # the calls before moved), per family
            import flopscope

            with torch.no_grad():
                _, est = flopscope.estimate.roofline(model, *args, hardware=hw)
            result["whole"] = {k: r.predicted_s for k, r in est.by_family.items()}
            result["whole_total_s"] = est.total.predicted_s
            print(f"{name}: whole-model prediction {est.total.predicted_s * 1e3:.2f} ms: "
                  + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in result["whole"].items()),
                  file=sys.stderr, flush=True)
        results.append(result)
        for key in opts.by.split(","):
            print(table(result, key), flush=True)
    if opts.output:
        Path(opts.output).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
