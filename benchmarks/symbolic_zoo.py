"""The test zoo counted symbolically: every model's formula, evaluated at other sizes, against
concrete shape-only counts at those sizes.

For each model (``hf``: :data:`flopscope.zoo.HF_ZOO`; ``timm``: :data:`flopscope.zoo.TIMM_ZOO`;
``torchvision``: every classification model) the inputs the source builds are traced with
``batch`` and ``seq_len`` (``hf``) or ``batch`` and ``resolution`` (vision) symbolic, at batch 2;
then at two other points the evaluated report must equal a concrete shape-only count of the same
model at those input sizes: the total and every module's inclusive cost (MACs, FLOPs, bytes).
A point outside the formula's domain (a guard PyTorch recorded, such as ``resolution == 224``
for a model that asserts its input size, or maxvit_t's window grid fixed at construction, which
holds for resolutions 221 to 224) is moved to the nearest point inside it, another size than the
traced one where the domain has one, and reported. Each model's status:

- ``equal``: every evaluated point equals the concrete count (or, where the shape-only count
  differs, the real count on the CPU with weights: a kernel can take another path on ``meta``
  tensors than on CPU ones, and the symbolic count's fake tensors are CPU tensors; ``notes``
  says so);
- ``mismatch``: some point differs (what differs is listed);
- ``refused``: the symbolic count raised a :class:`flopscope.ForwardError`/``UsageError`` (its
  message, which must say what could not be symbolic);
- ``error``: anything else (a crash: a bug).

Usage::

    python -m benchmarks.symbolic_zoo --library hf [--models gpt2,llama] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

POINTS = {"hf": [{"batch": 3, "seq_len": 24}, {"batch": 2, "seq_len": 40}],
          "vision": [{"batch": 3, "resolution": 0}, {"batch": 2, "resolution": 32}]}
"""Evaluation points; a vision ``resolution`` is an offset from the traced resolution."""


def _resized(args: tuple[Any, ...], kwargs: dict[str, Any],
             places: dict[str, list[tuple[int | str, int]]], values: dict[str, int]
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs with each named dimension set to its value (new zero tensors)."""
    sizes: dict[int | str, list[int]] = {}
    for name, where in places.items():
        for arg, dim in where:
            t = args[arg] if isinstance(arg, int) else kwargs[arg]
            sizes.setdefault(arg, list(t.shape))[dim] = values[name]

    def new(arg: int | str, t: Any) -> Any:
        if arg not in sizes:
            return t
        return torch.zeros(sizes[arg], dtype=t.dtype, device=t.device)

    return (tuple(new(i, a) for i, a in enumerate(args)),
            {k: new(k, v) for k, v in kwargs.items()})


def _differences(concrete: Any, evaluated: Any) -> list[str]:
    out = []
    if evaluated.total() != concrete.total():
        out.append(f"total {evaluated.total()} != {concrete.total()}")
    mods_c = {p: s.inclusive for p, s in concrete.by_module().items()}
    mods_e = {p: s.inclusive for p, s in evaluated.by_module().items()}
    bad = [p for p in mods_c if mods_e.get(p) != mods_c[p]]
    if bad:
        out.append(f"{len(bad)} modules differ, first '{bad[0]}'")
    return out


def _inside(rep: Any, values: dict[str, int], traced: dict[str, int],
            bad: list[str]) -> dict[str, int] | None:
    """The point nearest to ``values`` inside the formula's domain, moving only the symbols that
    the violated guards ``bad`` name, each within 64 of its traced size; a point other than the
    traced one where there is one (``resolution == 224`` leaves only the traced size; maxvit_t's
    window grid allows 221 to 224). ``None``: none found."""
    names = [n for n in values if any(n in b for b in bad)]
    best: dict[str, int] | None = None
    for n in names:
        lo, hi = max(1, traced[n] - 64), traced[n] + 64
        order = sorted(range(lo, hi + 1), key=lambda v, n=n: (v == traced[n], abs(v - values[n]), v))
        for v in order:
            trial = {**(best or values), n: v}
            if not rep.violated(**trial):
                best = trial
                break
    if best is None and names:  # the symbols together: the traced sizes
        trial = {**values, **{n: traced[n] for n in names}}
        best = None if rep.violated(**trial) else trial
    return best


