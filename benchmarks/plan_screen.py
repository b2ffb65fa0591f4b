"""Screened plans (``flopscope.plan(..., screen=True)``, ``flopscope plan --screen``): how far the
screen is from the simulations and how long a screened plan takes.

- ``--validate``: the small Llama-style config of :mod:`benchmarks.plan` (8 layers, hidden 1024)
  on 8 GPUs, global batch 32 of 2048 tokens (docs/plan.md's worked example): every layout
  screened and simulated, one after the other in one process; per layout the screened peak
  memory (the fullest stage, with AdamW's state) and step time over the simulated ones, and the
  seconds each way.
- ``--roles``: the 70B-shaped roles of docs/plan.md's "Speed" table (:data:`benchmarks.plan.
  TABLE_ROLES`, 256 GPUs) screened, against their simulated peaks recorded in
  ``benchmarks/results/plan_70b_peaks.json`` (held out: the screen was built on the small
  config only).
- ``--whole-check`` (after ``--time``): the reference pipelines at FSDP2 degree 1 the plans
  derived (:mod:`flopscope.plan.whole`), derived again and simulated; ``--no-derive``: ``--time``
  with them simulated.
- ``--time``: the 70B-shaped plans of docs/plan.md's worked example (4096 tokens, global batch
  one sequence per GPU, float32 parameters, sequence parallelism) on 256 and 1,024 GPUs with
  ``screen=True``: every layout, timed.

Run: ``python -m benchmarks.plan_screen [--validate] [--roles] [--time] [--json FILE]`` (one
thread; 2 shared vCPUs here: say the load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.plan import LLAMA_70B, SMALL, TABLE_ROLES, _key


def _spread(errors: list[float]) -> dict[str, float]:
    errs = sorted(abs(e) for e in errors)
    return {"n": len(errs), "median": round(statistics.median(errs), 4),
            "p90": round(errs[int(0.9 * (len(errs) - 1))], 4),
            "worst": round(max(errors, key=abs), 4)}


def validate() -> dict[str, Any]:
    """Every layout of the small config on 8 GPUs, screened and simulated."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model, model_identity
    from flopscope.plan.candidate import evaluate
    from flopscope.plan.layout_roles import roles_of
    from flopscope.plan.roles import Roles, clear_cache
    from flopscope.plan.screen import Screen
    from flopscope.plan.space import ModelShape, enumerate_layouts
    from flopscope.plan.timing import Links

    clear_cache()
    build = build_model("hf:llama", 2048, "bfloat16", SMALL)
    hw = get_hardware("h100-sxm")
    roles = Roles(build, hw, model_identity("hf:llama", 2048, "bfloat16", SMALL))
    shape = ModelShape.from_config(build(1, "none")[0].config)
    screen = Screen(roles, build, 8)
    links = Links.of(hw, 8, 8)
    common: dict[str, Any] = dict(budget=1 << 50, tokens=32 * 2048, flops=1, peak=1e15)
    rows, seconds = [], {"screened": 0.0, "simulated": 0.0}
    for choice in enumerate_layouts(8, shape, 32):
        keys = roles_of(choice, shape.layers, None, True)
        start = time.process_time()
        est = evaluate(choice, [screen.run(k) for k in keys], links, screened=True, **common)
        seconds["screened"] += time.process_time() - start
        start = time.process_time()
        sim = evaluate(choice, [roles.get(k) for k in keys], links, **common)
        seconds["simulated"] += time.process_time() - start
        rows.append({"layout": choice.label, "pp": choice.pp,
                     "memory": [est.memory_bytes, sim.memory_bytes],
                     "time_s": [est.time.total, sim.time.total],
                     "memory_error": est.memory_bytes / sim.memory_bytes - 1,
                     "time_error": est.time.total / sim.time.total - 1,
                     "time_source": est.time.compute})
        if est.bound_time is not None and sim.bound_time is not None:
            rows[-1]["bound_s"] = [est.bound_time.total, sim.bound_time.total]
            rows[-1]["bound_error"] = est.bound_time.total / sim.bound_time.total - 1
        print(rows[-1]["layout"], f"{rows[-1]['memory_error']:+.3f}",
              f"{rows[-1]['time_error']:+.3f}", f"{rows[-1].get('bound_error', 0.0):+.3f}",
              flush=True)
    out: dict[str, Any] = {"config": SMALL, "gpus": 8, "global_batch": 32, "seq_len": 2048,
                           "cpu_seconds": {k: round(v, 1) for k, v in seconds.items()},
                           "references": screen.references, "layouts": rows}
    for name, pick in (("all", lambda r: True), ("pipelines", lambda r: r["pp"] > 1)):
        chosen = [r for r in rows if pick(r)]
        out[name] = {"memory": _spread([r["memory_error"] for r in chosen]),
                     "time": _spread([r["time_error"] for r in chosen])}
        if all("bound_error" in r for r in chosen):
            out[name]["bound"] = _spread([r["bound_error"] for r in chosen])
    return out


