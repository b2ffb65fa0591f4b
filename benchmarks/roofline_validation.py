"""Roofline on ``this-machine``: the estimate against measured time, per operator.

The machine is shared, and its speed changes from one second to the next, so each case is timed
right after a measurement of the machine (``measure_this_machine``: a 2048^3 GEMM in the case's
dtype and fp32, a 256 MiB sum and copy through main memory, a copy inside the last-level cache
whose capacity the OS reports, the special functions' element rates), ``rounds`` rounds. Every
timing, of a probe or a case, is the best of several runs after a warm-up (``best_seconds``).
Each case is estimated as its timing loop runs it (best of ``repeats`` after a warm-up): counted
twice in a row under one :class:`CallLog`, the second call's records estimated, so the cache
model sees what the first call left in the cache.

Two questions, two statistics:

- the bound: the case's fastest time over every round against its lowest estimate over every
  profile measured in the run (the machine at its best as any probe saw it): ``yes`` when the
  fastest time is at least that estimate, the strictest test of a lower bound;
- tightness: the paired ratio measured / estimate of each round (the case against the profile
  measured right before it, as a user meets the estimate); for the large cases
  (compute-bound GEMMs and convolutions, bandwidth-bound element-wise operators) the median
  round's should be at most 2. A row also gives the lowest paired ratio, the run-to-run spread
  (the larger of max / min - 1 of the case's measured times and of its paired estimates) and
  the 1-minute load average when the fastest time was taken (above the CPU count: contended).

Small cases are listed to show what the roofline ignores (per-call overhead) and what the
cache level covers (working sets that fit in the last-level cache).

One torch thread by default (``--threads``): with two threads on a shared machine, every
parallel region waits at its barrier for the thread that was descheduled, which turns the
machine's load into swings of several times in both the profile and the cases.

``python -m benchmarks.roofline_validation [--out docs/roofline] [--rounds 3] [--threads 1]`` writes
``roofline_validation.json`` and a plot, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import flopscope
from flopscope.estimate import CallLog, Estimate, Hardware, measure_this_machine
from flopscope.estimate.profile import dtype_key
from flopscope.estimate.this_machine import best_seconds


def _cases() -> list[tuple[str, bool, Callable[[], Callable[[], Any]]]]:
    """(name, large, build) where build() makes the inputs and returns the timed call."""

    def mm(m: int, n: int, k: int, dtype: torch.dtype = torch.float32) -> Callable[[], Any]:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        return lambda: torch.mm(a, b)

    def conv(n: int, c: int, hw: int, k: int, o: int) -> Callable[[], Any]:
        x, w = torch.randn(n, c, hw, hw), torch.randn(o, c, k, k)
        return lambda: torch.nn.functional.conv2d(x, w, padding=k // 2)

    # element-wise outputs go to preallocated tensors (out=): a fresh 128 MiB output would be
    # new pages from the OS on every call, whose page faults cost more than the arithmetic
    def binary(numel: int, op: Callable[..., Any]) -> Callable[[], Any]:
        a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
        return lambda: op(a, b, out=c)

    def unary(numel: int, op: Callable[..., Any]) -> Callable[[], Any]:
        a, c = torch.randn(numel), torch.empty(numel)
        return lambda: op(a, out=c)

    def gelu(numel: int) -> Callable[[], Any]:
        a, c = torch.randn(numel), torch.empty(numel)
        return lambda: torch.ops.aten.gelu.out(a, out=c)

    def copy(numel: int) -> Callable[[], Any]:
        a, c = torch.randn(numel), torch.empty(numel)
        return lambda: c.copy_(a)

    def reduce(numel: int) -> Callable[[], Any]:
        a = torch.randn(numel)
        return lambda: torch.sum(a)

    big = 32 * 2**20  # 128 MiB of float32 per operand
    return [
        ("mm 2048x2048x2048 fp32", True, lambda: mm(2048, 2048, 2048)),
        ("mm 4096x4096x1024 fp32", True, lambda: mm(4096, 4096, 1024)),
        ("mm 1024x1024x4096 fp32", True, lambda: mm(1024, 1024, 4096)),
        ("mm 2048x2048x2048 fp64", True, lambda: mm(2048, 2048, 2048, torch.float64)),
        ("mm 512x512x512 fp32", False, lambda: mm(512, 512, 512)),
        ("mm 8192x1x8192 fp32 (GEMV, 256 MiB)", True, lambda: mm(8192, 1, 8192)),
        ("conv 8x64x56x56 3x3 ->64", True, lambda: conv(8, 64, 56, 3, 64)),
        ("conv 8x256x14x14 3x3 ->256", True, lambda: conv(8, 256, 14, 3, 256)),
        ("conv 8x128x28x28 1x1 ->512", True, lambda: conv(8, 128, 28, 1, 512)),
        ("add 32M fp32", True, lambda: binary(big, torch.add)),
        ("mul 32M fp32", True, lambda: binary(big, torch.mul)),
        ("neg 32M fp32", True, lambda: unary(big, torch.neg)),
        ("exp 32M fp32", True, lambda: unary(big, torch.exp)),
        ("tanh 32M fp32", True, lambda: unary(big, torch.tanh)),
        ("gelu 32M fp32", True, lambda: gelu(big)),
        ("copy 32M fp32", True, lambda: copy(big)),
        ("sum 32M fp32", True, lambda: reduce(big)),
        ("add 4K fp32", False, lambda: binary(4096, torch.add)),
        ("add 1M fp32 (12 MiB: in the LLC)", False, lambda: binary(2**20, torch.add)),
        ("sigmoid 1M fp32", False, lambda: unary(2**20, torch.sigmoid)),
    ]


def _merge(profiles: list[Hardware]) -> Hardware:
    """The best of each measured rate over the run, for the JSON header and the table's first
    line (what the machine attained at its best). No estimate uses it: a case's bound is tested
    against its lowest estimate over the profiles actually measured, and its tightness against
    the profile measured right before it."""
    first = profiles[0]

    def best(tables: list[Any]) -> dict[str, float]:
        keys = sorted({k for t in tables for k in t})
        return {k: max(t[k] for t in tables if k in t) for k in keys}

    rates = best([p.vector for p in profiles])
    caches = [p.cache_bandwidth for p in profiles if p.cache_bandwidth]
    writes = [p.write_bandwidth for p in profiles if p.write_bandwidth]
    special = {"fp32": best([p.special["fp32"] for p in profiles if "fp32" in p.special])}
    return Hardware("this-machine", max(p.memory_bandwidth for p in profiles), rates,
                    dict(rates), description=first.description, source=first.source,
                    measured=True, cache_bytes=first.cache_bytes,
                    cache_bandwidth=max(caches) if caches else None,
                    write_bandwidth=max(writes) if writes else None,
                    convolution=best([p.convolution for p in profiles]),
                    special=special if special["fp32"] else {})


def _spread(values: list[float]) -> float:
    """max / min - 1 of positive values (0 for fewer than two)."""
    return max(values) / min(values) - 1 if len(values) > 1 and min(values) > 0 else 0.0


def _steady_state(fn: Callable[[], Any]) -> list[Any]:
    """The records of one call of ``fn`` made right after another, as in the timing loop: what
    the first call touched is what the cache model finds (the estimate of a warm call)."""
    log = CallLog()
    with flopscope.Counter(warn=False, observers=[log]):
        fn()
        first = len(log.records)
        fn()
    return log.records[first:]


def _dtype_key(records: list[Any]) -> str:
    keys = sorted(k for r in records if r.dtype is not None
                  for k in [dtype_key(r.dtype)] if k is not None)
    return keys[0] if keys else "fp32"


def run(repeats: int = 5, rounds: int = 3) -> tuple[Hardware, list[dict[str, Any]]]:
    """Time every case with the machine measured right before it, in ``rounds`` rounds.

    On a shared machine the load changes from one second to the next: a profile measured at a
    busy moment and a case timed at a quiet one (or the other way round) says nothing about
    the model. So each case is paired with a measurement of the machine made just before it
    (its GEMM dtype and fp32, the main-memory copy, the cache copy), and the figure of merit
    is the paired ratio measured / estimate, one per round; a row reports the round with the
    median ratio, and the lowest ratio over the rounds.

    Args:
        repeats: timed runs per case (and per rate) per round.
        rounds: rounds.

    Returns:
        The best rates seen (the profile of the JSON header) and one row per case.
    """
    cases = [(name, large, build()) for name, large, build in _cases()]
    records = {name: _steady_state(fn) for name, _, fn in cases}
    cpus = os.cpu_count() or 1
    profiles: list[Hardware] = []
    paired: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in cases}
    for _ in range(rounds):
        for name, _, fn in cases:
            hw = measure_this_machine(repeats=repeats, dtypes=(_dtype_key(records[name]),))
            profiles.append(hw)
            seconds = best_seconds(fn, repeats)
            est = Estimate.from_records(records[name], hw, tf32=False).total
            paired[name].append({"measured_s": seconds, "estimate": est,
                                 "load_1min": os.getloadavg()[0],
                                 "ratio": seconds / est.time_s if est.time_s else None})
    rows = []
    for name, large, _ in cases:
        taken = sorted(paired[name], key=lambda p: p["ratio"] or 0.0)
        fastest = min(paired[name], key=lambda p: p["measured_s"])
        # the bound's test: the case's fastest time against its lowest estimate over every
        # profile measured in the run (the machine at its best as any probe saw it), the
        # strictest test of a lower bound, each side at its least disturbed
        key = _dtype_key(records[name])
        est = min((Estimate.from_records(records[name], hw, tf32=False).total
                   for hw in profiles if key in hw.matrix), key=lambda row: row.time_s)
        spread = max(_spread([p["measured_s"] for p in taken]),
                     _spread([p["estimate"].time_s for p in taken]))
        rows.append({
            "case": name, "large": large, "flops": est.flops, "bytes": est.bytes,
            "dram_bytes": est.dram_bytes, "intensity": est.intensity, "bound": est.bound,
            "estimate_s": est.time_s, "compute_s": est.compute_s, "memory_s": est.memory_s,
            "measured_s": fastest["measured_s"],
            "ratio": fastest["measured_s"] / est.time_s if est.time_s else None,
            "paired_median": taken[len(taken) // 2]["ratio"], "paired_min": taken[0]["ratio"],
            "paired_max": taken[-1]["ratio"], "spread": spread,
            "load_1min": fastest["load_1min"], "contended": fastest["load_1min"] > cpus,
            "rounds": [{k: v for k, v in p.items() if k != "estimate"} | {
                "estimate_s": p["estimate"].time_s} for p in paired[name]],
        })
    return _merge(profiles), rows


def _held(row: dict[str, Any]) -> str:
    """``yes``: the estimate (on the best rates of the whole run) is at most the case's fastest
    time; ``NO`` otherwise."""
    return "yes" if row["ratio"] is not None and row["ratio"] >= 1 else "NO"


def at_ridge(row: dict[str, Any]) -> bool:
    """Whether a case's compute and memory times are within 2x of each other: near the ridge,
    where time = max(compute, memory) assumes the two overlap completely and a kernel that
    overlaps them less runs up to compute + memory (up to 2x the estimate at the ridge itself)."""
    low, high = sorted((float(row.get("compute_s", 0.0)), float(row.get("memory_s", 0.0))))
    return high > 0 and low >= high / 2


def markdown(hw: Hardware, rows: list[dict[str, Any]]) -> str:
    """The table of estimates against measurements."""
    rates = ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in hw.vector.items())
    if hw.convolution:
        rates += "; 3x3 convolutions " + ", ".join(
            f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in hw.convolution.items())
    for key, table in hw.special.items():
        rates += f"; {key} special functions (G elements/s) " + ", ".join(
            f"{f} {v / 1e9:,.2f}" for f, v in table.items())
    cache = ""
    if hw.cache_bytes and hw.cache_bandwidth:
        cache = (f"; last-level cache {hw.cache_bytes / 2**20:,.0f} MiB at "
                 f"{hw.cache_bandwidth / 1e9:,.1f} GB/s")
    write = ("" if hw.write_bandwidth is None
             else f" read, {hw.write_bandwidth / 1e9:,.2f} GB/s write")
    lines = [f"this-machine, the best of every probe over the run ({hw.description}): {rates}; "
             f"memory bandwidth {hw.memory_bandwidth / 1e9:,.2f} GB/s{write}{cache}", "",
             "| case | FLOP/B | from memory | bound | compute / memory | lowest estimate | "
             "fastest measured | fastest / lowest | paired rounds (median; lowest) | spread | "
             "lower bound | within 2x | load |",
             "| :--- | ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | "
             ":---: | ---: |"]
    for r in rows:
        ratio = r["ratio"]
        intensity = "-" if r["intensity"] is None else f"{r['intensity']:.2f}"
        median = r["paired_median"]
        within = ("yes" if median is not None and median <= 2 else "no") if r["large"] else "(small)"
        if r["large"] and at_ridge(r):
            serial = r["measured_s"] / (r["compute_s"] + r["memory_s"])
            within += f" (ridge; {serial:.2f}x compute + memory)"
        share = f"{r['dram_bytes'] / r['bytes']:.0%}" if r["bytes"] else "-"
        load = f"{r['load_1min']:.1f}" + (" (contended)" if r["contended"] else "")
        split = (f"{r['compute_s'] / r['memory_s']:.2f}" if r.get("memory_s") else "-")
        lines.append(
            f"| {r['case']} | {intensity} | {share} | {r['bound']} | {split} | "
            f"{r['estimate_s'] * 1e3:.4f} ms | {r['measured_s'] * 1e3:.4f} ms | {ratio:.2f} | "
            f"{r['paired_median']:.2f}; {r['paired_min']:.2f} | {r.get('spread', 0.0):.1%} | "
            f"{_held(r)} | {within} | {load} |")
    bounded = sum(1 for r in rows if _held(r) == "yes")
    paired = sum(1 for r in rows if r["paired_min"] is not None and r["paired_min"] >= 1)
    large = [r for r in rows if r["large"]]
    close = sum(1 for r in large if r["paired_median"] is not None and r["paired_median"] <= 2)
    lines += ["", f"Bounded (estimate on the run's best rates <= the case's fastest time): "
              f"{bounded} of {len(rows)} cases; bounded in every paired round as well: {paired}. "
              f"Large cases within 2x (paired, median round): {close} of {len(large)}."]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Estimated against measured time, log-log over whole decades, with the y = x (a bound holds
    above it) and y = 2x lines (the shared axes of :mod:`benchmarks.plotting`)."""
    from benchmarks.plotting import MISSING, counted_vs_measured_axes, pyplot, save

    plt = pyplot()
    if plt is None:
        raise SystemExit(MISSING)
    fig, ax = plt.subplots(figsize=(7, 6), dpi=120)
    lo, hi = counted_vs_measured_axes(
        ax, [v for r in rows for v in (r["estimate_s"], r["measured_s"])],
        title="blue: compute-bound, orange: memory-bound; x: small cases",
        xlabel="roofline estimate on this-machine (s)", ylabel="measured (s)")
    ax.plot([lo, hi / 2], [2 * lo, hi], color="0.5", linestyle=":", linewidth=1,
            label="measured = 2 x estimate")
    for r in rows:
        colour = "tab:blue" if r["bound"] == "compute" else "tab:orange"
        marker = "o" if r["large"] else "x"
        ax.scatter(r["estimate_s"], r["measured_s"], color=colour, marker=marker)
        ax.annotate(r["case"], (r["estimate_s"], r["measured_s"]), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    ax.legend(fontsize=8)
    save(plt, fig, path, dpi=120)


def _without_onednn(fn: Callable[[torch.Tensor, torch.Tensor], Any],
                    ) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """``fn`` run with oneDNN off (``torch.backends.mkldnn``): ATen's own kernel instead."""
    def call(x: torch.Tensor, out: torch.Tensor) -> Any:
        with torch.backends.mkldnn.flags(enabled=False):
            return fn(x, out)
    return call


def arrangements(numel: int = 32 * 2**20, chunk: int = 2**20, repeats: int = 5) -> str:
    """Element rates (G elements/s) of the kernels near the ridge, with each side of the stream
    in DRAM or in the last-level cache: ``numel`` elements in one call (both in DRAM) or in
    ``chunk``-element calls where the input or the output is one ``chunk``-element tensor that
    stays in the cache, and in place. A Markdown table; it locates a kernel's loss on the read or
    the write side (docs/roofline.md: the exact GELU, which PyTorch runs through oneDNN's
    element-wise kernel on contiguous fp32 CPU tensors, loses on its reads; the last row is
    ATen's own GELU kernel, with oneDNN switched off)."""
    aten = torch.ops.aten
    kernels: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "gelu": lambda x, out: aten.gelu.out(x, out=out),
        "sigmoid": lambda x, out: torch.sigmoid(x, out=out),
        "silu": lambda x, out: aten.silu.out(x, out=out),
        "gelu_tanh": lambda x, out: aten.gelu.out(x, approximate="tanh", out=out),
        "gelu, oneDNN off": _without_onednn(lambda x, out: aten.gelu.out(x, out=out)),
    }
    big, out = torch.randn(numel), torch.empty(numel)
    small, small_out = torch.randn(chunk), torch.empty(chunk)
    steps = range(0, numel, chunk)
    lines = ["| kernel | both in the cache | both in DRAM | read DRAM, write cache | "
             "read cache, write DRAM | in place in DRAM |", "| :--- |" + " ---: |" * 5]
    for name, fn in kernels.items():
        inplace = big.clone()

        def calls(fn: Callable[[torch.Tensor, torch.Tensor], Any] = fn,
                  t: torch.Tensor = inplace) -> list[Callable[[], Any]]:
            return [lambda: [fn(small, small_out) for _ in steps],
                    lambda: fn(big, out),
                    lambda: [fn(big[i:i + chunk], small_out) for i in steps],
                    lambda: [fn(small, out[i:i + chunk]) for i in steps],
                    lambda: fn(t, t)]

        rates = [numel / best_seconds(call, repeats) / 1e9 for call in calls()]
        lines.append(f"| {name} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/roofline")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--arrangements", action="store_true",
                        help="only the ridge kernels' rates with each side in DRAM or the cache")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.arrangements:
        print(arrangements())
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hw, rows = run(args.repeats, args.rounds)
    (out / "roofline_validation.json").write_text(
        json.dumps({"hardware": hw.to_dict(), "rows": rows}, indent=1))
    plot(rows, out / "roofline_validation.png")
    print(markdown(hw, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
