"""How long ``flopscope.plan`` takes: a small Llama-style config (8 layers, hidden 1024) on 8 and
64 GPUs, each role simulated once. With ``--70b``, a 70B-shaped Llama on 256 and 1,024 GPUs:
the roles a whole plan has (counted from the enumeration, nothing simulated); two of them (TP 8 x
FSDP 32, micro-batch 1, with and without checkpointing) and a pipeline stage (TP 8 x PP 2 x FSDP
16, stage 0: 40 layers, 2 microbatches) timed with their repeated layers put together from three
small layer counts and counted whole, one after the other in one process (and checked equal);
one pipeline role of 10 layers (TP 8 x PP 8 x FSDP 4, stage 0, 8 microbatches), simulated whole
either way; two stages of deep pipelines (TP 8 x PP 32, stage 1; TP 4 x PP 64, stage 0) put
together from small pipelines and simulated over every microbatch; and from these the whole
plans' time, estimated (it takes hours).

The roles are asked for as a plan asks for them: the causal LM's cross-entropy as the loss, loss
parallelism on the tensor-parallel roles without stages. ``--peaks``: only the peak memory of
those roles (put together from small runs where they can be).

Run: ``python -m benchmarks.plan [--70b | --peaks] [--seq-len S] [--json FILE]`` (2 shared vCPUs here; the
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


def _key(tp: int, pp: int, stage: int, dp: int, micro_batch: int, microbatches: int,
         checkpoint: bool) -> Any:
    """A role as a plan with the default options asks for it: the causal LM's cross-entropy as
    the loss, loss parallelism on tensor-parallel layouts without stages (bfloat16 throughout,
    no sequence parallelism)."""
    from flopscope.plan.roles import RoleKey

    return RoleKey(tp, pp, stage, dp, micro_batch, microbatches, checkpoint,
                   loss_parallel=tp > 1 and pp == 1, loss="cross_entropy")


#: the roles of the 70B table in docs/plan.md's "Speed": name -> (tp, pp, stage, dp,
#: micro-batch, microbatches simulated, checkpointing)
TABLE_ROLES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "tp8_fsdp32_mb1": (8, 1, 0, 32, 1, 1, False),
    "tp8_fsdp32_mb1_ckpt": (8, 1, 0, 32, 1, 1, True),
    "tp8_pp2_fsdp16_stage0_mb1": (8, 2, 0, 16, 1, 2, False),
    "tp8_pp32_dp1_stage1_mb1": (8, 32, 1, 1, 1, 32, False),
    "tp4_pp64_dp1_stage0_mb1": (4, 64, 0, 1, 1, 64, False),
    "tp8_pp8_fsdp4_stage0_mb1": (8, 8, 0, 4, 1, 8, False),
}


def peaks() -> dict[str, Any]:
    """The peak memory of each role of the 70B table (:data:`TABLE_ROLES`), as a plan asks for
    it today (:func:`_key`), each put together from small runs where it can be (the fast path;
    the timed comparison of :func:`big` checks both ways agree).

    Returns:
        The figures: per role its peak (GiB), where, the seconds it took, and the load.
    """
    import os

    import torch

    from flopscope.plan.build import build_model

    torch.set_num_threads(1)
    build = build_model("hf:llama", 4096, "bfloat16", LLAMA_70B)
    out: dict[str, Any] = {"model": "70B-shaped Llama", "seq_len": 4096, "dtype": "bfloat16",
                           "loss": "cross_entropy", "load_1min": round(os.getloadavg()[0], 2),
                           "roles": {}}
    for name, args in TABLE_ROLES.items():
        seconds, run = _role_time(build, _key(*args), True)
        out["roles"][name] = {
            "seconds": round(seconds, 1), "loss_parallel": args[0] > 1 and args[1] == 1,
            "peak_gib": round(run.memory.peak_bytes / 2**30, 2),
            "peak_where": f"{run.memory.peak_module or '(root)'} ({run.memory.peak_phase})"}
        print(name, json.dumps(out["roles"][name]), flush=True)
    out["load_1min_end"] = round(os.getloadavg()[0], 2)
    return out


def _role_time(build: Any, key: Any, repeat: bool) -> tuple[float, Any]:
    """One role simulated in a fresh cache: seconds and its run (``repeat``: layers and
    microbatches put together from small counts where they can be; else every one simulated)."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.roles import Roles, clear_cache

    clear_cache()
    roles = Roles(build, get_hardware("h100-sxm"), ("70b", repeat), repeat_layers=repeat,
                  repeat_microbatches=repeat)
    start = time.perf_counter()
    run = roles.get(key)
    return time.perf_counter() - start, run


