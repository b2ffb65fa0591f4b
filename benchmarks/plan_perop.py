"""What one layer pass of a planner role costs (a decoder layer's forward and backward for one
microbatch, simulated shape-only on the fake process group with the memory tracker and the
roofline log), and where its time goes.

A 70B-shaped Llama's roles (hidden 8192, 64 heads, 8 KV heads, MLP 28,672, vocabulary 128,256,
4096 tokens per sequence, bfloat16): TP 8 x FSDP 32 with and without checkpointing, and stage 0
of TP 8 x PP 2 x FSDP 16 (2 microbatches). A role's time per layer pass is the CPU time of the
role cut to 6 layers per stage less that of 2 layers, over 4 x its microbatches (the rest, the
embedding, head, loss and setup, cancels), at one thread.

- ``--part passes``: the time per layer pass of each role in this process (JSON on stdout).
- ``--part split``: where the time of a layer pass goes, by a stack sampler (``SIGPROF`` every
  CPU millisecond or so; each sample goes to the innermost frame of a known component: torch's
  fake tensor mode, DTensor's dispatch and sharding propagation, FSDP2, the collectives,
  autograd, the model's code, flopscope's counter, its memory tracker and roofline log, ...),
  the samples of 2 layers subtracted from those of 6.
- ``--compare BASE_SRC [--json FILE]``: ``--part passes`` in fresh processes, alternating
  between ``BASE_SRC`` (another checkout's ``src``, e.g. the code before a change) and this
  checkout's, three times each; the best of each and their ratio.

Run: ``python -m benchmarks.plan_perop [--part passes | --part split | --compare BASE_SRC]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LLAMA_70B: dict[str, Any] = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                 num_attention_heads=64, num_key_value_heads=8)
SEQ = 4096
#: name -> (tp, pp, stage, dp, microbatches, checkpoint)
ROLES: dict[str, tuple[int, int, int, int, int, bool]] = {
    "tp8_fsdp32": (8, 1, 0, 32, 1, False),
    "tp8_fsdp32_ckpt": (8, 1, 0, 32, 1, True),
    "tp8_pp2_fsdp16_stage0": (8, 2, 0, 16, 2, False),
}
SMALL, LARGE = 2, 6  # layers per stage

#: (component, path fragments of its code), the first that matches the innermost frame wins
COMPONENTS: list[tuple[str, tuple[str, ...]]] = [
    ("flopscope memory tracker", ("flopscope/estimate/memory.py", "flopscope/estimate/resizes.py")),
    ("flopscope roofline log", ("flopscope/estimate/",)),
    ("flopscope plan observers", ("flopscope/plan/", "flopscope/distributed/pipeline.py")),
    ("flopscope module attribution", ("flopscope/core/module_calls.py",
                                      "flopscope/core/tracker.py")),
    ("fake tensor mode", ("torch/_subclasses/", "flopscope/execution/meta.py",
                          "torch/_meta_registrations", "torch/_refs", "torch/_decomp",
                          "torch/_prims/")),
    ("DTensor sharding propagation", ("torch/distributed/tensor/_sharding_prop.py",
                                      "torch/distributed/tensor/_ops/",
                                      "torch/distributed/tensor/_op_schema.py")),
    ("DTensor dispatch", ("torch/distributed/tensor/",)),
    ("FSDP2", ("torch/distributed/fsdp/", "torch/distributed/_composable")),
    ("collectives (c10d, functional)", ("torch/distributed/",)),
    ("flopscope counter (dispatch, memo, costing, records)", ("flopscope/",)),
    ("autograd (engine, checkpoint)", ("torch/autograd/", "torch/utils/checkpoint.py")),
    ("model code (transformers, nn)", ("transformers/", "torch/nn/")),
]
#: frames that only pass a call on (a sample in them goes to the frame that called them)
PASS_ON = ("torch/_ops.py", "torch/utils/_stats.py", "torch/_dynamo/", "torch/_compile.py",
           "contextlib.py", "functools.py", "torch/utils/_pytree.py", "torch/overrides.py",
           "torch/utils/_python_dispatch.py", "typing.py", "abc.py", "weakref", "threading.py",
           "torch/_library/", "torch/utils/_contextlib.py", "torch/_tensor.py", "dataclasses.py",
           "<frozen", "enum.py", "torch/_prims_common", "torch/_jit_internal")


def _role(name: str, layers: int) -> Any:
    """The role ``name`` with ``layers`` decoder layers per stage, simulated (every layer)."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model
    from flopscope.plan.roles import RoleKey, Roles, clear_cache

    tp, pp, stage, dp, microbatches, checkpoint = ROLES[name]
    config = dict(LLAMA_70B, num_hidden_layers=layers * pp)
    clear_cache()
    roles = Roles(build_model("hf:llama", SEQ, "bfloat16", config), get_hardware("h100-sxm"),
                  ("plan_perop", name, layers), repeat_layers=False, repeat_microbatches=False)
    return roles.get(RoleKey(tp, pp, stage, dp, 1, microbatches, checkpoint,
                             loss="cross_entropy"))


