"""One simulated rank of a 70B-shaped Llama at 1,024 ranks (TP 8 x FSDP 128): time and peak memory;
with ``--table``, the layouts of the table in docs/distributed.md (rank FLOPs per token and bus bytes
per step, ``logical=False``), one row per layout with its time.

With ``--pipeline``, every stage of a 70B pipeline at 1,024 ranks (PP 8 x TP 8 x FSDP 16, 1F1B,
8 microbatches of 1 x 4096 tokens per step): per stage FLOPs, bytes sent per microbatch, idle
fraction, and the bubble.

With ``--compare``, the 1,024-rank rank (logical count included) with its repeated layers put
together from three small layer counts (``simulate``'s default) and counted every layer
(``repeat_layers=False``), interleaved three times each in one process, one thread, the reports
checked equal; ``--json FILE`` writes the figures.

Run: ``python -m benchmarks.distributed_scale [--table | --pipeline | --compare [--json FILE]]``
(about a minute, or a few, here).
"""

from __future__ import annotations

import resource
import sys
import time

import torch

from flopscope.render.units import human, scaled

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


def _peak_rss() -> str:
    """This process's peak resident memory (``ru_maxrss`` is in KiB on Linux)."""
    return human(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "B")


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
        bus = {k: human(v.bus_bytes, "B", digits=1)
               for k, v in r.communication_by_kind().items()}
        print(f"| {s} ({report.ranks[s]}) | {scaled(r.flops, 'T', 1)} | "
              f"{human(p2p['send_forward'], 'B')} | {human(p2p['send_backward'], 'B')} | "
              f"{bus.get('all_reduce', '0')} | {bus.get('all_gather', '0')} | "
              f"{bus.get('reduce_scatter', '0')} | {float(report.stage_bubbles[s]):.1%} |")
    print(f"bubble {float(report.bubble):.2%} ({report.bubble}); textbook (p-1)/(m+p-1) = "
          f"{7 / 15:.2%}; {seconds:.0f} s, peak RSS {_peak_rss()}")


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
        bus = {kind: human(s.bus_bytes, "B", digits=1)
               for kind, s in report.communication_by_kind().items()}
        total = report.communication_total().bus_bytes
        print(f"| TP {tp} x FSDP {fsdp} ({tp * fsdp:,}) | {scaled(report.flops / TOKENS, 'T', 4)} | "
              f"{bus.get('all_gather', '0')} | {bus.get('all_reduce', '0')} | "
              f"{bus.get('reduce_scatter', '0')} | "
              f"{human(total, 'B', digits=1)} | {seconds:.0f} s |", flush=True)
    print(f"peak RSS {_peak_rss()}")


def compare(path: str | None) -> None:
    """Repeated layers against every layer, interleaved; print (and write) the figures."""
    import json
    import os

    from flopscope.distributed import Layout, simulate

    torch.set_num_threads(1)
    layout = Layout(1024, tp=8, fsdp=128)
    simulate(build, layout, backward=True, warn=False, logical=False)  # imports, first calls
    times: dict[bool, list[float]] = {True: [], False: []}
    reports = {}
    loads = []
    for _ in range(3):
        for repeat in (True, False):
            loads.append(os.getloadavg()[0])
            start = time.perf_counter()
            reports[repeat] = simulate(build, layout, backward=True, warn=False,
                                       repeat_layers=repeat)
            times[repeat].append(time.perf_counter() - start)
    fast, slow = min(times[True]), min(times[False])
    out = {"model": "70B-shaped Llama, 80 layers, float32, 1 x 4096 tokens, forward + backward, "
                    "shape-only, logical count included",
           "layout": "TP 8 x FSDP 128 (1,024 ranks), rank 0",
           "repeated_layers_s": [round(t, 2) for t in times[True]],
           "every_layer_s": [round(t, 2) for t in times[False]],
           "best_repeated_layers_s": round(fast, 2), "best_every_layer_s": round(slow, 2),
           "speedup_best": round(slow / fast, 1), "same_report": reports[True] == reports[False],
           "load_1min": [round(x, 2) for x in loads],
           "rank_flops": reports[True].flops,
           "logical_flops": reports[True].logical_total().flops,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
    print(json.dumps(out, indent=2))
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


def main() -> None:
    """Count the rank and print time, peak RSS, FLOPs and communication per kind."""
    from flopscope.distributed import Layout, simulate

    if "--table" in sys.argv[1:]:
        table()
        return
    if "--pipeline" in sys.argv[1:]:
        pipeline()
        return
    if "--compare" in sys.argv[1:]:
        args = sys.argv[1:]
        compare(args[args.index("--json") + 1] if "--json" in args else None)
        return

    start = time.perf_counter()
    report = simulate(build, Layout(1024, tp=8, fsdp=128), backward=True, warn=False)
    seconds = time.perf_counter() - start
    print(f"time {seconds:.1f} s, peak RSS {_peak_rss()}")
    print(f"rank FLOPs {report.flops:,}, logical {report.logical_total().flops:,}")
    for kind, stats in report.communication_by_kind().items():
        print(f"{kind}: {stats.calls} calls, payload {stats.payload_bytes:,} B, "
              f"bus {stats.bus_bytes:,} B")


if __name__ == "__main__":
    main()
