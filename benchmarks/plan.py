"""How long ``flopscope.plan`` takes: a small Llama-style config (8 layers, hidden 1024) on 8 and
64 GPUs, each role simulated once. With ``--70b``, a 70B-shaped Llama on 256 GPUs: the roles a
whole plan has (counted from the enumeration, nothing simulated) and the time of two of them
(TP 8 x FSDP 32, micro-batch 1, with and without checkpointing), which gives the whole plan's
time here.

Run: ``python -m benchmarks.plan [--70b] [--seq-len S] [--json FILE]`` (2 shared vCPUs here; the
figures depend on the load).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

#: the small Llama-style config: 8 layers, hidden 1024, 16 heads of 64, 8 KV heads, MLP 2816,
#: vocab 32000 (a TinyLlama-like width at a quarter of its depth)
SMALL: dict[str, Any] = dict(hidden_size=1024, num_hidden_layers=8, intermediate_size=2816,
                             num_attention_heads=16, num_key_value_heads=8, vocab_size=32000)
#: the 70B shape of benchmarks/distributed_scale.py
LLAMA_70B: dict[str, Any] = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                 num_hidden_layers=80, num_attention_heads=64,
                                 num_key_value_heads=8)


def one(config: dict[str, Any], gpus: int, global_batch: int, seq_len: int,
        checkpointing: tuple[str, ...] = ("none", "block")) -> dict[str, Any]:
    """Plan once and time it.

    Args:
        config: the hf:llama config overrides.
        gpus: devices.
        global_batch: sequences per step.
        seq_len: tokens per sequence.
        checkpointing: checkpointing choices.

    Returns:
        The figures: layouts, fitting, roles, simulations, seconds, the best layout.
    """
    import flopscope
    from flopscope.plan.roles import clear_cache

    clear_cache()
    start = time.perf_counter()
    plan = flopscope.plan("hf:llama", gpus=gpus, hardware="h100-sxm", config=config,
                          seq_len=seq_len, global_batch=global_batch,
                          checkpointing=checkpointing)
    seconds = time.perf_counter() - start
    best = plan.best
    return {
        "gpus": gpus, "global_batch": global_batch, "seq_len": seq_len,
        "layouts": len(plan.ranked) + len(plan.dropped), "fit": len(plan.ranked),
        "ranks": sum(c.choice.gpus for c in (*plan.ranked, *plan.dropped)),
        "roles": plan.roles, "simulations": plan.simulations, "seconds": round(seconds, 1),
        "seconds_per_role": round(seconds / max(1, plan.simulations), 2),
        "best": best.choice.label if best else None,
        "best_mfu": round(best.mfu, 4) if best else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def big(gpus: int = 256, seq_len: int = 4096) -> dict[str, Any]:
    """The 70B-shaped plan's size and two of its roles' times (see the module docstring).

    Args:
        gpus: devices.
        seq_len: tokens per sequence.

    Returns:
        The figures.
    """
    from flopscope.estimate import get_hardware
    from flopscope.plan.planner import build_model
    from flopscope.plan.roles import RoleKey, Roles, roles_of
    from flopscope.plan.space import ModelShape, enumerate_layouts

    shape = ModelShape(LLAMA_70B["num_hidden_layers"], LLAMA_70B["num_attention_heads"],
                       LLAMA_70B["num_key_value_heads"], LLAMA_70B["intermediate_size"])
    choices = enumerate_layouts(gpus, shape, gpus)
    keys = {k for c in choices for k in roles_of(c, shape.layers)}
    roles = Roles(build_model("hf:llama", seq_len, "bfloat16", LLAMA_70B),
                  get_hardware("h100-sxm"), "70b")
    timed = {}
    for checkpoint in (False, True):
        start = time.perf_counter()
        run = roles.get(RoleKey(8, 1, 0, gpus // 8, 1, 1, checkpoint))
        timed[f"tp8_fsdp{gpus // 8}_mb1{'_ckpt' if checkpoint else ''}"] = {
            "seconds": round(time.perf_counter() - start, 1),
            "peak_gib": round(run.memory.peak_bytes / 2**30, 2)}
    per_role = sum(v["seconds"] for v in timed.values()) / len(timed)
    return {"model": "70B-shaped Llama", "gpus": gpus, "global_batch": gpus, "seq_len": seq_len,
            "layouts": len(choices), "roles": len(keys), "timed_roles": timed,
            "whole_plan_estimate_s": round(per_role * len(keys)),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def main() -> None:
    """Run the plans and print one line each (and the JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--70b", dest="big", action="store_true",
                        help="also size a 70B-shaped plan on 256 GPUs and time two of its roles")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = [one(SMALL, 8, 8, args.seq_len), one(SMALL, 64, 64, args.seq_len)]
    if args.big:
        rows.append(big())
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
