"""One simulated rank of a 70B-shaped Llama at 1,024 ranks (TP 8 x FSDP 128): time and peak memory;
with ``--table``, the layouts of the table in docs/distributed.md (rank FLOPs per token and bus bytes
per step, ``logical=False``), one row per layout with its time.

Run: ``python -m benchmarks.distributed_scale [--table]`` (about a minute, or a few, here).
"""

from __future__ import annotations

import resource
import sys
import time

import torch

TOKENS = 4096  # per rank: batch 1 x 4096
#: (tp, fsdp) of the table's layouts
LAYOUTS = [(8, 16), (8, 128), (4, 256), (1, 1024)]


def build() -> tuple[torch.nn.Module, tuple[()], dict[str, torch.Tensor]]:
    """A 70B-shaped Llama on ``meta`` and one rank's batch (1 x 4096 tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model, (), {"input_ids": torch.zeros(1, TOKENS, dtype=torch.long, device="meta")}


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
