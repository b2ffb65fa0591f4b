"""A plan as text: the ranked layouts, the Pareto front of time against memory, where the best
layout's time goes, and why the others were dropped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flopscope.plan.timing import PART_NAMES, compare, describe
from flopscope.render.units import human_bytes

if TYPE_CHECKING:  # the planner imports this module to show a plan (Plan.to_html)
    from flopscope.plan.planner import Candidate, Plan

__all__ = ["plan_html", "plan_page_data", "plan_text", "seconds"]


def seconds(value: float) -> str:
    """A duration with a readable unit: ``1.23 s``, ``45.6 ms``, ``789 us``."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} us"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 1 else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _row(rank: str, c: Candidate) -> list[str]:
    t = c.time
    return [rank, c.choice.label, human_bytes(c.memory_bytes), seconds(t.total),
            f"{c.tokens_per_s_per_gpu:,.0f}", f"{c.mfu:.1%}", seconds(t.forward + t.backward),
            seconds(t.recompute), seconds(t.tp_comm + t.fsdp_comm + t.p2p), seconds(t.bubble)]


def _why(plan: Plan) -> list[str]:
    """Why the best layout wins: against the next fastest, and against the fastest of each
    other (tp, pp) family, where the others spend more time (or need the memory)."""
    best = plan.ranked[0]
    rivals: list[Candidate] = []
    seen = {(best.choice.tp, best.choice.pp)}
    for c in plan.ranked[1:]:
        family = (c.choice.tp, c.choice.pp)
        if c is plan.ranked[1] or family not in seen:
            rivals.append(c)
            seen.add(family)
    if not rivals:
        return []
    out = ["", "Why it wins (the next fastest, and the fastest of each other TP x PP):"]
    for c in rivals[:4]:
        diffs = compare(best.time, c.time)[:2]
        said = "; ".join(f"{name} {'+' if d > 0 else '-'}{seconds(abs(d))}" for name, d in diffs)
        out.append(f"  {c.choice.label}: {seconds(c.time.total)} "
                   f"(+{c.time.total / best.time.total - 1:.0%}): {said}")
    return out


def plan_text(plan: Plan, top: int = 10) -> str:
    """The plan as text.

    Args:
        plan: the plan.
        top: layouts to list (ranked and dropped, each).

    Returns:
        The text.
    """
    lines = [
        f"Training plan: {plan.source} on {plan.gpus} x {plan.hardware.name} "
        f"({plan.gpus_per_node} per node), global batch {plan.global_batch} x {plan.seq_len} "
        f"tokens, {plan.dtype}, budget {human_bytes(plan.memory_budget)} per device",
        f"{len(plan.ranked) + len(plan.dropped)} layouts: {len(plan.ranked)} fit, "
        f"{len(plan.dropped)} dropped; {plan.roles} rank roles ({plan.simulations} simulated "
        f"now, the rest cached) in {plan.seconds:.1f} s",
        "",
    ]
    header = ["#", "layout", "peak/GPU", "step", "tok/s/GPU", "MFU", "compute", "recompute",
              "comm exposed", "bubble"]
    if plan.ranked:
        rows = [header] + [_row(str(i + 1), c) for i, c in enumerate(plan.ranked[:top])]
        lines += _table(rows)
        if len(plan.ranked) > top:
            lines.append(f"... {len(plan.ranked) - top} more (--top N)")
        lines += ["", "Pareto front (no other layout is both faster and smaller):"]
        lines += [f"  {c.choice.label}: {seconds(c.time.total)}, {human_bytes(c.memory_bytes)}"
                  for c in plan.pareto]
        best = plan.ranked[0]
        lines += ["", f"Best: {best.choice.label}, {seconds(best.time.total)} per step, "
                      f"{best.mfu:.1%} MFU, {human_bytes(best.memory_bytes)} at {best.peak_where}"
                      "; where its time goes:"]
        lines += [f"  {name:<40} {seconds(value):>10}  {share:6.1%}"
                  for name, value, share in describe(best.time)]
        if best.time.fsdp_hidden:
            lines.append(f"  (FSDP communication hidden behind compute: "
                         f"{seconds(best.time.fsdp_hidden)})")
        lines += _why(plan)
    else:
        lines.append("No layout fits the memory budget.")
    if plan.dropped:
        lines += ["", f"Dropped ({len(plan.dropped)}, smallest first):"]
        for c in sorted(plan.dropped, key=lambda c: c.memory_bytes)[:top]:
            lines.append(f"  {c.choice.label}: {c.reason}")
        if len(plan.dropped) > top:
            lines.append(f"  ... {len(plan.dropped) - top} more")
    lines += ["", *(f"Note: {n}" for n in plan.notes)]
    return "\n".join(lines) + "\n"


def plan_page_data(plan: Plan) -> dict[str, Any]:
    """What the plan's HTML page draws: :meth:`Plan.to_dict` and ``"explain"``, the words the
    table uses: the parts of a step's time by name (``part_names``) and why the best layout wins
    (``why``, the lines of :func:`plan_text`'s "Why it wins").

    Args:
        plan: the plan.

    Returns:
        JSON-ready data.
    """
    why = [line.strip() for line in _why(plan)[2:]] if plan.ranked else []
    return {**plan.to_dict(), "explain": {"part_names": dict(PART_NAMES), "why": why}}


def plan_html(plan: Plan) -> str:
    """A training plan as one self-contained HTML page, with its table's words
    (:func:`plan_page_data`; :func:`flopscope.render.html.render_plan_html` draws any plan's
    ``to_dict()``, a serving plan's too).

    Args:
        plan: the plan.

    Returns:
        The page.
    """
    from flopscope.render.html import render_plan_html

    return render_plan_html(plan_page_data(plan))
