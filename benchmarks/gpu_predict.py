"""The calibrated GPU prediction against measured GPU time (issues 28 and 29): the ``predict`` part
of ``benchmarks/gpu_check.py``.

The profile is calibrated before any model runs: when this run's ``calib`` part is complete its
points make the profile (``benchmarks/gpu_profile.py``, written beside the results), otherwise the
shipped ``docs/gpu/h200_calibrated.json``. No model below is among the calibration workloads
(matrix products, streaming operators, SDPA and convolutions of fixed shapes, tiny eager calls).

Per case (the forward of torchvision classifiers at batch 1 and 32, float32; a training step with
AdamW of resnet50, BERT-base, GPT-2 small and a 4-layer Llama-style model, and that Llama in
bfloat16; held out, ``HELD_OUT``: 14 other classifiers at batch 8, BERT-base and GPT-2 forwards
and a GPT-2 bfloat16 training step):

- measured: the run's own time without a profiler (median of 10 after 3 warm-ups, synchronized):
  eager, and an inference forward replayed as a CUDA graph (no host launches);
- the prediction: ``flopscope.profile`` with the calibrated profile (each call's predicted host
  and device time), the step being the host and device timelines overlapping
  (``flopscope.estimate.predict.overlapped``); the roofline bound beside it;
- per family: the calls' predicted device time against their kernels' measured device time (the
  profile joins kernels to operator calls), so an error can be placed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flopscope
from benchmarks.errors import abs_errors
from benchmarks.gpu_calib import captured
from benchmarks.gpu_models import free, hf_model
from benchmarks.prediction_validation import cost_family
from flopscope.estimate import load_hardware
from flopscope.estimate.predict import overlapped
from flopscope.estimate.profile import Hardware

SHIPPED = Path(__file__).parent.parent / "docs" / "gpu" / "h200_calibrated.json"
VISION = ["resnet18", "resnet50", "mobilenet_v3_large", "mobilenet_v2", "efficientnet_b0",
          "vit_b_16", "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1",
          "densenet121", "mnasnet1_0", "googlenet", "alexnet"]
# not in the first GPU run's cases (the run after which the GPU calibration gained its graph-
# timed points, module and host-per-operator times), at a batch size it did not use: the error
# measured on workloads nothing was changed after
HELD_OUT = ["resnet34", "resnet101", "wide_resnet50_2", "resnext50_32x4d", "mobilenet_v3_small",
            "efficientnet_b1", "regnet_x_800mf", "vit_b_32", "swin_t", "shufflenet_v2_x0_5",
            "squeezenet1_0", "mnasnet0_5", "densenet169", "vgg11"]
Case = tuple[str, int, bool, str, bool]  # model, batch, train, dtype, held out


def walls(model: nn.Module, x: torch.Tensor, train: bool, device: str) -> dict[str, float]:
    """The run's own time without any profiler, median of 10 after 3 warm-ups (min and max
    beside): eager, and (an inference forward on CUDA) replayed as a CUDA graph (no host
    launches): what the prediction is checked against, and how much of an eager run the host
    costs. Without CUDA (the dry mode: the logic on tiny CPU shapes) median of 3 after 1."""
    cuda = device == "cuda"
    warmups, repeats = (3, 10) if cuda else (1, 3)
    opt = torch.optim.AdamW(model.parameters()) if train else None

    def step() -> None:
        if opt is not None:
            opt.zero_grad(set_to_none=True)
            model(x).sum().backward()
            opt.step()
        else:
            with torch.no_grad():
                model(x)

    def timed(fn: Callable[[], Any], name: str) -> dict[str, float]:
        for _ in range(warmups):
            fn()
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return {f"{name}_s": statistics.median(times), f"{name}_min_s": min(times),
                f"{name}_max_s": max(times)}

    model.train(train)
    out = timed(step, "eager")
    if cuda and not train:
        with torch.no_grad():
            graph = captured(lambda: model(x), warmups=3)
        out.update(timed(graph.replay, "graph"))
    return out


def cases(dry: bool) -> list[Case]:
    if dry:
        return [("resnet18", 1, False, "float32", False), ("llama", 1, True, "bfloat16", False),
                ("squeezenet1_0", 2, False, "float32", True)]
    vision = [(m, b, False, "float32", False) for b in (1, 32) for m in VISION]
    held = [(m, 8, False, "float32", True) for m in HELD_OUT]
    return [*vision, ("resnet50", 32, True, "float32", False), ("bert", 8, True, "float32", False),
            ("gpt2", 4, True, "float32", False), ("llama", 4, True, "float32", False),
            ("llama", 4, False, "bfloat16", False), ("llama", 4, True, "bfloat16", False),
            *held, ("bert", 32, False, "float32", True), ("gpt2", 8, False, "bfloat16", True),
            ("gpt2", 2, True, "bfloat16", True)]


def build(case: Case, device: str, dry: bool) -> tuple[nn.Module, torch.Tensor]:
    import torchvision

    name, batch, _, dtype, _ = case
    if name in ("bert", "gpt2", "llama"):
        model, ids = hf_model(name, dry, device)
        x = ids.repeat(batch, 1)
    else:
        model = torchvision.models.get_model(name).to(device)
        size = 64 if dry else 224
        x = torch.randn(batch, 3, size, size, device=device)
    return model.to(getattr(torch, dtype)), x


def profile_for(out: Path | None, dry: bool) -> tuple[Hardware, str, dict[str, Hardware]]:
    """The calibrated profile to predict with: made from this run's complete ``calib`` part when
    there is one (written to ``out/<profile>_calibrated.json``), else the shipped H200 one; and, where
    that calib has the host time of mixed operators, the profiles it makes without them
    (:func:`baseline_profiles`)."""
    import json

    calib = out / "calib.json" if out is not None else None
    if not dry and calib is not None and calib.exists() and json.loads(
            calib.read_text()).get("complete"):
        from benchmarks.gpu_profile import main as make_profile
        from benchmarks.gpu_profile import profile_file

        made = calib.parent / profile_file(json.loads((calib.parent / "summary.json").read_text()))
        try:
            if make_profile([str(calib), str(made)]) == 0:
                (hw,) = load_hardware(made)
                return (hw, f"made from this run's calib part ({made.name})",
                        baseline_profiles(calib))
        except Exception as e:  # noqa: BLE001 - the shipped profile still predicts
            print(f"[gpu_predict] no profile from {calib}: {type(e).__name__}: {e}", flush=True)
    (hw,) = load_hardware(SHIPPED)
    return hw, f"shipped {SHIPPED.relative_to(SHIPPED.parent.parent.parent)}", {}


def baseline_profiles(calib: Path) -> dict[str, Hardware]:
    """The profiles a calib makes without some of its groups of mixed-operator host time
    (:func:`benchmarks.gpu_profile.baselines`: ``loop_host``, tight-loop host times and no
    chains, the profiles before them; ``rotation_only``, no chains), to predict beside the full
    one against the same measured times (the device's host varies between runs); none where
    the calib has no such group (``summary.json`` beside it, as ``benchmarks/gpu_profile.py``
    reads it)."""
    import json

    from benchmarks.gpu_profile import baselines, calibrated

    raw = json.loads(calib.read_text())
    summary = json.loads((calib.parent / "summary.json").read_text())
    return {name: calibrated(part, summary) for name, part in baselines(raw).items()}


def _predicted(timing: Any) -> tuple[list[tuple[Any, Any]], float, float]:
    """A profile's calls with their predictions, and the step (host and device overlapping):
    (calls, step seconds, the device's idle seconds)."""
    calls = [(c, c.bound) for c in timing.calls if c.bound is not None]
    step, idle = overlapped((b.host_s, b.predicted_s - b.host_s) for _, b in calls)
    return calls, step, idle


def predict_one(model: nn.Module, x: torch.Tensor, train: bool, hw: Hardware,
                dry: bool, baselines: dict[str, Hardware] | None = None) -> dict[str, Any]:
    """The profile's calls predicted and measured: the step (host and device overlapping), sums,
    and per family the predicted against the measured device time of the joined calls; for
    each of ``baselines`` (name -> profile), its step and host time for the same calls (one
    more profiled run each, for its predictions only)."""
    _, timing = flopscope.profile(model, x, train=train, hardware=hw, warmup=0 if dry else 2,
                                  repeat=1 if dry else 3)
    calls, step, idle = _predicted(timing)
    fams: dict[str, dict[str, float]] = {}
    for c, b in calls:
        f = fams.setdefault(cost_family(c.op, c.cost), {
            "calls": 0, "predicted_device_s": 0.0, "measured_s": 0.0, "bound_s": 0.0,
            "uncalibrated_calls": 0})
        f["calls"] += 1
        f["bound_s"] += b.time_s
        if c.seconds is not None:  # joined to its kernels: compare the same calls
            f["predicted_device_s"] += b.predicted_s - b.host_s
            f["measured_s"] += c.seconds
        if b.uncalibrated_s:
            f["uncalibrated_calls"] += 1
    return {"predicted_step_s": step, "predicted_device_idle_s": idle,
            "predicted_host_s": sum(b.host_s for _, b in calls),
            "predicted_device_s": sum(b.predicted_s - b.host_s for _, b in calls),
            "bound_s": sum(b.time_s for _, b in calls), "calls": len(timing.calls),
            "unmatched": timing.unmatched, "profile_wall_s": timing.wall_s,
            "kernels_s": sum(c.seconds or 0.0 for c in timing.calls),
            "outside_s": timing.outside_s, "families": fams,
            **{name: _baseline(model, x, train, b) for name, b in (baselines or {}).items()}}


def _baseline(model: nn.Module, x: torch.Tensor, train: bool, hw: Hardware) -> dict[str, float]:
    """The step and host time ``hw`` predicts for the model's calls."""
    _, timing = flopscope.profile(model, x, train=train, hardware=hw, warmup=0, repeat=1)
    calls, step, _ = _predicted(timing)
    return {"predicted_step_s": step, "predicted_host_s": sum(b.host_s for _, b in calls)}


def part_predict(device: str, dry: bool, out: Path | None = None) -> dict[str, Any]:
    import json

    hw, source, baselines = profile_for(out, dry)
    calibrated = hw.calibration.date if hw.calibration is not None else None  # which profile
    rows: list[dict[str, Any]] = []
    for case in cases(dry):
        name, batch, train, dtype, held_out = case
        row: dict[str, Any] = {"model": name, "batch": batch, "train": train, "dtype": dtype,
                               "held_out": held_out}
        start = time.perf_counter()
        try:
            model, x = build(case, device, dry)
            row.update(predict_one(model, x, train, hw, dry, baselines))
            row.update(walls(model, x, train, device))
            row["ratio"] = row["predicted_step_s"] / row["eager_s"]
            for name in baselines:
                row[name]["ratio"] = row[name]["predicted_step_s"] / row["eager_s"]
            if "graph_s" in row:
                row["device_ratio"] = row["predicted_device_s"] / row["graph_s"]
            row["bound_holds"] = row["eager_min_s"] >= row["bound_s"]
            del model, x
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        row["seconds"] = round(time.perf_counter() - start, 2)
        rows.append(row)
        free()
        if out is not None:  # each row as it finishes: a run cut short keeps what it measured
            (out / "predict.json").write_text(json.dumps(
                {"profile": source, "calibrated": calibrated, "rows": rows}, indent=2) + "\n")
    result: dict[str, Any] = {
        "profile": source, "calibrated": calibrated, "rows": rows,
        "seen": abs_errors(r["ratio"] for r in rows if "ratio" in r and not r["held_out"]),
        "held_out": abs_errors(r["ratio"] for r in rows if "ratio" in r and r["held_out"])}
    for base in baselines:  # the same cases and eager times, by a profile without some groups
        for name, held in (("seen", False), ("held_out", True)):
            result[f"{name}_{base}"] = abs_errors(
                r[base]["ratio"] for r in rows if "ratio" in r and r["held_out"] is held)
    return result
