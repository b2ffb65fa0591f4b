"""One simulated rank of a 70B-shaped Llama at 1,024 ranks (TP 8 x FSDP 128): time and peak memory;
with ``--table``, the layouts of the table in docs/distributed.md (rank FLOPs per token and bus bytes
per step, ``logical=False``), one row per layout with its time.

With ``--pipeline``, every stage of a 70B pipeline at 1,024 ranks (PP 8 x TP 8 x FSDP 16, 1F1B,
8 microbatches of 1 x 4096 tokens per step): per stage FLOPs, bytes sent per microbatch, idle
fraction, and the bubble.

Run: ``python -m benchmarks.distributed_scale [--table | --pipeline]`` (about a minute, or a few,
here).
"""

from __future__ import annotations

import resource
import sys
import time

import torch

TOKENS = 4096  # per rank: batch 1 x 4096
#: (tp, fsdp) of the table's layouts
LAYOUTS = [(8, 16), (8, 128), (4, 256), (1, 1024)]


def build(batch: int = 1) -> tuple[torch.nn.Module, tuple[()], dict[str, torch.Tensor]]:
    """A 70B-shaped Llama on ``meta`` and one rank's batch (``batch`` x 4096 tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    ids = torch.zeros(batch, TOKENS, dtype=torch.long, device="meta")
    return model, (), {"input_ids": ids}


def pipeline() -> None:
    """Every stage of PP 8 x TP 8 x FSDP 16 (1,024 ranks), 1F1B, 8 microbatches: one line each."""
    from flopscope.distributed import Layout, simulate_pipeline

    start = time.perf_counter()
    report = simulate_pipeline(lambda: build(8), Layout(1024, tp=8, fsdp=16, pp=8),
                               microbatches=8, schedule="1f1b", backward=True, warn=False)
    seconds = time.perf_counter() - start
    print("| stage (rank) | TFLOPs per step | activations sent per microbatch | gradients sent "
          "per microbatch | all-reduce bus | all-gather bus | reduce-scatter bus | idle |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, r in enumerate(report.stages):
        p2p = report.p2p_per_microbatch(s)
        bus = {k: f"{v.bus_bytes / 1e9:.1f} GB" for k, v in r.communication_by_kind().items()}
        print(f"| {s} ({report.ranks[s]}) | {r.flops / 1e12:.1f} | "
              f"{p2p['send_forward'] / 2**20:.0f} MiB | {p2p['send_backward'] / 2**20:.0f} MiB | "
              f"{bus.get('all_reduce', '0')} | {bus.get('all_gather', '0')} | "
              f"{bus.get('reduce_scatter', '0')} | {float(report.stage_bubbles[s]):.1%} |")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bubble {float(report.bubble):.2%} ({report.bubble}); textbook (p-1)/(m+p-1) = "
          f"{7 / 15:.2%}; {seconds:.0f} s, peak RSS {peak_mb:.0f} MB")


def table() -> None:
    """One markdown row per layout: rank TFLOPs per token, bus bytes per step per kind, time."""
    from flopscope.distributed import Layout, simulate

    print("| layout (ranks) | rank TFLOPs per token | all-gather bus | all-reduce bus | "
          "reduce-scatter bus | total bus per step | simulated in |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tp, fsdp in LAYOUTS:
        start = time.perf_counter()
        report = simulate(build, Layout(tp * fsdp, tp=tp, fsdp=fsdp), backward=True, warn=False,
                          logical=False)
        seconds = time.perf_counter() - start
        bus = {kind: f"{s.bus_bytes / 1e9:.1f} GB"
               for kind, s in report.communication_by_kind().items()}
        total = report.communication_total().bus_bytes
        print(f"| TP {tp} x FSDP {fsdp} ({tp * fsdp:,}) | {report.flops / TOKENS / 1e12:.4f} | "
              f"{bus.get('all_gather', '0')} | {bus.get('all_reduce', '0')} | "
              f"{bus.get('reduce_scatter', '0')} | "
              f"{total / 1e9:.1f} GB | {seconds:.0f} s |", flush=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mb:.0f} MB")


def main() -> None:
    """Count the rank and print time, peak RSS, FLOPs and communication per kind."""
    from flopscope.distributed import Layout, simulate

    if "--table" in sys.argv[1:]:
        table()
        return
    if "--pipeline" in sys.argv[1:]:
        pipeline()
        return

    start = time.perf_counter()
    report = simulate(build, Layout(1024, tp=8, fsdp=128), backward=True, warn=False)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"time {seconds:.1f} s, peak RSS {peak_mb:.0f} MB")
    print(f"rank FLOPs {report.flops:,}, logical {report.logical_total().flops:,}")
    for kind, stats in report.communication_by_kind().items():
        print(f"{kind}: {stats.calls} calls, payload {stats.payload_bytes:,} B, "
              f"bus {stats.bus_bytes:,} B")


if __name__ == "__main__":
    main()
