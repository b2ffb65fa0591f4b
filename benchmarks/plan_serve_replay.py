"""What the static replay (:func:`flopscope.core.memo.static_replay`, entered by every simulated
rank through :func:`flopscope.distributed.shape_only.shape_only_rank`) gains on a serving plan:
docs/plan.md's worked example, an 8B-shaped Llama served on 8 H100s (32 layers, hidden 4096,
32 heads, 8 KV heads, MLP 14,336, vocabulary 128,256, bfloat16; prompts of 2048 tokens, 256 new
tokens, batches 1 and 32 and the largest that fits), ``flopscope.plan(..., mode="serve")`` in
one process at one thread, its CPU time (``time.process_time``).

- ``--part plan``: the plan in this process (JSON on stdout: CPU seconds, serving roles
  simulated, the load, a digest of the plan's dict without its timings).
- ``--compare BASE_SRC [--json FILE] [--reps N]``: ``--part plan`` in fresh processes,
  alternating between ``BASE_SRC`` (another checkout's ``src``: the code before the change) and
  this checkout's, ``N`` times each (default 2); the best of each, their ratio, and whether
  every plan was the same.

Run: ``python -m benchmarks.plan_serve_replay [--part plan | --compare BASE_SRC]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LLAMA_8B: dict[str, Any] = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=14336,
                                vocab_size=128256, max_position_embeddings=8192)
PLAN: dict[str, Any] = dict(gpus=8, hardware="h100-sxm", mode="serve", seq_len=2048,
                            max_new_tokens=256, batches=[1, 32])


def _without_timings(d: Any) -> Any:
    """The plan's dict less how long it took (the simulation's seconds)."""
    if isinstance(d, dict):
        return {k: _without_timings(v) for k, v in d.items() if "seconds" not in k}
    if isinstance(d, list):
        return [_without_timings(v) for v in d]
    return d


def plan_once() -> dict[str, Any]:
    """The serving plan in this process, at one thread.

    Returns:
        CPU seconds, roles simulated, the 1-minute load before and after, the plan's digest.
    """
    import warnings

    import torch

    import flopscope

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    loads = [os.getloadavg()[0]]
    start = time.process_time()
    plan = flopscope.plan("hf:llama", config=LLAMA_8B, **PLAN)
    cpu = time.process_time() - start
    loads.append(os.getloadavg()[0])
    body = json.dumps(_without_timings(plan.to_dict()), sort_keys=True, default=str)
    return {"cpu_s": round(cpu, 2), "simulations": getattr(plan, "simulations", None),
            "load_1min": [round(x, 2) for x in loads],
            "digest": hashlib.sha256(body.encode()).hexdigest()[:16]}


def compare(base: str, path: str | None, reps: int) -> None:
    """``--part plan`` alternating between ``base`` and this checkout's ``src``."""
    here = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(reps):
        for label, src in (("before", base), ("after", here)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, str(Path(here).parent)]))
            done = subprocess.run([sys.executable, "-m", "benchmarks.plan_serve_replay",
                                   "--part", "plan"], env=env, check=True, capture_output=True,
                                  text=True)
            runs[label].append(json.loads(done.stdout))
            print(label, runs[label][-1], file=sys.stderr, flush=True)
    before = min(r["cpu_s"] for r in runs["before"])
    after = min(r["cpu_s"] for r in runs["after"])
    out = {"machine": "2 shared vCPUs, one thread, CPU time (process_time), fresh processes "
                      "alternating before / after",
           "model": "8B-shaped Llama served on 8 x h100-sxm, prompts 2048, 256 new tokens, "
                    "batches 1, 32 and the largest (docs/plan.md's worked example)",
           "before_cpu_s": before, "after_cpu_s": after, "speedup": round(before / after, 2),
           "same_plan": len({r["digest"] for r in runs["before"] + runs["after"]}) == 1,
           "runs": runs}
    print(json.dumps(out, indent=2))
    if path:
        Path(path).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    """Parse the arguments and run the part asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("plan",))
    parser.add_argument("--compare", metavar="BASE_SRC")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.json, args.reps)
        return
    print(json.dumps(plan_once(), indent=2))


if __name__ == "__main__":
    main()
