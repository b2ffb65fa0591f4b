"""The serving planner's steps measured on a GPU (issue 31: serving on a GPU, never validated):
the GPU check's ``serve`` part measures, this module then predicts, here, on the CPU.

``flopscope plan --serve`` prices each serving role by four simulated forwards on ``meta``
(:func:`flopscope.plan.serving.simulate_serving`): the prefill, the first and the last decode
steps (transformers' ``DynamicCache``, as ``generate`` runs them) and continuous batching's mixed
step (:func:`flopscope.llm.engine.engine_step`, as a serving engine runs it). The ``serve`` part
(``python -m benchmarks.gpu_check --parts serve``) runs the same four forwards of Llama-shaped
decoders in bfloat16 for real on the GPU, each timed eagerly by the wall clock with the device
synchronised before and after (two warm-ups, then the median of ``REPEAT``), and writes
``serve.json``. Nothing is predicted on the device (it is CPU work):

    PYTHONPATH=src:. python -m benchmarks.gpu_serve docs/gpu/serve.json [--hardware h200]

predicts every measured step with the shipped reference of the device that ran them (what
``--hardware h200`` gives a user: no serving workload is among its calibration's points) and
writes ``serve_predicted.json`` beside it: per step the predicted seconds (host and device
overlapping), the roofline bound, and predicted / measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_validation import build

STEPS = ("prefill", "first", "last", "mixed")
"""The serving role's forwards, as :class:`flopscope.plan.serving.ServeRun` names them."""
REPEAT = 5
TOP = 10
"""The kernels named per step (by their summed device time)."""


