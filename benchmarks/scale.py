"""Scale: shape-only counting of a Llama-2-70B-shaped decoder on the ``meta`` device.

Each (tool, tokens) pair runs in a fresh subprocess (``python -m benchmarks.scale TOOL TOKENS``),
which prints one JSON line: wall time of the count, its CPU time (``process_time``: less moved by
other processes on a shared machine), and peak resident memory above the baseline measured right
after the imports.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                 num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                 max_position_embeddings=32768)
SCALE_TOOLS = ("flopscope", "FlopCounterMode")


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now, VmHWM: peak of this process image).

    ``ru_maxrss`` is not used: Linux carries it over from the parent across fork and exec, so a
    child of a big benchmark process would report the parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # not Linux: best effort


def _rss_kib() -> int:
    return _status_kib("VmRSS")


def worker(tool: str, tokens: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the decoder on ``meta``, count one forward with ``tool``; runs in its own process."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, LlamaConfig

    import flopscope

    baseline = _rss_kib()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**(config or LLAMA_70B))).eval()
        ids = torch.zeros(1, tokens, dtype=torch.long)
    built = _rss_kib()
    start = time.perf_counter()
    cpu = time.process_time()
    if tool == "flopscope":
        macs = flopscope.count(model, ids, warn=False).macs
    elif tool == "FlopCounterMode":
        with FlopCounterMode(display=False) as mode:
            model(ids)
        macs = mode.get_total_flops() // 2
    else:
        raise SystemExit(f"unknown tool {tool!r}")
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu
    peak = _status_kib("VmHWM")
    return {"tool": tool, "tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "macs": int(macs),
            "params": sum(p.numel() for p in model.parameters()),
            "import_rss_mib": baseline / 1024, "model_rss_mib": (built - baseline) / 1024,
            "peak_above_import_mib": (peak - baseline) / 1024}


def measure(tokens: int, repeats: int = 3, config: dict[str, Any] | None = None,
            log: Any = print) -> list[dict[str, Any]]:
    """Every tool, ``repeats`` fresh processes each, alternating tools; all rows."""
    rows = []
    for _ in range(repeats):
        for tool in SCALE_TOOLS:
            cmd = [sys.executable, "-m", "benchmarks.scale", tool, str(tokens)]
            if config is not None:
                cmd.append(json.dumps(config))
            done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                  cwd=Path(__file__).resolve().parent.parent)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            log(f"  {tool:16s} {tokens:6d} tokens  {row['seconds']:6.2f} s  "
                f"+{row['peak_above_import_mib']:.0f} MiB")
            rows.append(row)
    return rows


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(worker(sys.argv[1], int(sys.argv[2]), extra)))