def _real_count(library: str, name: str, kind: str, args: tuple[Any, ...],
                kwargs: dict[str, Any], cache: list[Any]) -> Any:
    """A real count (weights, CPU, no grad) of the model at the inputs' sizes; ``None`` when it
    cannot be made."""
    import flopscope
    from flopscope.sources import load_model

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not cache:
                cache.append(load_model(f"{library}:{name}", shape_only=False, batch=2,
                                        seq_len=16 if kind == "hf" else None).model)

            def cpu(t: Any) -> Any:
                return torch.zeros(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t

            with torch.no_grad():
                return flopscope.count(copy.deepcopy(cache[0]), *map(cpu, args), warn=False,
                                       **{k: cpu(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001  (then the shape-only difference stands)
        return None


def check_model(library: str, name: str) -> dict[str, Any]:
    """Count one model symbolically and compare its formula with concrete counts (one row)."""
    import flopscope
    from flopscope.cli.symbolic import symbol_places
    from flopscope.sources import load_model
    from flopscope.symbolic import count_symbolic

    start = time.perf_counter()
    row: dict[str, Any] = {"library": library, "model": name}
    kind = "hf" if library == "hf" else "vision"
    names = ["batch", "seq_len"] if kind == "hf" else ["batch", "resolution"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = load_model(f"{library}:{name}", shape_only=True, batch=2,
                                seq_len=16 if kind == "hf" else None)
            places = symbol_places(names, loaded.args, loaded.kwargs)
            traced = {n: int((loaded.args[w] if isinstance(w, int) else loaded.kwargs[w]).shape[d])
                      for n, ws in places.items() for w, d in ws[:1]}
            # every count gets a fresh copy: a model may keep state between calls (timm's
            # levit caches its attention biases per device, so a second count skips the
            # aten.index that builds them)
            pristine = copy.deepcopy(loaded.model)
            rep = count_symbolic(copy.deepcopy(pristine), *loaded.args, symbolic=places,
                                 warn=False, **loaded.kwargs)
    except (flopscope.ForwardError, flopscope.UsageError) as e:
        row.update(status="refused", message=" ".join(str(e).split())[:300],
                   seconds=time.perf_counter() - start)
        return row
    except Exception as e:  # noqa: BLE001  (a crash is a row: the sweep goes on)
        row.update(status="error", message=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                   seconds=time.perf_counter() - start)
        return row
    row["traced"] = traced
    row["domain"] = rep.domain_text()
    row["macs"] = str(rep.total().macs)
    row["unknowns"] = rep.unknowns
    checked, problems, moved, notes = [], [], [], []
    real_model: list[Any] = []  # the model with weights, loaded at the first mismatch
    for point in POINTS[kind]:
        values = dict(point)
        if kind == "vision":
            values["resolution"] = traced["resolution"] + point["resolution"]
        bad = rep.violated(**values)
        if bad:  # outside the domain: the nearest point inside it
            asked = dict(values)
            values = _inside(rep, values, traced, bad)
            if values is None:
                moved.append(f"{asked}: outside the domain ({'; '.join(bad)})")
                continue
            moved.append(f"{asked} -> {values} (outside the domain: {'; '.join(bad)[:200]})")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args, kwargs = _resized(loaded.args, loaded.kwargs, places, values)
                concrete = flopscope.count(copy.deepcopy(pristine), *args, shape_only=True,
                                           warn=False, **kwargs)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{values}: concrete count failed: {type(e).__name__}: {str(e)[:120]}")
            continue
        evaluated = rep.evaluate(**values)
        diff = _differences(concrete, evaluated)
        if diff:  # the shape-only count runs on meta tensors, where a kernel may take another
            # path than on the CPU (the symbolic count's fake tensors are CPU tensors): the real
            # count decides
            real = _real_count(library, name, kind, args, kwargs, real_model)
            if real is not None and not _differences(real, evaluated):
                notes.append(f"{values}: equal to the real count; the shape-only count differs "
                             f"({diff[0]})")
                diff = []
        checked.append(values)
        problems += [f"{values}: {d}" for d in diff]
    row.update(status="mismatch" if problems else "equal" if checked else "not checked",
               checked=checked, problems=problems, moved=moved, notes=notes,
               seconds=time.perf_counter() - start)
    return row


def in_process(library: str, name: str, timeout: float) -> dict[str, Any]:
    """:func:`check_model` in a fresh process, given ``timeout`` seconds (status ``timeout``)."""
    import subprocess

    start = time.perf_counter()
    cmd = [sys.executable, "-m", "benchmarks.symbolic_zoo", "--one", library, name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired:
        return {"library": library, "model": name, "status": "timeout",
                "message": f"no result within {timeout:.0f} s", "seconds": timeout}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"library": library, "model": name, "status": "error",
                "message": done.stderr.strip()[-300:], "seconds": time.perf_counter() - start}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def sweep(library: str, models: list[str], log: Any = print,
          timeout: float = 300.0) -> list[dict[str, Any]]:
    """Every model in its own process (a model may take minutes: ``timeout`` each)."""
    rows = []
    for name in models:
        row = in_process(library, name, timeout)
        log(f"  {library}:{name:32s} {row['status']:9s} {row['seconds']:6.1f} s  "
            f"{row.get('domain', row.get('message', ''))[:90]}")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from flopscope.zoo import zoo_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", choices=("hf", "timm", "torchvision"))
    parser.add_argument("--models", help="comma-separated names (default: the zoo's selection)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model")
    parser.add_argument("--one", nargs=2, metavar=("LIBRARY", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        warnings.simplefilter("ignore")
        print(json.dumps(check_model(*args.one), default=str))
        return 0
    if not args.library:
        parser.error("--library is required")
    models = zoo_models(args.library, [args.models] if args.models else None)
    rows = sweep(args.library, models, timeout=args.timeout)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(json.dumps(counts))
    if args.json:
        Path(args.json).write_text(json.dumps({"library": args.library, "counts": counts,
                                               "rows": rows}, indent=2, default=str) + "\n")
    return 0 if not counts.get("mismatch") and not counts.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
