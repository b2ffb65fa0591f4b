"""AdamW's for-loop step on this machine, measured in a fresh process against flopscope's
prediction, with the heap's replay started at glibc's largest mmap threshold (as shipped) and
at smaller ones (issue 31's update, docs/distributed.md run 5).

Beside it (:func:`tiny_update`), the same step over 39 tiny parameters, plain and as DTensors:
what the prediction leaves out when the operators do no work (Python between them); and
(:func:`shard_update`) over an FSDP 2 rank's DTensor shards of the model, alone in this process.

The model is the gloo jobs' (:data:`benchmarks.gloo_jobs.CONFIG`, every parameter on one rank,
float32, 1 thread). The step is timed after two (the first makes the moments); the prediction
counts one more step with a :class:`~flopscope.estimate.roofline.CallLog` and prices it with a
calibrated profile. The per-call times of AdamW's ``sqrt`` and division of the second moment at
the largest parameter come from ``torch.profiler`` beside the same calls in a warm loop: the
difference is the pages their fresh outputs fault in.

    PYTHONPATH=src python -m benchmarks.update_faults --profile FILE [--output FILE]

``--training NAME`` (``bert-base``, ``gpt2``, ``llama-style``: the prediction validation's
training steps, :func:`benchmarks.models.transformer_benches`) instead measures that step's minor
page faults in this fresh process (4 steps after 2) against the bytes the heap's replay maps from
each start (:func:`training_faults`): the replay's own check, independent of any time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.results_file import append_run

THRESHOLDS = (32 << 20, 4 << 20, 128 << 10)
"""Starts of the heap's replay: glibc's largest mmap threshold (flopscope's), and two below."""


def _timed(fn: Any, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure(profile: Path, *, config: dict[str, Any] | None = None,
            samples: int = 15) -> dict[str, Any]:
    """One run: the measured step, the predictions per replay start, the largest parameter's
    ``sqrt`` and division in the step and in a warm loop."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.gloo_jobs import CONFIG
    from flopscope.core.counter import Counter
    from flopscope.estimate import Estimate, load_hardware
    from flopscope.estimate.roofline import CallLog

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**(config or CONFIG)))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=False)
    opt.step()
    opt.step()
    step_s = _timed(opt.step, samples)
    hardware = load_hardware(profile)[0]
    log = CallLog()
    with Counter(warn=False, observers=[log]):
        opt.step()
    predictions = {}
    for threshold in THRESHOLDS:
        for rec, faulted in zip(log.records, log.faulted_bytes(threshold), strict=True):
            rec.faulted = faulted
        est = Estimate.from_records(log.records, hardware, tf32=False, tf32_convolution=False)
        predictions[str(threshold)] = {"predicted_s": est.total.predicted_s,
                                       "faulted_bytes": sum(r.faulted for r in log.records)}
    largest = max(params, key=lambda p: p.numel())
    per_call = _largest_calls(opt, largest.numel())
    second = opt.state[largest]["exp_avg_sq"]
    root = second.sqrt()
    warm = {"sqrt": statistics.median(_timed(second.sqrt, samples)),
            "div": statistics.median(_timed(lambda: root / 0.97, samples))}
    median = statistics.median(step_s)
    return {"parameters": len(params), "elements": sum(p.numel() for p in params),
            "largest_elements": largest.numel(), "profile": profile.name,
            "step_s": step_s, "step_median_s": median,
            "predicted": {k: {**v, "ratio": v["predicted_s"] / median}
                          for k, v in predictions.items()},
            "largest_in_step_s": per_call, "largest_warm_loop_s": warm}


def training_faults(name: str, *, steps: int = 4) -> dict[str, Any]:
    """A training step's measured minor page faults (bytes: faults x 4 KiB) in this process
    against the bytes the heap's replay maps from each start in :data:`THRESHOLDS`."""
    import resource

    from benchmarks.models import transformer_benches
    from benchmarks.prediction_validation import _step
    from flopscope.core.counter import Counter
    from flopscope.estimate.heap import PAGE
    from flopscope.estimate.roofline import CallLog

    torch.set_num_threads(1)
    torch.manual_seed(0)
    bench = {b.name: b for b in transformer_benches()}[name]
    cpu = torch.device("cpu")
    run = _step(bench.build(cpu), bench.inputs(cpu), True)
    for _ in range(2):
        run()
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        run()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    log = CallLog()
    with Counter(warn=False, observers=[log]):
        run()
    return {"model": name, "measured_faults": faults,
            "measured_bytes_median": statistics.median(faults) * PAGE,
            "replayed_bytes": {str(t): sum(log.faulted_bytes(t)) for t in THRESHOLDS}}


def tiny_update(profile: Path, *, parameters: int = 39, samples: int = 31) -> dict[str, Any]:
    """AdamW's for-loop step over ``parameters`` tiny parameters (8 elements; as DTensors, 16
    sharded over a fake process group of 2), measured (median, thread CPU time) against the
    prediction: with no work in the operators, what is left is Python between them."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from flopscope.distributed.world import fake_world
    from flopscope.estimate import load_hardware

    torch.set_num_threads(1)
    hardware = load_hardware(profile)[0]

    def one(params: list[torch.nn.Parameter]) -> dict[str, float]:
        measured, predicted = _timed_update(params, hardware, samples)
        return {"measured_s": measured, "predicted_s": predicted,
                "unexplained_s_per_parameter": (measured - predicted) / len(params)}

    plain = one([torch.nn.Parameter(torch.randn(8)) for _ in range(parameters)])
    with fake_world(2, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", (2,))
        sharded = one([torch.nn.Parameter(distribute_tensor(torch.randn(16), mesh, [Shard(0)]))
                       for _ in range(parameters)])
    return {"parameters": parameters, "plain": plain, "dtensor": sharded}


def shard_update(profile: Path, *, config: dict[str, Any] | None = None,
                 samples: int = 15) -> dict[str, float]:
    """AdamW's for-loop step over an FSDP 2 rank's shards of the gloo jobs' model (each
    parameter a DTensor sharded over a fake process group of 2), alone in this process,
    measured (median, thread CPU time) against the prediction: the jobs' FSDP 2 update without
    the other rank running beside it."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.gloo_jobs import CONFIG
    from flopscope.distributed.world import fake_world
    from flopscope.estimate import load_hardware

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = [p.shape for p in LlamaForCausalLM(LlamaConfig(**(config or CONFIG))).parameters()]
    with fake_world(2, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", (2,))
        params = [torch.nn.Parameter(distribute_tensor(torch.randn(s), mesh, [Shard(0)]))
                  for s in shapes]
        measured, predicted = _timed_update(params, load_hardware(profile)[0], samples)
    return {"measured_s": measured, "predicted_s": predicted, "ratio": predicted / measured}


def _timed_update(params: list[torch.nn.Parameter], hardware: Any,
                  samples: int) -> tuple[float, float]:
    """(measured, predicted) seconds of AdamW's for-loop step over ``params`` (given random
    gradients): the median thread CPU time of ``samples`` steps after two (the first makes the
    moments), and one more step counted and priced on ``hardware``."""
    from flopscope.core.counter import Counter
    from flopscope.estimate.roofline import CallLog

    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=False)
    opt.step()
    opt.step()
    times = []
    for _ in range(samples):
        start = time.thread_time()
        opt.step()
        times.append(time.thread_time() - start)
    log = CallLog()
    with Counter(warn=False, observers=[log]):
        opt.step()
    return statistics.median(times), log.estimate(hardware).total.predicted_s


def _largest_calls(opt: torch.optim.Optimizer, elements: int) -> dict[str, float]:
    """The median time of ``sqrt`` and ``div`` on ``elements``-element tensors in a step."""
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        for _ in range(5):
            opt.step()
    seen: dict[str, list[float]] = {"sqrt": [], "div": []}
    for event in prof.events():
        name = event.name.removeprefix("aten::")
        shape = event.input_shapes[0] if event.input_shapes else []
        if name in seen and shape and int(torch.tensor(shape).prod()) == elements:
            seen[name].append(event.cpu_time_total * 1e-6)
    return {k: statistics.median(v) for k, v in seen.items() if v}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path,
                        help="a calibrated CPU profile (e.g. comm_validation's)")
    parser.add_argument("--training", metavar="NAME",
                        help="a training step's page faults against the replay's instead")
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "update_faults.json")
    opts = parser.parse_args(argv)
    if opts.training is None and opts.profile is None:
        parser.error("--profile is required (or --training NAME)")
    if opts.training:
        run = training_faults(opts.training)
    else:
        run = measure(opts.profile)
        run["tiny"] = tiny_update(opts.profile)
        run["fsdp_shard"] = shard_update(opts.profile)
    run["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run["load"] = os.getloadavg()[0]
    run["torch"] = torch.__version__
    append_run(opts.output, run)
    print(json.dumps({k: v for k, v in run.items() if k != "step_s"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