def passes(reps: int = 2) -> dict[str, Any]:
    """CPU seconds per layer pass of each role (best of ``reps``), with the peaks."""
    import torch

    torch.set_num_threads(1)
    _role("tp8_fsdp32", SMALL)  # imports and first calls
    out: dict[str, Any] = {"load_1min": [os.getloadavg()[0]]}
    for name, (_, _, _, _, microbatches, _) in ROLES.items():
        best: dict[int, float] = {}
        for _ in range(reps):
            for layers in (SMALL, LARGE):
                start = time.process_time()
                run = _role(name, layers)
                best[layers] = min(best.get(layers, 1e9), time.process_time() - start)
        out[name] = {"s_per_layer_pass": (best[LARGE] - best[SMALL]) / (
            (LARGE - SMALL) * microbatches), "role_s": {str(k): v for k, v in best.items()},
            "peak_bytes": run.memory.peak_bytes, "records": len(run.report.records)}
    out["load_1min"].append(os.getloadavg()[0])
    return out


def split(reps: int = 4, name: str = "tp8_fsdp32") -> dict[str, Any]:
    """Where a layer pass's time goes (see the module docstring)."""
    import torch

    torch.set_num_threads(1)
    samples: collections.Counter[str] = collections.Counter()
    sign = [0]

    def sample(signum: int, frame: Any) -> None:
        if not sign[0]:
            return
        found = "other"
        while frame is not None:
            path = frame.f_code.co_filename
            if not any(p in path for p in PASS_ON):
                hit = next((c for c, parts in COMPONENTS if any(p in path for p in parts)), None)
                if hit is not None:
                    found = hit
                    break
            frame = frame.f_back
        samples[found] += sign[0]

    _role(name, SMALL)
    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    seconds = {SMALL: 0.0, LARGE: 0.0}
    loads = []
    try:
        for _ in range(reps):
            for layers, s in ((SMALL, -1), (LARGE, 1)):
                loads.append(os.getloadavg()[0])
                sign[0] = s
                start = time.process_time()
                _role(name, layers)
                seconds[layers] += time.process_time() - start
                sign[0] = 0
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    per_pass = (seconds[LARGE] - seconds[SMALL]) / reps / (LARGE - SMALL)
    total = sum(samples.values())
    return {"role": name, "s_per_layer_pass": round(per_pass, 4), "samples": total,
            "load_1min": [round(x, 2) for x in loads],
            "share": {c: round(n / total, 3) for c, n in samples.most_common()}}


def compare(base: str, path: str | None) -> None:
    """``--part passes`` alternating between ``base`` and this checkout's ``src``."""
    here = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(3):
        for label, src in (("before", base), ("after", here)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, str(Path(here).parent)]))
            done = subprocess.run([sys.executable, "-m", "benchmarks.plan_perop", "--part",
                                   "passes"], env=env, check=True, capture_output=True,
                                  text=True)
            runs[label].append(json.loads(done.stdout))
    out: dict[str, Any] = {"machine": "2 shared vCPUs, one thread, CPU time (process_time)",
                           "model": "70B-shaped Llama, 4096 tokens, bfloat16, shape-only",
                           "load_1min": [x for r in runs["before"] + runs["after"]
                                         for x in r["load_1min"]]}
    for name in ROLES:
        before = min(r[name]["s_per_layer_pass"] for r in runs["before"])
        after = min(r[name]["s_per_layer_pass"] for r in runs["after"])
        same = {r[name]["peak_bytes"] for r in runs["before"] + runs["after"]}
        out[name] = {"before_s_per_layer_pass": round(before, 4),
                     "after_s_per_layer_pass": round(after, 4),
                     "speedup": round(before / after, 2), "same_peak": len(same) == 1,
                     "all_before": [round(r[name]["s_per_layer_pass"], 4)
                                    for r in runs["before"]],
                     "all_after": [round(r[name]["s_per_layer_pass"], 4) for r in runs["after"]]}
    print(json.dumps(out, indent=2))
    if path:
        Path(path).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    """Parse the arguments and run the part asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("passes", "split"))
    parser.add_argument("--compare", metavar="BASE_SRC")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.json)
        return
    out = split() if args.part == "split" else passes()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
