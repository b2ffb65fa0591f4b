"""What a rank's simulated step owes to its FSDP2 degree, and a role at a third degree from two
others (:mod:`flopscope.plan.degrees`).

1. ``measure``: a Llama-style model of 4 layers (hidden 64, 4 heads of 16, 2 KV heads, MLP 128,
   vocabulary 1,024, 96 tokens), TP 2 x FSDP2 ``W`` for ``W`` = 2, 3, 4, 8, float32 parameters
   gathered as bfloat16 and gradients reduced in float32, simulated whole: which operator
   records, collectives and memory categories change with ``W``; FSDP2's closed forms checked
   (a layer's shard ``A(W) = sum ceil(d0 / W) x rest`` over its TP-local parameters, its
   all-gather ``W x A`` bfloat16 with bus bytes ``(W - 1) x A``, its reduce-scatter ``W x A``
   float32, the rank's parameter shards); the run at ``W = 8`` derived from ``W`` = 2 and 4 and
   compared with the simulated one, and at ``W = 3`` (padded) the same.
2. ``timed``: a 70B-shaped Llama's TP 8 role (micro-batch 1, checkpointing per block, 4096
   tokens): today's path (three small layer counts simulated) at FSDP 16 and 64, then at FSDP 32
   with its small runs derived from those two (the 3-layer one simulated as the check) and by
   today's path, one after the other in one process, wall and CPU seconds, the same role both
   ways.
3. ``sweeps``: the 70B plans' roles over sweeps of device counts (counted from the enumeration,
   nothing simulated): the layer passes of the roles put together from small runs (small layer
   counts, small pipelines), today and with the degrees' sharing (a role at a third degree or
   later, no padding: its first small run only); roles simulated whole are the same either
   way.

Run: ``python -m benchmarks.plan_degrees [--part measure|sweeps|timed ...] [--json FILE]`` (2
shared vCPUs here; the parts given are merged into ``FILE`` when it exists).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

from benchmarks.plan import LLAMA_70B

SMALL_LLAMA: dict[str, Any] = dict(vocab_size=1024, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2)
#: a layer's parameters on one TP 2 rank, (dim 0, elements per row): q (64 -> 32 rows), k and
#: v (32 -> 16), gate and up (128 -> 64) split on dim 0; o and down (64 rows, 64 -> 32 and
#: 128 -> 64 columns) on dim 1; two norms of 64, replicated
LAYER_TP2 = [(32, 64), (16, 64), (16, 64), (64, 32), (64, 64), (64, 64), (64, 64), (64, 1),
             (64, 1)]
#: the root's: the embedding and the head (1,024 x 64, FSDP2 only), the final norm
ROOT = [(1024, 64), (1024, 64), (64, 1)]


def _shard(params: list[tuple[int, int]], w: int) -> int:
    """FSDP2's shard in elements: dim 0 padded to a multiple of ``w``, split ``w`` ways."""
    return sum(math.ceil(d / w) * rest for d, rest in params)


