"""What the prediction of a generation's steps was validated on, in words: the figures of the
decode validation (``benchmarks/decode_validation.py``: real prefills and decode steps with a
KV cache of small transformers decoders against their prediction), shipped in
``estimate/data/decode_validation.json`` per device kind: ``cpu`` by that benchmark's
``--ship``, ``cuda`` by ``benchmarks/gpu_serve.py --ship`` (the serving planner's steps of
Llama-shaped 1B and 8B decoders on a lent H200, docs/gpu.md); nothing here is typed by hand.

A prediction on a device kind the validation did not run on says so.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["FORWARDS", "decode_figures", "device_kind", "serving_validated_on", "step_words"]

DATA = Path(__file__).parent / "data" / "decode_validation.json"

FORWARDS = ("validated on forwards and training steps (torchvision classifiers, BERT-base, "
            "GPT-2, a Llama-style decoder)")
"""What every calibrated prediction's error bar was measured on (docs/prediction.md)."""


@lru_cache(maxsize=1)
def _shipped() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DATA.read_text()) if DATA.exists() else {}
    return found


def device_kind(device: str) -> str:
    """``"cuda"`` for a calibration's device string naming CUDA (``"cuda (NVIDIA H200)"``),
    else ``"cpu"``."""
    return "cuda" if device.startswith("cuda") else "cpu"


def decode_figures(kind: str) -> dict[str, Any] | None:
    """The shipped decode validation of a device kind (``"cpu"``, ``"cuda"``): its date,
    threads, workloads, models, load, and the ``prefill`` and ``decode`` error statistics
    (``median_abs_error``, ``p90_abs_error``, ``median_ratio``, ``n``); ``None`` where none
    was run."""
    found = _shipped().get(kind)
    return dict(found) if found is not None else None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _errors(name: str, stats: dict[str, Any]) -> str:
    return (f"{name} median error {_pct(stats['median_abs_error'])}, 90th percentile "
            f"{_pct(stats['p90_abs_error'])}")


def step_words(figures: dict[str, Any]) -> str:
    """One validation's figures in words: where, when, on what, and the prefill's and decode
    step's (and, where measured, continuous batching's mixed step's) median and
    90th-percentile errors. A CPU's run names its threads and load; a GPU's its device and
    the decoders' sizes (``benchmarks/gpu_serve.py``)."""
    prompts, batches = figures["prompts"], figures["batches"]
    if "threads" in figures:
        lo, hi = figures["load"]
        where = (f"{figures['date']}, {figures['threads']} thread(s), {figures['workloads']} "
                 f"generations of {len(figures['models'])} small decoders at batch "
                 f"{' and '.join(str(b) for b in batches)}, prompts {prompts[0]}-"
                 f"{prompts[-1]}, load {lo:.1f}-{hi:.1f}")
    else:
        where = (f"{figures['date']}, {figures['device'].partition('(')[2].rstrip(')')}, "
                 f"{figures['workloads']} workloads of {', '.join(figures['models'])} in "
                 f"{figures['dtype']} at batch {'-'.join(str(b) for b in (batches[0], batches[-1]))}"
                 f", prompts {prompts[0]}-{prompts[-1]}")
    words = [_errors("prefill", figures["prefill"]), _errors("decode step", figures["decode"])]
    if "mixed" in figures:
        words.append(_errors("continuous batching's step", figures["mixed"]))
    return f"{where}: {'; '.join(words)}"


def serving_validated_on(device: str) -> str:
    """What a serving prediction's error bar was measured on, for a calibration of ``device``
    (its :attr:`~flopscope.estimate.Calibration.device`): forwards and training steps, and the
    decode validation of that device kind where one shipped; a GPU's decode step unvalidated
    otherwise (with the CPU's figures beside, where they exist)."""
    kind = device_kind(device)
    own = decode_figures(kind)
    if own is not None:
        where = "a CPU" if kind == "cpu" else "a GPU"
        return f"{FORWARDS}; prefill and decode steps with a KV cache measured on {where} " \
               f"({step_words(own)})"
    cpu = decode_figures("cpu") if kind == "cuda" else None
    if cpu is not None:
        return (f"{FORWARDS}; a decode step with a KV cache is not validated on a GPU (on a "
                f"CPU: {step_words(cpu)})")
    return (f"{FORWARDS}, not on a decode step with a KV cache (its matrix products of a few "
            "rows are among the calibration's microbenchmarks: M = 1-128)")
