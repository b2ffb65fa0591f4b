"""Regenerate docs/benchmarks.md: ``.venv/bin/python -m benchmarks.run``.

Sections (``--sections``, default all): ``agreement`` (every tool on every model), ``overhead``
(interleaved single-thread timings), ``scale`` (70B-shaped decoder on meta, fresh processes),
``hotpath`` (flopscope's per-operator cost). Results are kept as JSON under ``benchmarks/results/``;
the agreement sweep resumes from there (``--fresh`` starts over), and the document is always written
from every result present, so one section can be rerun alone. ``--quick`` uses two tiny models and
short runs (what the unit tests do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("agreement", "overhead", "scale", "hotpath")
OVERHEAD_MODELS = ("resnet50", "vit_b_16", "mobilenet_v3_large", "bert-base")
FAST_PATH_MODELS = ("vit_b_16", "vit_b_32")


def load_average() -> str:
    """``uptime``-style load averages (1, 5, 15 min) and the number of CPUs."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    from benchmarks import tools

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {name: v for name, v in tools.available().items()}
    for dist in ("torchvision", "transformers", "timm", "matplotlib"):
        versions[dist] = tools.version(dist)
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": mem_gib, "os": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads_default": torch.get_num_threads(),
            "versions": versions}


def _save(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def run_agreement(results: Path, quick: bool, fresh: bool, log: Any) -> None:
    from benchmarks import agreement, models, tools

    names = [n for n, v in tools.available().items() if v is not None]
    if quick:
        groups = {"agreement_tiny.json": (models.tiny_benches(), False)}
    else:
        fast = [dataclasses.replace(b, device="cpu")
                for b in models.torchvision_benches(list(FAST_PATH_MODELS))]
        groups = {
            "agreement_transformers.json": (models.transformer_benches(), False),
            "agreement_no_grad.json": (fast + models.transformer_benches(), True),
            "agreement_torchvision.json": (models.torchvision_benches(), False),
        }
    for file, (benches, no_grad) in groups.items():
        cache = results / file
        if fresh and cache.exists():
            cache.unlink()
        log(f"agreement -> {file} (load {load_average()})")
        agreement.run(benches, names, cache, no_grad=no_grad, log=log)
        if "fvcore" in names and not no_grad:
            agreement.fvcore_on_cpu(benches, cache, log=log)


def run_overhead(results: Path, quick: bool, rounds: int, log: Any) -> None:
    from benchmarks import models, overhead, tools

    names = [n for n, v in tools.available().items() if v is not None]
    if quick:
        benches = models.tiny_benches()[:1]
    else:
        by_name = {b.name: b for b in models.torchvision_benches(list(OVERHEAD_MODELS))
                   + models.transformer_benches()}
        benches = [by_name[n] for n in OVERHEAD_MODELS]
    rows = []
    load_before = load_average()
    for bench in benches:
        log(f"overhead {bench.name} (load {load_average()})")
        rows.append(overhead.measure(bench, names, rounds, log=log))
    _save(results / "overhead.json", {"rows": rows, "load_before": load_before,
                                      "load_after": load_average(), "rounds": rounds})


def run_scale(results: Path, quick: bool, log: Any) -> None:
    from benchmarks import scale

    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
    rows = []
    load_before = load_average()
    for tokens in ((64,) if quick else (2048, 32768)):
        log(f"scale {tokens} tokens (load {load_average()})")
        rows += scale.measure(tokens, repeats=1 if quick else 3, config=tiny if quick else None,
                              log=log)
    _save(results / "scale.json", {"rows": rows, "load_before": load_before,
                                   "load_after": load_average(), "quick": quick})


def run_hotpath(results: Path, quick: bool, log: Any) -> None:
    cmd = [sys.executable, "-m", "benchmarks.hotpath"] + (["--quick"] if quick else [])
    rows = []
    for _ in range(1 if quick else 3):  # fresh processes; the minimum per field is reported
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    log(f"hotpath: {min(r['flopscope_us_per_op'] for r in rows):.1f} us per operator call")
    _save(results / "hotpath.json", {"rows": rows, "load": load_average()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated sections to (re)measure; 'none' only rewrites the doc")
    parser.add_argument("--quick", action="store_true", help="tiny models, short runs")
    parser.add_argument("--fresh", action="store_true", help="discard cached agreement results")
    parser.add_argument("--rounds", type=int, default=9, help="overhead rounds (default 9)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    sections = [] if args.sections == "none" else [s.strip() for s in args.sections.split(",")]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")

    import warnings

    warnings.simplefilter("ignore")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rounds = min(args.rounds, 3) if args.quick else args.rounds
    if "agreement" in sections:
        run_agreement(args.results, args.quick, args.fresh, log)
    if "overhead" in sections:
        run_overhead(args.results, args.quick, rounds, log)
    if "scale" in sections:
        run_scale(args.results, args.quick, log)
    if "hotpath" in sections:
        run_hotpath(args.results, args.quick, log)
    _save(args.results / "machine.json", {**machine(), "load_at_write": load_average()})

    from benchmarks import document

    document.write(args.results, args.out)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