def _simulate(w: int) -> Any:
    """The small Llama's TP 2 x FSDP2 ``w`` rank, as a plan's role is simulated: the memory
    tracker's call points and the roofline log watching."""
    import warnings

    from torch import nn

    from flopscope.distributed import Layout, simulate
    from flopscope.distributed.repeat import Frame
    from flopscope.estimate import CallLog, MemoryTracker, get_hardware
    from flopscope.plan.build import build_model
    from flopscope.plan.layers import Small
    from flopscope.plan.roles import local_tensor

    tracker, log, kept = MemoryTracker(), CallLog(), []
    build = build_model("hf:llama", 96, "float32", SMALL_LLAMA)

    def prepare(model: nn.Module, args: Any, kwargs: Any) -> None:
        kept.append(model)
        tracker.register((local_tensor(p) for p in model.parameters()), "parameters")
        tracker.register((local_tensor(b) for b in model.buffers()), "buffers")
        tracker.register([*args, *kwargs.values()], "inputs")

    layout = Layout(2 * w, tp=2, fsdp=w, mixed_precision=("bfloat16", "float32"),
                    sequence_parallel=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(lambda: build(1, "none"), layout, backward=True, shape_only=True,
                          logical=False, prepare=prepare, observers=[tracker, log], warn=False)
    params = list(kept[0].parameters())
    memory = tracker.profile(relabel={"gradients": [local_tensor(p.grad) for p in params
                                                    if p.grad is not None]})
    points = [(p.module, p.phase, p.op, p.live) for p in tracker.call_points()]
    return Small(Frame("model.layers", 0, 4), report, points, memory,
                 log.estimate(get_hardware("h100-sxm")),
                 sum(local_tensor(p).untyped_storage().nbytes() for p in params))


def measure() -> dict[str, Any]:
    """Part 1 (see the module docstring)."""
    from flopscope.plan.degrees import derive, same_run

    runs = {w: _simulate(w) for w in (2, 3, 4, 8)}
    base = runs[2]
    changed: dict[str, Any] = {}
    for w, run in runs.items():
        if w == 2:
            continue
        ops: dict[str, int] = {}
        for x, y in zip(base.report.records, run.report.records, strict=True):
            if x != y:
                ops[x.op] = ops.get(x.op, 0) + 1
        comm: dict[str, int] = {}
        for cx, cy in zip(base.report.communication, run.report.communication, strict=True):
            if cx != cy:
                comm[cx.kind] = comm.get(cx.kind, 0) + 1
        cats: dict[str, int] = {}
        for p, q in zip(base.points, run.points, strict=True):
            assert p[:3] == q[:3]
            for c in p[3]:
                if p[3][c] != q[3].get(c, 0):
                    cats[c] = cats.get(c, 0) + 1
        layer = _shard(LAYER_TP2, w)
        gather = next(c for c in run.report.communication
                      if c.module == "model.layers.1" and c.kind == "all_gather")
        scatter = next(c for c in run.report.communication
                       if c.module == "model.layers.1" and c.kind == "reduce_scatter")
        changed[f"W={w}"] = {
            "records": len(run.report.records), "records_changed_by_op": ops,
            "collectives": len(run.report.communication), "collectives_changed_by_kind": comm,
            "call_points": len(run.points), "call_points_changed_by_category": cats,
            "peak": [run.memory.peak_bytes, run.memory.peak_module, run.memory.peak_phase],
            "layer_shard_elements": layer,
            "closed_forms_hold": {
                "layer_all_gather_payload_bf16": gather.payload_bytes == w * layer * 2,
                "layer_all_gather_bus_bf16": gather.bus_bytes == (w - 1) * layer * 2,
                "layer_reduce_scatter_payload_fp32": scatter.payload_bytes == w * layer * 4,
                "layer_reduce_scatter_bus_fp32": scatter.bus_bytes == (w - 1) * layer * 4,
                "group_size": gather.group_size == scatter.group_size == w,
                "parameter_shards_fp32": run.parameter_bytes == 4 * (
                    4 * _shard(LAYER_TP2, w) + _shard(ROOT, w))}}
    derived = {}
    for w in (8, 3):
        try:
            got = derive([(2, runs[2]), (4, runs[4])], w, 2 * w, 0)
            derived[f"W={w}"] = same_run(got, runs[w])
        except ValueError as e:
            derived[f"W={w}"] = f"refused: {e}"
    return {"model": "Llama 4 layers, hidden 64, TP 2, float32 gathered as bfloat16",
            "against_W=2": changed, "derived_from_W=2_and_4_equals_simulated": derived}


def timed() -> dict[str, Any]:
    """Part 2 (see the module docstring)."""
    import torch

    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles, clear_cache

    torch.set_num_threads(1)
    build = build_model("hf:llama", 4096, "bfloat16", LLAMA_70B)
    clear_cache()
    fast = Roles(build, get_hardware("h100-sxm"), ("70b", "degrees"))
    slow = Roles(build, get_hardware("h100-sxm"), ("70b", "today"), repeat_degrees=False)
    out: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}

    def one(roles: Roles, dp: int) -> tuple[Any, dict[str, float]]:
        wall, cpu = time.perf_counter(), time.process_time()
        run = roles.get(RoleKey(8, 1, 0, dp, 1, 1, True))
        return run, {"wall_s": round(time.perf_counter() - wall, 1),
                     "cpu_s": round(time.process_time() - cpu, 1)}

    for dp in (16, 64):
        out[f"reference_fsdp{dp}"] = one(fast, dp)[1]
    derived, out["fsdp32_from_degrees"] = one(fast, 32)
    whole, out["fsdp32_today"] = one(slow, 32)
    m, n = derived.memory, whole.memory
    out["from_degrees"] = fast.from_degrees
    out["same_role"] = (derived.report == whole.report and derived.parameter_bytes ==
                        whole.parameter_bytes and (m.peak_bytes, m.peak_module, m.peak_phase,
                                                   m.peak_op, m.at_peak, m.end_bytes) ==
                        (n.peak_bytes, n.peak_module, n.peak_phase, n.peak_op, n.at_peak,
                         n.end_bytes))
    out["peak_gib"] = round(m.peak_bytes / 2**30, 2)
    out["peak_where"] = f"{m.peak_module or '(root)'} ({m.peak_phase})"
    out["cpu_ratio"] = round(out["fsdp32_today"]["cpu_s"] / out["fsdp32_from_degrees"]["cpu_s"],
                             2)
    out["load_1min_end"] = round(os.getloadavg()[0], 2)
    clear_cache()
    return out