def llama(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int) -> Any:
    """A Llama config of those sizes (random weights: no download)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, intermediate_size=mlp, vocab_size=vocab,
                       max_position_embeddings=8192)


def workloads(dry: bool) -> list[dict[str, Any]]:
    """(name, config maker, batch, prompt, new tokens): Llama-3-shaped 1B and 8B decoders at the
    docs' serving example's prompt and generation (2,048 and 256) and a shorter one; dry: a tiny
    decoder on the CPU (the code path only)."""
    if dry:
        return [{"model": "tiny", "sizes": (64, 2, 4, 2, 128, 256), "batch": b, "prompt": 16,
                 "new_tokens": 8} for b in (1, 2)]
    one_b, eight_b = (2048, 16, 32, 8, 8192, 128256), (4096, 32, 32, 8, 14336, 128256)
    return ([{"model": "llama-1b", "sizes": one_b, "batch": b, "prompt": 512, "new_tokens": 64}
             for b in (1, 32)]
            + [{"model": "llama-8b", "sizes": eight_b, "batch": b, "prompt": 2048,
                "new_tokens": 256} for b in (1, 8, 32)])


def step_plan(prompt: int, new_tokens: int) -> dict[str, tuple[int, int]]:
    """Each step as (cache positions it starts from, new positions per sequence), as the
    serving role's loop runs them (:func:`flopscope.plan.serving._forwards`): the last decode
    step after the prefill, the first step and the catch-up chunk of ``new_tokens - 3``."""
    from flopscope.plan.serving import middle, mixed_chunk

    return {"prefill": (0, prompt), "first": (prompt, 1),
            "last": (prompt + 1 + max(0, new_tokens - 3), 1),
            "mixed": (middle(prompt, new_tokens), mixed_chunk(prompt, new_tokens))}


def time_step(model: Any, config: Any, batch: int, start: int, new: int, engine: bool,
              repeat: int, device: str) -> dict[str, Any]:
    """Wall seconds of ``repeat`` forwards of ``new`` positions per sequence, each on the same
    cache of ``start`` positions (prefilled once; each step given the prefill's contiguous
    layers again, as ``generate``'s cat leaves them, not a cropped view), after two warm-ups;
    under :func:`flopscope.llm.engine.engine_step` where ``engine``. On CUDA one more forward under
    ``torch.profiler`` gives the device's busy time (its kernels' durations summed: what a CUDA
    graph's replay would take without the gaps the host leaves)."""
    from contextlib import nullcontext

    from transformers import DynamicCache

    from flopscope.estimate.timers import clock
    from flopscope.llm.engine import engine_step
    from flopscope.llm.kv_cache import cache_keyword
    from flopscope.timing.join import device_events
    from flopscope.timing.run import recording

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    now: Callable[[], float] = clock(device)[1]
    vocab = int(config.vocab_size)
    ids = torch.randint(vocab, (batch, new), device=device)
    cache: Any = DynamicCache(config=config)
    held: list[tuple[Any, Any]] = []  # the prefilled cache's layers, contiguous as generate's
    keyword = cache_keyword(model)

    def once(profile: bool = False) -> tuple[float, Any]:
        nonlocal cache
        if not start:
            cache = DynamicCache(config=config)
        for layer, (k, v) in zip(cache.layers, held, strict=True) if held else ():
            layer.keys, layer.values = k, v  # the step's cat leaves them as they were
        with (engine_step(model, cache, new, start) if engine else nullcontext(),
              recording(True) if profile else nullcontext() as prof):
            sync()  # a serving engine's room is made above, outside the step
            begin = now()
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache})
            sync()
            took = now() - begin
        return took, prof

    with torch.no_grad():
        if start:
            model(input_ids=torch.randint(vocab, (batch, start), device=device),
                  use_cache=True, logits_to_keep=1, **{keyword: cache})
            held = [(layer.keys, layer.values) for layer in cache.layers]
        times = [once()[0] for _ in range(2 + repeat)][2:]
        out: dict[str, Any] = {"start": start, "new": new,
                               "measured_s": statistics.median(times), "runs_s": times}
        if cuda:
            try:
                prof = once(profile=True)[1]
                kernels = device_events(prof.events())
                by_name: dict[str, list[float]] = {}
                for e in kernels:
                    by_name.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e6)
                top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP]
                out.update(device_s=sum(e.time_range.elapsed_us() for e in kernels) / 1e6,
                           kernels=len(kernels),
                           top_kernels=[{"name": k[:160], "calls": len(v), "seconds": sum(v)}
                                        for k, v in top])
            except Exception as e:  # noqa: BLE001 - a side figure: the wall times are kept
                out["device_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def _built(config: Any, device: str, dtype: torch.dtype) -> Any:
    """The decoder of ``config`` on ``device``, its weights made in ``dtype``."""
    was = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return build(config, device)
    finally:
        torch.set_default_dtype(was)


def part_serve(device: str, dry: bool) -> dict[str, Any]:
    """The GPU check's ``serve`` part: every workload's four steps measured (the module's
    docstring)."""
    from benchmarks.gpu_models import free

    rows = []
    dtype = torch.float32 if dry else torch.bfloat16
    repeat = 1 if dry else REPEAT
    for w in workloads(dry):
        row = {**w, "dtype": str(dtype).removeprefix("torch."), "repeat": repeat}
        try:
            torch.manual_seed(0)
            config = llama(*w["sizes"])
            model = _built(config, device, dtype)
            for step, (start, new) in step_plan(w["prompt"], w["new_tokens"]).items():
                row[step] = time_step(model, config, w["batch"], start, new, step == "mixed",
                                      repeat, device)
            del model
        except Exception as e:  # noqa: BLE001 - one workload failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        free()
        print(json.dumps(row), file=sys.stderr, flush=True)  # kept in the log if cut short
        print(f"[serve] {w['model']} batch {w['batch']}: "
              + ", ".join(f"{s} {row[s]['measured_s'] * 1e3:.2f} ms" for s in STEPS if s in row),
              file=sys.stderr, flush=True)
    return {"rows": rows, "timing": "eager wall clock, device synchronised before and after"}


def predict(measured: dict[str, Any], hardware: str) -> dict[str, Any]:
    """Every measured workload's steps predicted on ``hardware`` by the serving role's
    simulation (tensor parallelism 1), beside their measured times."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.serve_time import forward_parts, forward_seconds
    from flopscope.plan.serving import simulate_serving

    hw = get_hardware(hardware)
    rows = []
    for w in measured["rows"]:
        if "error" in w:
            rows.append(w)
            continue
        config, dtype = llama(*w["sizes"]), getattr(torch, w["dtype"])
        begin = time.perf_counter()
        run = simulate_serving(lambda config=config, dtype=dtype: _built(config, "meta", dtype),
                               1, w["batch"], w["prompt"], w["new_tokens"], hw)
        row = {k: w[k] for k in ("model", "batch", "prompt", "new_tokens", "dtype")}
        for step in STEPS:
            est = getattr(run, step).estimate
            predicted_s = forward_seconds(est)
            device_s = forward_parts(est)[0]
            row[step] = {"measured_s": w[step]["measured_s"], "predicted_s": predicted_s,
                         "bound_s": forward_seconds(est, bound=True),
                         "ratio": predicted_s / w[step]["measured_s"],
                         "predicted_device_s": device_s}
            if w[step].get("device_s"):
                row[step].update(measured_device_s=w[step]["device_s"],
                                 device_ratio=device_s / w[step]["device_s"])
        row["simulated_s"] = time.perf_counter() - begin
        rows.append(row)
        print(f"{row['model']:9s} batch {row['batch']:3d}: " + ", ".join(
            f"{s} {row[s]['measured_s'] * 1e3:8.2f} ms (x{row[s]['ratio']:.2f})" for s in STEPS),
            flush=True)
    return {"hardware": hardware, "calibration": hw.calibration.reference
            if hw.calibration else None, "rows": rows}


def shipped(predicted: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The figures ``flopscope``'s words quote for a GPU (the ``cuda`` entry of
    ``estimate/data/decode_validation.json``, beside the CPU's decode validation): the date,
    the device, the workloads, and the error statistics of the prefills, the decode steps
    (first and last) and the mixed steps."""
    from benchmarks.prediction_validation import ratio_stats

    rows = [r for r in predicted["rows"] if "error" not in r]
    measured = next((r["date"] for r in reversed(summary.get("runs", []))
                     if "serve" in r["parts"]), summary["date"])  # docs/gpu's: several runs
    return {"cuda": {
        "date": measured[:10], "measured": measured,
        "device": f"cuda ({summary['device']})", "calibration": predicted["calibration"],
        "dtype": rows[0]["dtype"], "workloads": len(rows),
        "models": sorted({r["model"] for r in rows}),
        "batches": sorted({r["batch"] for r in rows}),
        "prompts": sorted({r["prompt"] for r in rows}),
        "prefill": ratio_stats([r["prefill"]["ratio"] for r in rows]),
        "decode": ratio_stats([r[s]["ratio"] for r in rows for s in ("first", "last")]),
        "mixed": ratio_stats([r["mixed"]["ratio"] for r in rows]),
        "source": "benchmarks/gpu_serve.py"}}


def main(argv: list[str] | None = None) -> int:
    """Predict a ``serve.json``'s steps; write ``serve_predicted.json`` beside it (and, with
    ``--ship``, its figures into ``estimate/data/decode_validation.json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path)
    parser.add_argument("--hardware", default=None,
                        help="the profile to predict with (default: the device's shipped one)")
    parser.add_argument("--ship", action="store_true",
                        help="write the figures flopscope quotes for a GPU's serving steps")
    opts = parser.parse_args(argv)
    from benchmarks.decode_validation import SHIPPED
    from benchmarks.gpu_profile import base_profile

    summary = json.loads((opts.measured.parent / "summary.json").read_text())
    hardware = opts.hardware or base_profile(summary["device"])
    out = predict(json.loads(opts.measured.read_text()), hardware)
    (opts.measured.parent / "serve_predicted.json").write_text(json.dumps(out, indent=1) + "\n")
    if opts.ship:
        have = json.loads(Path(SHIPPED).read_text()) if Path(SHIPPED).exists() else {}
        Path(SHIPPED).write_text(json.dumps({**have, **shipped(out, summary)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
