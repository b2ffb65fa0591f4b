"""Where a serving plan's predicted decode step goes: host against device, per tensor-parallel
degree and batch (docs/plan.md's 8B-shaped serving example on 8 H100s).

For each role asked (tensor-parallel degree x batch) the first and last decode steps of the
example (prompts of 2048 tokens, 256 new tokens) are simulated and their calls' predictions
summed as the plan sums them (:func:`flopscope.plan.serve_time.forward_parts` and
:func:`~flopscope.plan.serve_time.serve_step_time`: on a GPU the longer of the host's sum and the
device's with its all-reduces): per step the operator calls, DTensor's own calls (the
``framework`` family), the collectives, the host and device sums, the call-by-call overlap
(:func:`flopscope.estimate.predict.overlapped`), the roofline bound, the tensor-parallel
all-reduces' time and the host time by family.

Run: ``python -m benchmarks.plan_serve_host [--roles 1x1 1x32 8x1] [--json FILE]`` (one
thread; say the load).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

#: docs/plan.md's 8B-shaped Llama
LLAMA_8B: dict[str, Any] = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=14336,
                                vocab_size=128256, max_position_embeddings=8192)


def step_figures(step: Any, tp: int, links: Any) -> dict[str, Any]:
    """One simulated decode step's calls, host and device."""
    from flopscope.plan.serve_time import forward_parts, serve_step_time

    est = step.estimate
    total = est.total
    device = total.predicted_s - total.host_s
    compute, host = forward_parts(est)
    predicted = serve_step_time(compute, step.communication, step.boundary_bytes, tp, 1, links,
                                "prediction", host=host)
    bound = serve_step_time(forward_parts(est, bound=True)[0], step.communication,
                            step.boundary_bytes, tp, 1, links)
    fams = {k: {"calls": r.calls, "host_us": round(r.host_s * 1e6, 1),
                "device_us": round((r.predicted_s - r.host_s) * 1e6, 1),
                "bound_us": round(r.time_s * 1e6, 1)} for k, r in est.by_family.items()}
    return {"calls": total.calls,
            "framework_calls": est.by_family["framework"].calls
            if "framework" in est.by_family else 0,
            "collectives": sum(c.calls for c in step.communication),
            "host_ms": round(total.host_s * 1e3, 3), "device_ms": round(device * 1e3, 3),
            "overlapped_ms": round(est.overlapped[0] * 1e3, 3) if est.overlapped else None,
            "device_idle_ms": round(est.overlapped[1] * 1e3, 3) if est.overlapped else None,
            "bound_compute_ms": round(total.time_s * 1e3, 3),
            "tp_comm_ms": round(predicted.tp_comm * 1e3, 3),
            "predicted_step_ms": round(predicted.total * 1e3, 3),
            "host_wait_ms": round(predicted.host_wait * 1e3, 3),
            "device_only_ms": round(predicted.device_only * 1e3, 3),
            "before_ms": round((max(total.host_s, device) + predicted.tp_comm) * 1e3, 3),
            "bound_step_ms": round(bound.total * 1e3, 3),
            "host_us_per_call": round(total.host_s / total.calls * 1e6, 2) if total.calls else 0,
            "by_family": fams}


def main() -> None:
    """Simulate the roles asked and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roles", nargs="+", default=["1x1", "1x32", "8x1"],
                        help="TPxBATCH")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--json", default="benchmarks/results/plan_serve_host.json")
    args = parser.parse_args()
    import torch

    from flopscope.estimate import get_hardware
    from flopscope.plan.build import build_model
    from flopscope.plan.serving import simulate_serving
    from flopscope.plan.timing import Links

    torch.set_num_threads(1)
    hw = get_hardware(args.hardware)
    links = Links.of(hw, 8, 8)
    build = build_model("hf:llama", 2048, "bfloat16", LLAMA_8B)

    def model() -> torch.nn.Module:
        return build(1, "none")[0].eval()

    out: dict[str, Any] = {"config": LLAMA_8B, "hardware": args.hardware, "prompt": 2048,
                           "new_tokens": 256, "load_start": os.getloadavg(), "roles": {}}
    for role in args.roles:
        tp, batch = (int(v) for v in role.split("x"))
        start = time.process_time()
        run = simulate_serving(model, tp, batch, 2048, 256, hw)
        out["roles"][role] = {"first": step_figures(run.first, tp, links),
                              "last": step_figures(run.last, tp, links),
                              "cpu_seconds": round(time.process_time() - start, 1)}
        short = {k: v for k, v in out["roles"][role]["first"].items() if k != "by_family"}
        print(role, json.dumps(short), flush=True)
    out["load_end"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