def sweeps() -> list[dict[str, Any]]:
    """Part 3 (see the module docstring)."""
    import dataclasses

    from flopscope.distributed.pipeline import split_layers
    from flopscope.distributed.repeat import SMALL
    from flopscope.plan.layers import UNIT_SMALL
    from flopscope.plan.layout_roles import roles_of
    from flopscope.plan.roles import RoleKey
    from flopscope.plan.space import ModelShape, enumerate_layouts

    layers = LLAMA_70B["num_hidden_layers"]
    shape = ModelShape(layers, LLAMA_70B["num_attention_heads"],
                       LLAMA_70B["num_key_value_heads"], LLAMA_70B["intermediate_size"])

    def padded(k: RoleKey) -> bool:
        # the 70B's sharded dims 0: 8192, 1024 and 28672 split over TP x FSDP ranks (no
        # padding up to 1,024 of them), and the vocabulary (128,256 = 2^8 x 501) on the
        # stages that hold the embedding or the head, split over FSDP's ranks alone (the head
        # TP-split too where TP > 1: taken as padded whenever 128,256 / (TP x W) is not whole)
        ends = k.stage in (0, k.pp - 1)
        return (ends and 128256 % (k.tp * k.dp) != 0) or 1024 % (k.tp * k.dp) != 0

    out = []
    for counts in ((256, 1024), (64, 128, 256), (256, 512, 1024), (128, 256, 512, 1024)):
        seen: dict[Any, list[RoleKey]] = {}
        today = shared = 0
        derived = 0
        for gpus in counts:
            keys = {k for c in enumerate_layouts(gpus, shape, gpus) for k in roles_of(c, layers)}
            for k in sorted(keys, key=lambda k: dataclasses.astuple(k)):
                held = split_layers(layers, k.pp)[k.stage]
                n = len(held)
                if n > sum(SMALL):  # from small layer counts: 3, 4, 5 layers per stage
                    work, check = k.microbatches * sum(SMALL), k.microbatches * SMALL[0]
                elif k.pp > sum(UNIT_SMALL) and (k.stage == k.pp - 1 or (
                        k.stage <= 1 and held.start == k.stage * n)):
                    # from small pipelines of 5, 6, 7 stages (as many microbatches)
                    work, check = n * sum(UNIT_SMALL), n * UNIT_SMALL[0]
                else:
                    continue  # simulated whole: the same either way
                today += work
                block = dataclasses.replace(k, dp=0)
                refs = [r for r in seen.get(block, []) if r.dp not in (1, k.dp)
                        and not padded(r)]
                if len(refs) >= 2 and k.dp > 1 and not padded(k):
                    shared += check
                    derived += 1
                else:
                    shared += work
                    seen.setdefault(block, []).append(k)
        out.append({"gpus": list(counts), "layer_passes_from_small_runs_today": today,
                    "with_degrees": shared, "roles_derived": derived})
    return out


def main() -> None:
    """Run the parts asked for and print the JSON (merged into ``--json`` too)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--part", action="append", choices=("measure", "sweeps", "timed"))
    args = parser.parse_args()
    parts = {"measure": measure, "sweeps": sweeps, "timed": timed}
    result: dict[str, Any] = {}
    if args.json and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            result = json.load(f)
    for name in args.part or list(parts):
        result[name] = parts[name]()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
