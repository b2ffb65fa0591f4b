"""--validate's pipeline layouts (8-GPU worked example), per stage role and per layout: the
screened peak before this branch (main's stage_memory on the same references) and after,
against the simulated one."""
import dataclasses, importlib.util, json, os, sys, time
from typing import Any
import torch
torch.set_num_threads(1)
from benchmarks.plan import SMALL
from benchmarks.plan_screen import _spread
from flopscope.distributed.pipeline import split_layers
from flopscope.estimate import get_hardware
from flopscope.plan.candidate import evaluate
from flopscope.plan.planner import build_model, model_identity
from flopscope.plan.reference import Reference
from flopscope.plan.roles import Roles, clear_cache, roles_of
from flopscope.plan.screen import Screen, reference_key
from flopscope.plan.space import ModelShape, enumerate_layouts
from flopscope.plan.timing import Links

spec = importlib.util.spec_from_file_location("old_stage_memory", "/work/main/src/flopscope/plan/stage_memory.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
load0 = os.getloadavg()[0]; cpu0 = time.process_time()
clear_cache()
build = build_model("hf:llama", 2048, "bfloat16", SMALL)
hw = get_hardware("h100-sxm")
roles = Roles(build, hw, model_identity("hf:llama", 2048, "bfloat16", SMALL))
shape = ModelShape.from_config(build(1, "none")[0].config)
screen = Screen(roles, build, 8)
links = Links.of(hw, 8, 8)
common: dict[str, Any] = dict(budget=1 << 50, tokens=32 * 2048, flops=1, peak=1e15)
prefix = roles.decoder_layers()[0]
per_role, layouts = {}, []
for choice in enumerate_layouts(8, shape, 32):
    if choice.pp == 1:
        continue
    keys = roles_of(choice, shape.layers, None, False, True)
    new, was, sim = [], [], []
    for key in keys:
        run = screen.run(key)
        rk = reference_key(key, 8)
        dp = 1 if key.dp == 1 else 8 // (2 * key.tp)
        f, l, lm, f2, mid = screen.pipeline(rk, dp)
        ref = Reference(prefix, 0.0, dp, first=f, last=l, last_more=lm, first_two=f2, middle=mid)
        k = len(split_layers(shape.layers, key.pp)[key.stage])
        m = key.peak_microbatches or key.microbatches
        mem_old, _ = old.stage_memory(key, ref, k, key.stage == 0, key.stage == key.pp - 1, m)
        s = roles.get(key)
        new.append(run); was.append(dataclasses.replace(run, memory=mem_old)); sim.append(s)
        role = "first" if key.stage == 0 else "last" if key.stage == key.pp - 1 else "middle"
        name = f"{choice.label} stage {key.stage} ({role})"
        if name not in per_role and key.stage == keys.index(key):
            per_role[name] = {"role": role, "screened_before": mem_old.peak_bytes,
                              "screened_after": run.memory.peak_bytes, "simulated": s.memory.peak_bytes,
                              "before": mem_old.peak_bytes / s.memory.peak_bytes - 1,
                              "after": run.memory.peak_bytes / s.memory.peak_bytes - 1}
            print(name, f"{per_role[name]['before']:+.4f} -> {per_role[name]['after']:+.4f}", flush=True)
    e_new = evaluate(choice, new, links, screened=True, **common)
    e_old = evaluate(choice, was, links, screened=True, **common)
    e_sim = evaluate(choice, sim, links, **common)
    layouts.append({"layout": choice.label, "before": e_old.memory_bytes / e_sim.memory_bytes - 1,
                    "after": e_new.memory_bytes / e_sim.memory_bytes - 1,
                    "time_after": e_new.time.total / e_sim.time.total - 1})
    print(choice.label, f"layout {layouts[-1]['before']:+.4f} -> {layouts[-1]['after']:+.4f}", flush=True)
out = {"what": "validate_roles: benchmarks.plan_screen --validate's 44 pipeline layouts, per stage role and layout, screened before (main's stage_memory, same references) and after vs simulated",
       "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)], "cpu_seconds": round(time.process_time() - cpu0, 1),
       "references": screen.references, "roles": per_role, "layouts": layouts}
for role in ("first", "middle", "last"):
    rs = [r for r in per_role.values() if r["role"] == role]
    out[role] = {"before": _spread([r["before"] for r in rs]), "after": _spread([r["after"] for r in rs])}
out["layouts_memory"] = {"before": _spread([r["before"] for r in layouts]), "after": _spread([r["after"] for r in layouts])}
out["layouts_time_after"] = _spread([r["time_after"] for r in layouts])
print(json.dumps({k: out[k] for k in ("first", "middle", "last", "layouts_memory", "layouts_time_after", "cpu_seconds", "load_1min")}))
json.dump(out, open(sys.argv[1], "w"), indent=1)
