"""The planner against published training runs on H100s (issue 31, "How we will know").

For each published run flopscope can express (a Llama-shaped decoder as an ``hf:llama`` config;
the layout fixed with ``tp``/``pp`` and the FSDP size; the global batch and sequence length as
published; activation checkpointing as close as the planner has it; mixed precision as
published), ``flopscope.plan`` plans that layout on the published device count with the shipped
``h100-sxm`` profile as it is (its reference calibration's prediction; nothing calibrated on
these numbers) and the row puts side by side: the planned peak memory per GPU against the
device's capacity and the published memory; the predicted tokens/s per GPU and MFU, and the
roofline bound's (``*_bound``), against the published ones; and the gap, explained (what the
run does that flopscope does not model).

Each published figure is cited (repository, file, commit; or the page). Where a run publishes
tokens/s and no MFU, its MFU is derived with flopscope's own FLOPs per token (the plan's
``model_flops``, the unsharded model's counted forward + backward, over its tokens), so the two
MFUs share one numerator; where it publishes MFU and TFLOP/s per GPU (Megatron-LM), those are
compared with the plan's MFU and ``model_flops / step time / GPUs``.

Run: ``python -m benchmarks.published_runs [--only ID,...] [--json FILE]``; ``--dry`` plans each
run's layout on a tiny model (what the tests run). Results in
``benchmarks/results/published_runs.json`` and in docs/plan.md ("Published runs").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

#: Llama 3.1 8B and 70B (Meta's configs on the Hugging Face hub; torchtitan's ``8B``/``70B``
#: flavours have the same shapes): hidden, layers, heads, KV heads, MLP, vocabulary
LLAMA31_8B: dict[str, Any] = dict(hidden_size=4096, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=14336, vocab_size=128256)
LLAMA31_70B: dict[str, Any] = dict(hidden_size=8192, num_hidden_layers=80,
                                   num_attention_heads=64, num_key_value_heads=8,
                                   intermediate_size=28672, vocab_size=128256)


def _gpt(hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """Megatron-LM's GPT benchmark models as a Llama-shaped config: multi-head attention (as
    many KV heads as heads), vocabulary 131,072, and a SwiGLU MLP of 8h/3 (rounded down to a
    multiple of 8) whose three h x 8h/3 matrices hold the FLOPs and parameters of GPT's two
    h x 4h ones (8h^2); rotary positions and RMSNorm instead of learned positions and
    LayerNorm (a few parameters, no matrix products)."""
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=heads, intermediate_size=8 * hidden // 3 // 8 * 8,
                vocab_size=131072)


_TORCHTITAN_2412 = {
    "repo": "pytorch/torchtitan", "file": "benchmarks/llama3_h100_202412_torchtitan.md",
    "commit": "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a",
    "config": "train_configs/llama3_8b.toml at 6b03ffa (2024-12-26): seq_len 8192, "
              "activation_checkpoint mode 'selective', selective_ac_option 'op'; "
              "torchtitan/config_manager.py: mixed_precision_param bfloat16, "
              "mixed_precision_reduce float32"}
_TORCHTITAN_2506 = {
    "repo": "pytorch/torchtitan", "file": "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
    "commit": "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a",
    "config": "train_configs/llama3_70b.toml: seq_len 8192; bfloat16 row, vanilla TP"}
_MEGATRON = {
    "repo": "NVIDIA/Megatron-LM", "file": "README.md (Performance Benchmarking) and "
    "images/model_table.png", "commit": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    "config": "vocabulary 131,072, sequence length 4,096; DP, TP and PP communication "
              "overlapped (--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap)"}
#: torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s, 500 W (the benchmark's "Hardware")
_GRAND_TETON = "H100 96 GB HBM2e, 2.4 TB/s, 500 W power limit (the h100-sxm profile: 80 GB, " \
               "3.35 TB/s, 700 W)"
_TORCHTITAN_GAP = [
    "selective per-op activation checkpointing (torchtitan's 'op' policy keeps some "
    "operators' outputs, attention and every other matrix product, and recomputes the rest): "
    "planned with none and every block in the main table; with torchtitan's "
    "rule (selective-half) in published_runs_selective.json",
    "the devices ran at 500 W with HBM2e (the benchmark's footnote: their peak is between SXM "
    "and NVL); the profile is the 700 W SXM5 at 3.35 TB/s",
    "kernel efficiency: times are roofline lower bounds (every call at the bf16 dense peak or "
    "HBM bandwidth, no calibration on these runs), so predicted throughput is an upper bound",
]

#: the published runs: what each ran and reported, with its source
RUNS: list[dict[str, Any]] = [
    {
        "id": "torchtitan-8b-fsdp8",
        "what": "Llama 3.1 8B, FSDP 8 on 8 H100, local batch 2, selective (op) AC, no compile, "
                "no Float8 (Table 1, row 'FSDP')",
        "source": {**_TORCHTITAN_2412, "table": "Table 1"},
        "config": LLAMA31_8B, "gpus": 8, "tp": 1, "pp": 1, "global_batch": 16,
        "micro_batch": 2, "seq_len": 8192, "checkpointing": ("none", "block"),
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": 96,
        "device": _GRAND_TETON,
        "published": {"tokens_per_s_per_gpu": 5762, "memory_gib": 82.4,
                      "mfu_note": "33% to 39% for the 8B on 8 or 128 GPUs without Float8 "
                                  "(footnote 2, against the SXM peak)"},
        "gap": _TORCHTITAN_GAP,
    },
    {
        "id": "torchtitan-8b-fsdp128",
        "what": "Llama 3.1 8B, FSDP 128 on 128 H100, local batch 2, selective (op) AC, no "
                "compile, no Float8 (Table 3, row 'FSDP')",
        "source": {**_TORCHTITAN_2412, "table": "Table 3"},
        "config": LLAMA31_8B, "gpus": 128, "tp": 1, "pp": 1, "global_batch": 256,
        "micro_batch": 2, "seq_len": 8192, "checkpointing": ("none", "block"),
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": 96,
        "device": _GRAND_TETON,
        "published": {"tokens_per_s_per_gpu": 5605, "memory_gib": 67.0},
        "gap": [*_TORCHTITAN_GAP,
                "FSDP over 16 nodes: NCCL's all-gathers and reduce-scatters over InfiniBand "
                "at the profile's 50 GB/s per GPU, overlapped as FSDP2 prefetches"],
    },
    {
        "id": "torchtitan-70b-fsdp32-tp8",
        "what": "Llama 3 70B, FSDP 32 x TP 8 on 256 H100, local batch 16, full AC, "
                "torch.compile, bfloat16, vanilla TP (async TP table, 'None (bfloat16)' row)",
        "source": {**_TORCHTITAN_2506, "table": "Llama3 70b on 256 H100s"},
        "config": LLAMA31_70B, "gpus": 256, "tp": 8, "pp": 1, "global_batch": 512,
        "micro_batch": 16, "seq_len": 8192, "checkpointing": ("block",),
        "sequence_parallel": True, "compiled": True,
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": 96,
        "device": _GRAND_TETON,
        "published": {"tokens_per_s_per_gpu": 597.3},
        "gap": [*_TORCHTITAN_GAP[1:],
                "torch.compile (fused elementwise kernels: fewer bytes than the eager calls "
                "the roofline charges)",
                "full AC in torchtitan recomputes each block, as the planner's 'block'",
                "the loss: loss parallelism as torchtitan runs it (the head column-wise over "
                "the vocabulary, each TP rank 1/8 of the logits: 16 x 8192 x 16,032), but the "
                "cross-entropy counted eagerly as transformers computes it (float32 copies of "
                "the logit shards: the upcast, log-softmax, their gradients), where a compiled "
                "loss fuses some of them"],
    },
    {
        "id": "torchtitan-8b-fsdp8-tp8",
        "what": "Llama 3 8B, FSDP 8 x TP 8 on 64 H100, local batch 12, per-op selective AC, "
                "torch.compile, bfloat16, vanilla TP (async TP table, 'None (bfloat16)' row)",
        "source": {**_TORCHTITAN_2506, "table": "Llama3 8b on 64 H100s",
                   "config": "train_configs/llama3_8b.toml: seq_len 8192; bfloat16 row, "
                             "vanilla TP"},
        "config": LLAMA31_8B, "gpus": 64, "tp": 8, "pp": 1, "global_batch": 96,
        "micro_batch": 12, "seq_len": 8192, "checkpointing": ("none", "block"),
        "sequence_parallel": True, "compiled": True,
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": 96,
        "device": _GRAND_TETON,
        "published": {"tokens_per_s_per_gpu": 4378},
        "gap": [*_TORCHTITAN_GAP, "torch.compile (fused elementwise kernels)",
                "sequence and loss parallelism as torchtitan runs them (TP 8 = FSDP 8: each "
                "collective's record names its group, so the two are told apart)"],
    },
    {
        "id": "megatron-gpt-1.7b",
        "what": "GPT 1.7B (16 heads, hidden 2048, 24 layers), TP 1 PP 1 DP 48 on 48 H100, "
                "batch 192",
        "source": {**_MEGATRON, "table": "model table, row 1.7B"},
        "config": _gpt(2048, 16, 24), "gpus": 48, "tp": 1, "pp": 1, "global_batch": 192,
        "data_parallel": "zero1",
        "micro_batch": None, "seq_len": 4096, "checkpointing": ("none", "block"),
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": None,
        "device": "H100 80 GB (the h100-sxm profile)",
        "published": {"mfu": 0.41, "tflops_per_gpu": 408.8},
        "gap": [
            "the model: GPT (GeLU MLP of 4h, LayerNorm, learned positions) planned as a "
            "Llama shape of the same matrix FLOPs (SwiGLU of 8h/3, RMSNorm, rotary)",
            "Megatron's data parallelism is DDP with a distributed optimizer (ZeRO-1: bf16 "
            "parameters whole, fp32 main parameters and moments sharded), planned as ZeRO-1 "
            "(data_parallel='zero1': moments sharded, the float32 parameters whole, as FSDP2's "
            "mixed precision keeps them on replicas, so 2 bytes per parameter more than "
            "Megatron's bf16 copy beside sharded main parameters); until 2026-11-30 as FSDP2 "
            "(ZeRO-3: parameters gathered per layer and microbatch)",
            "micro-batch and recomputation not published: every micro-batch and both "
            "checkpointing choices planned, the fastest that fits shown",
            "fused kernels (Transformer Engine, FlashAttention) and Megatron's MFU formula "
            "(its own FLOPs per token) against flopscope's counted FLOPs",
            "times are roofline lower bounds: predicted MFU is an upper bound",
            "sequence parallelism: not stated in the README, planned without",
        ],
    },
    {
        "id": "megatron-gpt-7.1b",
        "what": "GPT 7.1B (32 heads, hidden 4096, 30 layers), TP 2 PP 1 DP 48 on 96 H100, "
                "batch 192",
        "source": {**_MEGATRON, "table": "model table, row 7.1B"},
        "config": _gpt(4096, 32, 30), "gpus": 96, "tp": 2, "pp": 1, "global_batch": 192,
        "data_parallel": "zero1",
        "micro_batch": None, "seq_len": 4096, "checkpointing": ("none", "block"),
        "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": None,
        "device": "H100 80 GB (the h100-sxm profile)",
        "published": {"mfu": 0.47, "tflops_per_gpu": 465.9},
        "gap": ["tensor-parallel all-reduces overlapped with the GEMMs (--tp-comm-overlap); "
                "the planner leaves them exposed"],
    },
]
RUNS[-1]["gap"] = RUNS[-2]["gap"] + RUNS[-1]["gap"]
RUNS.append({
    "id": "megatron-gpt-70b",
    "what": "GPT 70B (64 heads, hidden 8192, 84 layers), TP 8 PP 2 DP 48 on 768 H100, batch 384",
    "source": {**_MEGATRON, "table": "model table, row 70B"},
    "config": _gpt(8192, 64, 84), "gpus": 768, "tp": 8, "pp": 2, "global_batch": 384,
    "data_parallel": "zero1",
    "micro_batch": None, "seq_len": 4096, "checkpointing": ("none", "block"),
    "param_dtype": "float32", "reduce_dtype": "float32", "memory_budget_gib": None,
    "device": "H100 80 GB (the h100-sxm profile)",
    "published": {"mfu": 0.42, "tflops_per_gpu": 419.7},
    "gap": [*RUNS[-1]["gap"],
            "the pipeline: Megatron's interleaved 1F1B (virtual stages) against the planner's "
            "1F1B over 2 stages, whose bubble is larger",
            "Megatron's vocabulary-parallel cross-entropy: planned as torch's loss "
            "parallelism on the last stage (since 2026-11-30; before, the last stage's head "
            "ran whole on every TP rank)"],
})

#: the runs not planned here, and why
NOT_PLANNED: list[dict[str, Any]] = [
    {"what": "Llama 3 405B: TP 8 PP 16 DP 64 on 8,192 H100 (43% MFU, 430 TFLOP/s per GPU) "
             "and DP 128 on 16,384 (41%, 400)",
     "source": "The Llama 3 Herd of Models (arXiv 2407.21783); read here only second-hand: "
               "glennklockwood.com/garden/llama-3.1, quoting P. Balaji's SC'24 slide (8,192 "
               "GPUs, TP 8, CP 1, PP 16, 16M tokens per batch, 430 TFLOP/s per GPU; 16,384: "
               "400; with CP 16: 380)",
     "why": "the paper's own table was not in the stored pages; and its 126 layers in 16 "
            "stages of 7 or 8 are simulated whole over 16 microbatches per role (docs/plan.md "
            "'Speed'), 8 to 16 such roles at hidden 16,384: hours on this machine"},
    {"what": "torchtitan Llama 3.1 405B (Tables 5 and 6) and every Float8 row",
     "source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
     "why": "Float8 linears are not modelled; the 405B's interleaved 1F1B and context "
            "parallelism are not in the planner"},
    {"what": "Megatron-LM GPT 119B to 462B (TP 8, PP 4 to 16, 1,536 to 6,144 H100)",
     "source": "NVIDIA/Megatron-LM README model table",
     "why": "each needs tens of 70B-sized roles (tens of seconds to minutes each here); and "
            "their interleaved pipeline schedule is not in the planner"},
]

#: the tiny model ``--dry`` plans each run's layout with
TINY: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                            num_key_value_heads=8, intermediate_size=128, vocab_size=256)


def shrink(run: dict[str, Any]) -> dict[str, Any]:
    """The run on a tiny model and world: the same tensor and pipeline degrees, two data-parallel
    ranks, the same sequences per rank (at most 2), 64 tokens.

    Args:
        run: a published run.

    Returns:
        A run of the same form the planner finishes in seconds.
    """
    per_rank = min(2, run["global_batch"] * run["tp"] * run["pp"] // run["gpus"])
    gpus = run["tp"] * run["pp"] * 2
    micro = None if run["micro_batch"] is None else min(run["micro_batch"], per_rank)
    return {**run, "config": TINY, "gpus": gpus, "global_batch": 2 * per_rank,
            "micro_batch": micro, "seq_len": 64}


def compare(run: dict[str, Any]) -> dict[str, Any]:
    """Plan one published run's layout and put it beside the published figures.

    Args:
        run: a published run (:data:`RUNS`).

    Returns:
        The row: the run, the planned candidates of its layout (each checkpointing choice at the
        published micro-batch, or every micro-batch where none is published), the one compared
        (the fastest of those that fit), the ratios and the gap.
    """
    import flopscope
    from flopscope.plan import Plan

    start = time.perf_counter()
    budget = (None if run["memory_budget_gib"] is None
              else int(run["memory_budget_gib"] * 2**30))
    plan = flopscope.plan("hf:llama", gpus=run["gpus"], hardware="h100-sxm",
                          config=run["config"], seq_len=run["seq_len"],
                          global_batch=run["global_batch"], tp=run["tp"], pp=run["pp"],
                          checkpointing=run["checkpointing"], param_dtype=run["param_dtype"],
                          reduce_dtype=run["reduce_dtype"], memory_budget=budget,
                          sequence_parallel=run.get("sequence_parallel", False),
                          data_parallel=run.get("data_parallel"),
                          compiled=run.get("compiled", False))  # torch.compile: no host time
    assert isinstance(plan, Plan)
    capacity = plan.hardware.memory_bytes or 0
    tokens_per_step = plan.global_batch * plan.seq_len
    flops_per_token = plan.model_flops / tokens_per_step
    peak = plan.hardware.peak("bf16", matrix=True)
    rows = []
    for c in sorted((*plan.ranked, *plan.dropped), key=lambda c: c.time.total):
        if run["micro_batch"] is not None and c.choice.micro_batch != run["micro_batch"]:
            continue
        rows.append({
            "layout": c.choice.label, "checkpointing": c.choice.checkpoint,
            "micro_batch": c.choice.micro_batch, "memory_gib": c.memory_bytes / 2**30,
            "fits_budget": c.fits, "fits_80gb": c.memory_bytes <= capacity,
            "peak_where": c.peak_where, "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu,
            "mfu": c.mfu, "tflops_per_gpu": plan.model_flops / c.time.total / plan.gpus / 1e12,
            "step_s": c.time.total, "time_s": c.time.to_dict(), "reason": c.reason,
            "time_kind": c.time.compute, "step_bound_s": c.bound_step.total,
            "mfu_bound": c.mfu_bound,
            "tokens_per_s_per_gpu_bound": c.tokens_per_s_per_gpu * c.time.total
            / c.bound_step.total, "bound_time_s": c.bound_step.to_dict()})
    fitting = [r for r in rows if r["fits_budget"]]
    shown = fitting[0] if fitting else (rows[0] if rows else None)
    published = dict(run["published"])
    if "tokens_per_s_per_gpu" in published:
        # the published throughput at flopscope's FLOPs per token: MFU with one numerator
        published["mfu_at_flopscope_flops"] = (published["tokens_per_s_per_gpu"]
                                               * flops_per_token / peak)
    ratios: dict[str, float] = {}
    if shown is not None:
        for key in ("tokens_per_s_per_gpu", "mfu", "tflops_per_gpu"):
            if key in published:
                ratios[f"{key}_predicted_over_published"] = shown[key] / published[key]
        if "tokens_per_s_per_gpu" in published:
            ratios["tokens_per_s_per_gpu_bound_over_published"] = (
                shown["tokens_per_s_per_gpu_bound"] / published["tokens_per_s_per_gpu"])
        mfu = published.get("mfu_at_flopscope_flops", published.get("mfu"))
        if "mfu_at_flopscope_flops" in published:
            ratios["mfu_predicted_over_published"] = (
                shown["mfu"] / published["mfu_at_flopscope_flops"])
        if mfu:
            ratios["mfu_bound_over_published"] = shown["mfu_bound"] / mfu
    return {
        "id": run["id"], "what": run["what"], "source": run["source"],
        "device": run["device"], "gpus": run["gpus"], "tp": run["tp"], "pp": run["pp"],
        "dp": run["gpus"] // (run["tp"] * run["pp"]), "global_batch": run["global_batch"],
        "seq_len": run["seq_len"], "micro_batch": run["micro_batch"],
        "config": run["config"], "precision": plan.precision,
        "sequence_parallel": run.get("sequence_parallel", False),
        "data_parallel": run.get("data_parallel", "fsdp"),
        "compiled": run.get("compiled", False),
        "memory_budget_gib": None if budget is None else budget / 2**30,
        "capacity_gib": capacity / 2**30, "flops_per_token": flops_per_token,
        "planned": rows, "compared": shown, "published": published, "ratios": ratios,
        "gap": run["gap"], "time_model": (
            f"prediction ({plan.hardware.calibration.source()}), the roofline bound beside"
            if plan.hardware.calibration is not None else "roofline lower bound"),
        "roles": plan.roles, "simulations": plan.simulations,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Plan the published runs and write the JSON.

    Args:
        argv: the command line (``None``: ``sys.argv``).

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated run ids (default: all)")
    parser.add_argument("--dry", action="store_true",
                        help="each run's layout on a tiny model (seconds)")
    parser.add_argument("--json", help="where to write (default: "
                        "benchmarks/results/published_runs.json; with --dry, nowhere)")
    parser.add_argument("--checkpointing", default="",
                        help="comma-separated checkpointing choices planned for every run "
                             "instead of its own (e.g. selective)")
    args = parser.parse_args(argv)
    choices = tuple(s for s in args.checkpointing.split(",") if s)
    path = args.json or (None if args.dry else "benchmarks/results/published_runs.json")
    only = {s for s in args.only.split(",") if s}
    unknown = only - {r["id"] for r in RUNS}
    if unknown:
        parser.error(f"--only: unknown run id(s) {', '.join(sorted(unknown))}; known: "
                     f"{', '.join(r['id'] for r in RUNS)}")
    kept: dict[str, dict[str, Any]] = {}
    if path is not None and os.path.exists(path):
        with open(path) as f:
            kept = {r["id"]: r for r in json.load(f).get("runs", [])}
    load = os.getloadavg()[0]
    for run in RUNS:
        if only and run["id"] not in only:
            continue
        if choices:
            run = {**run, "checkpointing": choices}
        row = compare(shrink(run) if args.dry else run)
        row["load"] = round(load, 1)
        kept[run["id"]] = row
        shown = row["compared"] or {}
        print(f"{run['id']}: {shown.get('layout')} {shown.get('memory_gib', 0):.1f} GiB, "
              f"{shown.get('tokens_per_s_per_gpu', 0):,.0f} tok/s/GPU, MFU "
              f"{shown.get('mfu', 0):.1%} (bound {shown.get('mfu_bound', 0):.1%}); published "
              f"{row['published']}; {row['seconds']} s",
              flush=True)
        if path is None:
            continue
        with open(path, "w") as f:
            json.dump({"runs": [kept[r["id"]] for r in RUNS if r["id"] in kept],
                       "not_planned": NOT_PLANNED, "dry": args.dry}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
