"""One simulated rank of a 70B-shaped Llama at 1,024 ranks (TP 8 x FSDP 128): time and peak memory.

Run: ``python -m benchmarks.distributed_scale`` (about a minute here; docs/distributed.md).
"""

from __future__ import annotations

import resource
import time

import torch


def main() -> None:
    """Count the rank and print time, peak RSS, FLOPs and communication per kind."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopscope.distributed import Layout, simulate

    config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)

    def build() -> tuple[torch.nn.Module, tuple[()], dict[str, torch.Tensor]]:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        return model, (), {"input_ids": torch.zeros(1, 4096, dtype=torch.long, device="meta")}

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
