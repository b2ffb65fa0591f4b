"""Where a plan's role simulations run: in the planning process, in local worker processes
(``--jobs``) or as Ray tasks on a local cluster (``--ray``), the same plan each way, in one
process, interleaved (each way's roles forgotten before it runs).

Run: ``python -m benchmarks.plan_workers [--jobs 2] [--gpus 8] [--rounds 1] [--json FILE]``.
The figures are wall times on this machine under its load at the time (printed with
``uptime``); compare the ways within a round, not across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

#: a small Llama-style config: 4 layers, hidden 512, 8 heads, 4 KV heads, MLP 1408, vocab 8000
CONFIG: dict[str, Any] = dict(hidden_size=512, num_hidden_layers=4, intermediate_size=1408,
                              num_attention_heads=8, num_key_value_heads=4, vocab_size=8000)


def _forget() -> None:
    from flopscope.plan import roles

    roles.clear_cache()


def one_way(way: str, gpus: int, jobs: int) -> dict[str, Any]:
    """Plan once, the roles simulated ``way`` (``here``, ``jobs``, ``ray``).

    Args:
        way: where the roles run.
        gpus: devices.
        jobs: worker processes (Ray: the local cluster's CPUs).

    Returns:
        The figures: seconds, roles, the best layout.
    """
    from flopscope.plan.sweeps import sweep

    _forget()
    start = time.perf_counter()
    ray = "local" if way == "ray" else None
    (row,) = sweep(["hf:llama"], gpus=[gpus], seq_lens=[1024], hardware="h100-sxm",
                   jobs=1 if way == "here" else jobs, ray=ray, config=CONFIG,
                   global_batch=gpus * 2, checkpointing=("none",))
    seconds = time.perf_counter() - start
    assert row.plan is not None, row.error
    best = row.plan.best
    return {"way": way, "seconds": round(seconds, 1), "roles": row.plan.roles,
            "simulated_in_planner": row.plan.simulations,
            "best": best.choice.label if best else None}


def main() -> None:
    """Run the comparison and print (or write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    ways = ["here", "jobs"]
    try:
        import ray  # noqa: F401

        ways.append("ray")
    except ImportError:
        pass
    from flopscope.errors import UsageError

    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for way in ways:
            load = os.getloadavg()[0]
            start = time.perf_counter()
            try:
                figures = one_way(way, args.gpus, args.jobs)
            except UsageError as e:  # a local Ray cluster that did not start here
                figures = {"way": way, "error": str(e),
                           "seconds": round(time.perf_counter() - start, 1)}
            row = {"round": r, "load_before": round(load, 1), **figures}
            print(row, flush=True)
            rows.append(row)
            if args.json:  # after every row: a later failure keeps the earlier figures
                result = {"config": CONFIG, "gpus": args.gpus, "jobs": args.jobs,
                          "cpus": os.cpu_count(), "rows": rows}
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=2)
                    f.write("\n")


if __name__ == "__main__":
    main()