def big(seq_len: int = 4096) -> dict[str, Any]:
    """The 70B-shaped plans on 256 and 1,024 GPUs: their roles (counted from the enumeration),
    three roles timed with and without repeated layers in one process, interleaved, and the
    whole plans' time estimated from them (see the module docstring).

    Args:
        seq_len: tokens per sequence.

    Returns:
        The figures.
    """
    import os

    import torch

    from flopscope.distributed.pipeline import split_layers
    from flopscope.distributed.repeat import SMALL
    from flopscope.plan.build import build_model
    from flopscope.plan.layers import UNIT_SMALL
    from flopscope.plan.layout_roles import roles_of
    from flopscope.plan.space import ModelShape, enumerate_layouts

    torch.set_num_threads(1)
    layers = LLAMA_70B["num_hidden_layers"]
    shape = ModelShape(layers, LLAMA_70B["num_attention_heads"],
                       LLAMA_70B["num_key_value_heads"], LLAMA_70B["intermediate_size"])
    build = build_model("hf:llama", seq_len, "bfloat16", LLAMA_70B)
    load = os.getloadavg()[0]
    timed: dict[str, Any] = {}
    per_pass: dict[bool, float] = {}
    fast_role: dict[bool, float] = {}
    for checkpoint in (False, True):
        key = _key(8, 1, 0, 32, 1, 1, checkpoint)
        fast_s, fast = _role_time(build, key, True)
        slow_s, slow = _role_time(build, key, False)
        same = (fast.report == slow.report and fast.memory.peak_bytes == slow.memory.peak_bytes
                and fast.memory.peak_module == slow.memory.peak_module
                and fast.memory.at_peak == slow.memory.at_peak)
        timed[f"tp8_fsdp32_mb1{'_ckpt' if checkpoint else ''}"] = {
            "repeated_layers_s": round(fast_s, 1), "every_layer_s": round(slow_s, 1),
            "speedup": round(slow_s / fast_s, 1), "same_report_and_peak": same,
            "peak_gib": round(fast.memory.peak_bytes / 2**30, 2),
            "peak_where": f"{fast.memory.peak_module or '(root)'} ({fast.memory.peak_phase})"}
        per_pass[checkpoint] = slow_s / layers
        fast_role[checkpoint] = fast_s
    # a pipeline stage of 40 layers (TP 8 x PP 2 x FSDP 16, stage 0, 2 microbatches) both
    # ways, and one of 10 layers (TP 8 x PP 8 x FSDP 4, stage 0, 8 microbatches: 80 layer
    # passes), simulated whole either way (too few layers to gain)
    key = _key(8, 2, 0, 16, 1, 2, False)
    fast_s, fast = _role_time(build, key, True)
    slow_s, slow = _role_time(build, key, False)
    timed["tp8_pp2_fsdp16_stage0_mb1"] = {
        "repeated_layers_s": round(fast_s, 1), "every_layer_s": round(slow_s, 1),
        "speedup": round(slow_s / fast_s, 1),
        "same_report_and_peak": fast.report == slow.report
        and fast.memory.peak_bytes == slow.memory.peak_bytes
        and fast.memory.peak_module == slow.memory.peak_module,
        "peak_gib": round(fast.memory.peak_bytes / 2**30, 2),
        "peak_where": f"{fast.memory.peak_module or '(root)'} ({fast.memory.peak_phase})",
        "estimate_repeated_s": round(2 * fast_role[False], 1),
        "estimate_every_layer_s": round(80 * per_pass[False], 1)}
    pipe_s, _ = _role_time(build, _key(8, 8, 0, 4, 1, 8, False), True)
    timed["tp8_pp8_fsdp4_stage0_mb1"] = {
        "seconds": round(pipe_s, 1), "layer_passes": 80,
        "estimate_from_layer_passes_s": round(80 * per_pass[False], 1)}

    # pipelines of more than 18 stages: the first, second and last stage put together from
    # the stage in pipelines of 5, 6 and 7 stages (as many microbatches), side by side with
    # the stage simulated over all its microbatches
    for name, key in (("tp8_pp32_dp1_stage1_mb1", _key(8, 32, 1, 1, 1, 32, False)),
                      ("tp4_pp64_dp1_stage0_mb1", _key(4, 64, 0, 1, 1, 64, False))):
        fast_s, fast = _role_time(build, key, True)
        slow_s, slow = _role_time(build, key, False)
        n = len(split_layers(layers, key.pp)[key.stage])
        timed[name] = {
            "small_pipelines_s": round(fast_s, 1), "every_microbatch_s": round(slow_s, 1),
            "speedup": round(slow_s / fast_s, 1),
            "layer_passes": {"small_pipelines": n * sum(UNIT_SMALL),
                             "every_microbatch": n * key.microbatches},
            "same_report_and_peak": fast.report == slow.report
            and fast.memory.peak_bytes == slow.memory.peak_bytes
            and fast.memory.peak_module == slow.memory.peak_module
            and fast.memory.at_peak == slow.memory.at_peak,
            "peak_gib": round(fast.memory.peak_bytes / 2**30, 2),
            "peak_where": f"{fast.memory.peak_module or '(root)'} ({fast.memory.peak_phase})"}

    plans = []
    for gpus in (256, 1024):
        choices = enumerate_layouts(gpus, shape, gpus)
        keys = {k for c in choices for k in roles_of(c, layers)}
        before = after = now = 0.0
        repeated = from_microbatches = 0
        for k in keys:
            held = split_layers(layers, k.pp)[k.stage]
            n = len(held)
            whole = n * k.microbatches * per_pass[k.checkpoint]
            before += whole
            if n > sum(SMALL):
                repeated += 1
                after += k.microbatches * fast_role[k.checkpoint]
                now += k.microbatches * fast_role[k.checkpoint]
            elif k.pp > sum(UNIT_SMALL) and (k.stage == k.pp - 1 or (
                    k.stage <= 1 and held.start == k.stage * n)):
                from_microbatches += 1
                after += whole
                now += n * sum(UNIT_SMALL) * per_pass[k.checkpoint]
            else:
                after += whole
                now += whole
        passes: dict[str, int] = {}  # layer passes left per role class, after both
        for k in keys:
            held = split_layers(layers, k.pp)[k.stage]
            n = len(held)
            if n > sum(SMALL):
                kind, work = "from small layer counts", k.microbatches * sum(SMALL)
            elif k.pp > sum(UNIT_SMALL) and (k.stage == k.pp - 1 or (
                    k.stage <= 1 and held.start == k.stage * n)):
                kind, work = "from small pipelines", n * sum(UNIT_SMALL)
            else:
                kind, work = f"whole, pp {k.pp}", n * k.microbatches
            passes[kind] = passes.get(kind, 0) + work
        plans.append({"gpus": gpus, "layouts": len(choices), "roles": len(keys),
                      "layer_passes_now": dict(sorted(passes.items())),
                      # a layer block shared across roles, keyed with the FSDP2 degree (fixed
                      # by tp and pp within one plan) or without it
                      "distinct_blocks_tp_dp_mb_ckpt": len({(k.tp, k.dp, k.micro_batch,
                                                             k.checkpoint) for k in keys}),
                      "distinct_blocks_tp_mb_ckpt": len({(k.tp, k.micro_batch, k.checkpoint)
                                                         for k in keys}),
                      "roles_from_small_layer_counts": repeated,
                      "roles_from_small_pipelines": from_microbatches,
                      "estimate_every_layer_s": round(before),
                      "estimate_repeated_layers_s": round(after),
                      "estimate_repeated_layers_and_microbatches_s": round(now)})
    return {"model": "70B-shaped Llama", "seq_len": seq_len, "dtype": "bfloat16",
            "load_1min": round(load, 2), "timed_roles": timed, "plans": plans,
            "estimate": "each role's time: a role put together from small layer counts (more "
                        "than 12 layers in its stage) takes its microbatches simulated x the "
                        "timed TP8 x FSDP32 role's time from small counts; a stage put together "
                        "from small pipelines (the first, second or last of more than 18 "
                        "stages) takes (layers in its stage x 18 microbatches) x that role's "
                        "time per layer counted whole; any other takes (layers in its stage x "
                        "microbatches simulated) x that time per layer (same checkpointing)",
            "load_1min_end": round(os.getloadavg()[0], 2),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def main() -> None:
    """Run the plans and print one line each (and the JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--70b", dest="big", action="store_true",
                        help="only the 70B-shaped plans on 256 and 1,024 GPUs: their roles, "
                             "three roles timed, the whole plans' time estimated")
    parser.add_argument("--peaks", action="store_true",
                        help="only the peak memory of the 70B table's roles (put together "
                             "from small runs), as a plan asks for them today")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = [peaks()] if args.peaks else [big()] if args.big else [one(SMALL, 8, 8, args.seq_len),
                                      one(SMALL, 64, 64, args.seq_len)]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
