"""Markdown tables of ``benchmarks/results/comm_validation.json`` (``python -m
benchmarks.comm_validation --tables``)."""

from __future__ import annotations

from typing import Any


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def tables(result: dict[str, Any]) -> str:
    """The per-layout table (both profiles), the summaries and the order pairs."""
    lines = ["| layout (ranks) | measured fwd+bwd (median, spread) | optimizer | predicted "
             "(concurrent calibration) | ratio | predicted (alone) | ratio | measured peak "
             "(max over ranks) | predicted peak | ratio | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cmp_c = {r["name"]: r for r in result["comparison"]["concurrent"]["rows"]}
    cmp_a = {r["name"]: r for r in result["comparison"]["alone"]["rows"]}
    for row in result["rows"]:
        m, c, a = row["measured"], cmp_c[row["name"]], cmp_a[row["name"]]
        lines.append(
            f"| {row['name']} ({row['job']['world']}) | {_ms(m['fwd_bwd_median_s'])} "
            f"({_ms(m['fwd_bwd_spread_s'])}) | {_ms(m['optimizer_median_s'])} | "
            f"{_ms(c['predicted_step_s'])} | {c['step_ratio']:.2f} | "
            f"{_ms(a['predicted_step_s'])} | {a['step_ratio']:.2f} | "
            f"{_mib(c['measured_peak_bytes'])} | {_mib(c['predicted_peak_bytes'])} | "
            f"{c['peak_ratio']:.2f} | {m['load_before']:.1f} |")
    lines += ["", "| profile | step: median abs error | step: p90 | peak: median abs error | "
              "peak: max | distinct pairs | ordered as measured |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, cmp in result["comparison"].items():
        s = cmp["summary"]
        lines.append(f"| {key} | {s['step_median_abs_error']:.0%} | {s['step_p90_abs_error']:.0%} "
                     f"| {s['peak_median_abs_error']:.1%} | {s['peak_max_abs_error']:.1%} | "
                     f"{s['pairs_distinct']} | {s['pairs_agree']} |")
    lines += ["", "| pair (same ranks) | measured gap | larger spread | distinct | planner "
              "(concurrent) agrees | planner (alone) agrees |", "|---|---:|---:|---|---|---|"]
    alone = {(p["a"], p["b"]): p for p in result["comparison"]["alone"]["pairs"]}
    for p in result["comparison"]["concurrent"]["pairs"]:
        q = alone[p["a"], p["b"]]
        lines.append(f"| {p['a']} / {p['b']} | {_ms(p['measured_gap_s'])} | "
                     f"{_ms(p['spread_s'])} | {'yes' if p['distinct'] else 'no'} | "
                     f"{'yes' if p['agree'] else 'no'} | {'yes' if q['agree'] else 'no'} |")
    return "\n".join(lines)