def roles_70b() -> dict[str, Any]:
    """The 70B roles of docs/plan.md's table, screened, against their recorded simulations."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model, model_identity
    from flopscope.plan.roles import Roles, clear_cache
    from flopscope.plan.screen import Screen

    recorded = json.loads(Path("benchmarks/results/plan_70b_peaks.json").read_text())[-1]
    clear_cache()
    build = build_model("hf:llama", 4096, "bfloat16", LLAMA_70B)
    roles = Roles(build, get_hardware("h100-sxm"),
                  model_identity("hf:llama", 4096, "bfloat16", LLAMA_70B))
    screen = Screen(roles, build, 256)
    out: dict[str, Any] = {"recorded": "benchmarks/results/plan_70b_peaks.json", "roles": {}}
    for name, args in TABLE_ROLES.items():
        start = time.process_time()
        run = screen.run(_key(*args))
        gib = run.memory.peak_bytes / 2**30
        want = recorded["roles"][name]["peak_gib"]
        out["roles"][name] = {"screened_gib": round(gib, 2), "simulated_gib": want,
                              "error": round(gib / want - 1, 4),
                              "cpu_seconds": round(time.process_time() - start, 1)}
        print(name, json.dumps(out["roles"][name]), flush=True)
    out["references"] = screen.references
    return out


def timed(gpus: int, carry: bool = True, derive: bool = True) -> dict[str, Any]:
    """The 70B plan on ``gpus`` with the screen (``carry``: references above micro-batch 4
    carried from 2 and 4, :mod:`flopscope.plan.micro_batch`; else simulated; ``derive``:
    reference pipelines at FSDP2 degree 1 derived from the sharded ones,
    :mod:`flopscope.plan.whole`; else simulated)."""
    import flopscope
    from flopscope.plan import planner
    from flopscope.plan.roles import clear_cache
    from flopscope.plan.screen import Screen

    clear_cache()
    made: list[Screen] = []

    class Kept(Screen):  # the plan's screen, kept to list what it carried
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.carry_micro_batch = carry
            self.derive_whole = derive
            made.append(self)

    planner.Screen = Kept  # type: ignore[attr-defined,assignment]
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    plan: Any = flopscope.plan("hf:llama", gpus=gpus, hardware="h100-sxm", config=LLAMA_70B,
                               seq_len=4096, global_batch=gpus, param_dtype="float32",
                               sequence_parallel=True, screen=True)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    planner.Screen = Screen  # type: ignore[attr-defined]
    best = plan.best
    return {"gpus": gpus, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
            "layouts": len(plan.ranked) + len(plan.dropped), "fit": len(plan.ranked),
            "screening": plan.screening.to_dict() if plan.screening else None,
            "carried": [[*dataclasses.astuple(rk), dp] for rk, dp in made[0].carried],
            "derived": [list(dataclasses.astuple(rk)) for rk in getattr(made[0], "derived", [])],
            "references": made[0].references,
            "rows": {c.choice.label: [c.memory_bytes, round(c.time.total, 9)]
                     for c in [*plan.ranked, *plan.dropped]},
            "best": None if best is None else {
                "layout": best.choice.label, "step_s": round(best.time.total, 4),
                "mfu": round(best.mfu, 4), "memory_gib": round(best.memory_bytes / 2**30, 2),
                "time_kind": best.time.compute, "step_bound_s": round(best.bound_step.total, 4),
                "mfu_bound": round(best.mfu_bound, 4)}}


def _two_screens(gpus: int) -> tuple[Any, Any]:
    """Two screens of the ``--time`` plan's 70B model on ``gpus`` (mixed precision, float32
    parameters, as timed()'s plan) over one fresh role cache: the caller turns the mechanism
    under check off in the second."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model, model_identity
    from flopscope.plan.precision import mixed_precision
    from flopscope.plan.roles import Roles, clear_cache
    from flopscope.plan.screen import Screen

    clear_cache()
    stored, _ = mixed_precision("bfloat16", "float32", None)
    build = build_model("hf:llama", 4096, stored, LLAMA_70B)
    roles = Roles(build, get_hardware("h100-sxm"),
                  model_identity("hf:llama", 4096, stored, LLAMA_70B))
    return Screen(roles, build, gpus), Screen(roles, build, gpus)


def carry_check(carried: list[list[Any]], gpus: int) -> dict[str, Any]:
    """The references a ``--time`` plan on ``gpus`` carried to a larger micro-batch
    (:mod:`flopscope.plan.micro_batch`), carried again and simulated: whether every figure the
    screen reads is the same (held out: the mechanism was tested on the test model only)."""
    from flopscope.plan.roles import RoleKey

    screens = _two_screens(gpus)
    screens[1].carry_micro_batch = False
    out: dict[str, Any] = {"gpus": gpus, "references": []}
    for row in carried:
        *fields, dp = row
        rk = RoleKey(*[tuple(f) if isinstance(f, list) else f for f in fields])
        start = time.process_time()
        got, want = (s.reference(rk) if dp == 0 else s.pipeline(rk, dp) for s in screens)
        same = all(a.points == b.points and a.memory.peak_bytes == b.memory.peak_bytes
                   and a.report.communication == b.report.communication
                   and (dp or all(
                       x.flops == y.flops and abs(x.time_s - y.time_s) <= 1e-9 * y.time_s
                       for p, y in b.estimate.by_phase.items()
                       for x in [a.estimate.by_phase[p]]))
                   for a, b in zip(got, want, strict=True))
        out["references"].append({"key": row, "same": same,
                                   "cpu_seconds": round(time.process_time() - start, 1)})
        print(json.dumps(out["references"][-1]), flush=True)
    out["all_same"] = all(r["same"] for r in out["references"])
    return out


def whole_check(derived: list[list[Any]], gpus: int) -> dict[str, Any]:
    """The reference pipelines at FSDP2 degree 1 a ``--time`` plan on ``gpus`` derived
    (:mod:`flopscope.plan.whole`), derived again (from the same base micro-batch, the
    smallest of the family) and simulated: whether every call point, the peak, the
    collectives and every phase's FLOPs (exactly) and seconds (to 1e-9) are the same (held
    out: the mechanism was written on the test model)."""
    from flopscope.plan.roles import RoleKey

    screens = _two_screens(gpus)
    screens[1].derive_whole = False
    rows: list[list[Any]] = [[tuple(f) if isinstance(f, list) else f for f in row]
                             for row in derived]
    keys = [RoleKey(*row) for row in rows]
    for rk in keys:  # each family's base as in the plans: micro-batch 1, asked for first
        screens[0].pipeline(dataclasses.replace(rk, micro_batch=1), 1)
    out: dict[str, Any] = {"gpus": gpus, "references": []}
    for rk in keys:
        start = time.process_time()
        got, want = (s.pipeline(rk, 1) for s in screens)
        same = all(a.points == b.points and a.memory.peak_bytes == b.memory.peak_bytes
                   and a.report.communication == b.report.communication
                   and a.parameter_bytes == b.parameter_bytes
                   and all(x.flops == y.flops and abs(x.time_s - y.time_s) <= 1e-9 * y.time_s
                           for p, y in b.estimate.by_phase.items()
                           for x in [a.estimate.by_phase[p]])
                   for a, b in zip(got, want, strict=True))
        out["references"].append({"key": list(dataclasses.astuple(rk)), "same": same,
                                   "derived": rk in screens[0].derived,
                                   "cpu_seconds": round(time.process_time() - start, 1)})
        print(json.dumps(out["references"][-1]), flush=True)
    out["all_same"] = all(r["same"] and r["derived"] for r in out["references"])
    return out


def main() -> None:
    """Run the parts asked for and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--roles", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--no-carry", action="store_true",
                        help="--time without carrying references to micro-batch 8 (written as "
                             "time_no_carry: every row should be the same)")
    parser.add_argument("--carry-check", action="store_true",
                        help="the references the --time plans carried, simulated (after --time "
                             "or from the JSON's)")
    parser.add_argument("--no-derive", action="store_true",
                        help="--time with the reference pipelines at FSDP2 degree 1 simulated, "
                             "not derived (written as time_no_derive)")
    parser.add_argument("--whole-check", action="store_true",
                        help="the degree-1 pipelines the --time plans derived, simulated")
    parser.add_argument("--gpus", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--json", default="benchmarks/results/plan_screen.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    path = Path(args.json)
    out: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.validate:
        out["validate"] = validate()
        print(json.dumps({k: out["validate"][k] for k in ("all", "pipelines", "cpu_seconds")}))
    if args.roles:
        out["roles_70b"] = roles_70b()
    if args.time and args.no_carry:
        out["time_no_carry"] = [timed(g, carry=False) for g in args.gpus]
        for t in out["time_no_carry"]:
            print(t["gpus"], t["seconds"], t["cpu_seconds"], t["best"])
    elif args.time and args.no_derive:
        out["time_no_derive"] = [timed(g, derive=False) for g in args.gpus]
        for t in out["time_no_derive"]:
            print(t["gpus"], t["seconds"], t["cpu_seconds"], t["best"])
    elif args.time:
        out["time"] = [timed(g) for g in args.gpus]
        for t in out["time"]:
            print(t["gpus"], t["seconds"], t["cpu_seconds"], t["best"])
    if args.carry_check:
        out["carry_check"] = [carry_check(t["carried"], t["gpus"]) for t in out["time"]
                              if t.get("carried")]
    if args.whole_check:
        out["whole_check"] = [whole_check(t["derived"], t["gpus"]) for t in out["time"]
                              if t.get("derived")]
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
