"""A plan as text: the ranked layouts, the Pareto front of time against memory, where the best
layout's time goes, and why the others were dropped; a serving plan's layouts and batches, the
best for throughput and for latency."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flopscope.plan.candidate import DP_COMM, Candidate, part_name, why_it_wins
from flopscope.plan.serve import ServePlan
from flopscope.plan.serve_rows import ServeCandidate
from flopscope.plan.time_words import compute_note, table_line
from flopscope.plan.timing import PART_NAMES, describe
from flopscope.render.units import human_bytes, seconds

if TYPE_CHECKING:
    from flopscope.estimate import Hardware
    from flopscope.plan.planner import Plan
    from flopscope.plan.sweeps import SweepRow

__all__ = ["page_data", "plan_html", "plan_text", "serve_page_data",
           "serve_text", "sweep_header", "sweep_line"]


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


def _row(rank: str, c: Candidate, extras: bool, bound: bool) -> list[str]:
    t = c.time
    beside = [seconds(c.bound_step.total), f"{c.mfu_bound:.1%}"] if bound else []
    return [rank, _label(c), human_bytes(c.memory_bytes), seconds(t.total),
            f"{c.tokens_per_s_per_gpu:,.0f}", f"{c.mfu:.1%}", *beside,
            seconds(t.forward + t.backward + t.optimizer + t.accumulation),
            seconds(t.recompute), seconds(t.tp_comm + t.fsdp_comm + t.p2p + t.ep_comm),
            seconds(t.bubble), *([_applied(c)] if extras else [])]


def _label(c: Candidate) -> str:
    """The layout's label, ``~`` after it when its figures are a screen's estimate."""
    return f"{c.choice.label} ~" if c.screened else c.choice.label


def _applied(c: Candidate) -> str:
    """The table's ``TP with`` cell: the plan-wide parallelisms the layout has."""
    return " + ".join({"sequence": "SP", "loss": "loss"}[a] for a in c.applied) or "-"


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
        f"({plan.gpus_per_node} per node), global batch {plan.global_batch}"
        + (f" x {plan.seq_len} tokens" if plan.unit == "tokens" else " samples")
        + f", {plan.precision}, budget {human_bytes(plan.memory_budget)} per device",
        f"{len(plan.ranked) + len(plan.dropped)} layouts: {len(plan.ranked)} fit, "
        f"{len(plan.dropped)} dropped; {plan.roles} rank roles ({plan.simulations} simulated "
        f"now, the rest cached) in {plan.seconds:.1f} s",
        "",
    ]
    per = "tok/s/GPU" if plan.unit == "tokens" else "samples/s/GPU"
    # the column of sequence (SP) and loss parallelism, where a listed layout has either
    extras = any(c.applied for c in plan.ranked[:top])
    # where the times are predictions: the bound's step and MFU beside them
    bound = any(c.bound_time is not None for c in (*plan.ranked, *plan.dropped))
    header = ["#", "layout", "peak/GPU", "step", per, "MFU",
              *(["step (bound)", "MFU (bound)"] if bound else []), "compute", "recompute",
              "comm exposed", "bubble", *(["TP with"] if extras else [])]
    if plan.ranked:
        rows = [header] + [_row(str(i + 1), c, extras, bound)
                           for i, c in enumerate(plan.ranked[:top])]
        lines += _table(rows)
        if len(plan.ranked) > top:
            lines.append(f"... {len(plan.ranked) - top} more (--top N)")
        lines += table_line(plan.hardware) if bound else []
        lines += ["", "Pareto front (no other layout is both faster and smaller):"]
        lines += [f"  {c.choice.label}: {seconds(c.time.total)}, {human_bytes(c.memory_bytes)}"
                  for c in plan.pareto]
        best = plan.ranked[0]
        at_bound = (f" (bound {seconds(best.bound_step.total)}, {best.mfu_bound:.1%})"
                    if bound else "")
        lines += ["", f"Best: {best.choice.label}, {seconds(best.time.total)} per step, "
                      f"{best.mfu:.1%} MFU{at_bound}, {human_bytes(best.memory_bytes)} at "
                      f"{best.peak_where}; where its time goes"
                      + (" (predicted)" if bound else "") + ":"]
        lines += [f"  {part_name(name, best.choice):<40} {seconds(value):>10}  {share:6.1%}"
                  for name, value, share in describe(best.time)]
        if best.time.fsdp_hidden:
            kind = DP_COMM[best.choice.data_parallel].split()[0]
            lines.append(f"  ({kind} communication hidden behind compute: "
                         f"{seconds(best.time.fsdp_hidden)})")
        lines += why_it_wins(plan.ranked, plan.unit)
    else:
        lines.append("No layout fits the memory budget.")
    if plan.dropped:
        lines += ["", f"Dropped ({len(plan.dropped)}, smallest first):"]
        for c in sorted(plan.dropped, key=lambda c: c.memory_bytes)[:top]:
            lines.append(f"  {_label(c)}: {c.reason}")
        if len(plan.dropped) > top:
            lines.append(f"  ... {len(plan.dropped) - top} more")
    lines += ["", *(f"Note: {n}" for n in plan.notes)]
    return "\n".join(lines) + "\n"


def serve_page_data(plan: ServePlan) -> dict[str, Any]:
    """What a serving plan's HTML page draws: :meth:`ServePlan.to_dict` and ``"explain"``,
    the words of :func:`serve_text`: why the best layout for throughput wins (``why``, the lines
    of its "Why it wins", against the best row of each other layout) and how they read
    (``why_title``: tokens/s = sequences in flight x new tokens / a request's time).

    Args:
        plan: the serving plan.

    Returns:
        JSON-ready data.
    """
    lines = _serve_why(plan)
    title = lines[1].strip().rstrip(":") if lines else ""
    return {**plan.to_dict(), "explain": {"why": [line.strip() for line in lines[2:]],
                                          "why_title": title}}


def page_data(plan: Plan | ServePlan) -> dict[str, Any]:
    """A plan's page data, training (:meth:`Plan.page_data`) or serving
    (:func:`serve_page_data`): its dict with the table's words.

    Args:
        plan: the plan.

    Returns:
        JSON-ready data.
    """
    return serve_page_data(plan) if isinstance(plan, ServePlan) else plan.page_data()


def plan_html(plan: Plan | ServePlan) -> str:
    """A training or serving plan as one self-contained HTML page, with its table's words
    (:func:`page_data`; :func:`flopscope.render.html.render_plan_html` draws any plan's
    ``to_dict()``).

    Args:
        plan: the plan.

    Returns:
        The page.
    """
    from flopscope.render.html import render_plan_html

    return render_plan_html(page_data(plan))


def _serve_row(rank: str, c: ServeCandidate, bound: bool, static: bool = True) -> list[str]:
    beside = ([seconds(c.decode_bound.total) if c.decode_bound else "-",
               f"{c.tokens_per_s_per_gpu_bound or 0:,.0f}"] if bound else [])
    cont = ([f"{c.tokens_per_s_continuous / c.gpus:,.0f}"] if c.continuous else ["-"]) \
        if static else []
    return [rank, c.layout.label, f"{c.batch}{' (max)' if c.largest else ''}",
            human_bytes(c.memory_bytes), human_bytes(c.weights_bytes),
            human_bytes(c.kv_cache_bytes), seconds(c.prefill.total), seconds(c.decode.total),
            f"{c.tokens_per_s:,.0f}", f"{c.tokens_per_s_per_gpu:,.0f}", *beside, *cont]


def _serve_continuous(plan: ServePlan) -> list[str]:
    """The best row with continuous batching in words, against the same row's static
    batching."""
    c = plan.best_continuous
    if c is None or c.continuous is None:
        return []
    k = c.continuous
    at_bound = (f" (bound {seconds(k.step_bound.total)})" if k.step_bound is not None else "")
    return [f"Best with continuous batching (chunked prefill, {k.chunk} tokens per sequence "
            f"per step): {c.label}: {k.tokens_per_s:,.0f} tokens/s "
            f"({k.tokens_per_s / c.gpus:,.0f} per GPU), {seconds(k.step.total)} per token"
            f"{at_bound}; static batching at this layout and batch "
            f"{c.tokens_per_s:,.0f} tokens/s ({k.tokens_per_s / c.tokens_per_s - 1:+.0%})"
            if c.tokens_per_s else ""]


def _serve_best(title: str, c: ServeCandidate, alone: ServeCandidate | None = None,
                step: str = "a decode step") -> list[str]:
    """A best row in words: its figures, where its decode step goes and, where that step is
    host-bound, by how much and (``alone``: the best at the device's time alone) what the
    choice would be without the host's time per call."""
    d = c.decode
    parts = [("compute" + (" (predicted)" if d.kind == "prediction" else "")
              + (" on the device" if d.host else ""), d.compute),
             ("tensor-parallel collectives", d.tp_comm), (PART_NAMES["ep_comm"], d.ep_comm),
             ("pipeline sends", d.p2p),
             ("waiting for the host", d.host_wait)]
    said = ", ".join(f"{name} {seconds(v)}" for name, v in parts if v > 0)
    at_bound = (f" (bound {seconds(c.decode_bound.total)}, "
                f"{c.tokens_per_s_per_gpu_bound or 0:,.0f} tokens/s per GPU)"
                if c.decode_bound is not None else "")
    lines = [f"{title}: {c.label}: {c.tokens_per_s:,.0f} tokens/s "
             f"({c.tokens_per_s_per_gpu:,.0f} per GPU), {seconds(d.total)} per token{at_bound}, "
             f"first token after {seconds(c.prefill.total)}, {human_bytes(c.memory_bytes)} per "
             f"GPU at {c.peak_where}",
             f"  {step}: {said}"]
    if c.host_bound:
        each = d.host / d.calls if d.calls else 0.0
        lines.append(f"  host-bound: the host issues its {d.calls:,.0f} operator calls in "
                     f"{seconds(d.host)} ({seconds(each)} each), the device's work takes "
                     f"{seconds(d.device_only)}: CUDA graphs or torch.compile "
                     "(mode='reduce-overhead') take the host's time per call away")
        if alone is not None:
            lines.append(
                f"  at the device's time alone: {seconds(d.device_only)} per token here; the "
                + ("best for latency stays this layout" if alone is c else
                   f"best for latency would be {alone.label}, "
                   f"{seconds(alone.decode.device_only)} per token"))
    return lines


def _request(c: ServeCandidate, new_tokens: int) -> float:
    """One batch of requests from prompt to last token: the prefill and the decode steps."""
    return c.prefill.total + (new_tokens - 1) * c.decode.total


def _serve_why(plan: ServePlan) -> list[str]:
    """Why the best layout for throughput wins: against the best row of each other layout,
    tokens/s = sequences in flight (replicas x batch) x new tokens / a request's time, so
    either it keeps more sequences in flight or it finishes them sooner."""
    best = plan.best_throughput
    if best is None:
        return []
    rivals: list[ServeCandidate] = []
    seen = {best.layout}
    for c in plan.ranked:
        if c.layout not in seen:
            rivals.append(c)
            seen.add(c.layout)
    if not rivals:
        return []
    static = plan.batching == "static"

    def took(c: ServeCandidate) -> float:  # a request's time, or a step's
        return _request(c, plan.new_tokens) if static else c.decode.total

    flight, request = best.layout.replicas * best.batch, took(best)
    out = ["", "Why it wins (tokens/s = sequences in flight x new tokens / a request's time; "
               "the best of each other layout):" if static else
               "Why it wins (tokens/s = sequences in flight / a step's time; the best of each "
               "other layout):"]
    for c in rivals[:4]:
        theirs = c.layout.replicas * c.batch
        out.append(f"  {c.label}: {c.tokens_per_s:,.0f} tokens/s "
                   f"({c.tokens_per_s / best.tokens_per_s - 1:+.0%}): {theirs:,} sequences in "
                   f"flight ({theirs / flight - 1:+.0%}), {'a request' if static else 'a step'} "
                   f"{seconds(took(c))} ({took(c) / request - 1:+.0%})")
    return out


def serve_text(plan: ServePlan, top: int = 10) -> str:
    """A serving plan as text.

    Args:
        plan: the plan.
        top: rows to list (ranked and dropped, each).

    Returns:
        The text.
    """
    lines = [
        f"Serving plan: {plan.source} on {plan.gpus} x {plan.hardware.name} "
        f"({plan.gpus_per_node} per node), prompts of {plan.prompt} tokens, "
        f"{plan.new_tokens} new tokens each, {plan.dtype}, budget "
        f"{human_bytes(plan.memory_budget)} per device, {plan.batching} batching",
        f"{len(plan.ranked) + len(plan.dropped)} layouts x batches: {len(plan.ranked)} fit, "
        f"{len(plan.dropped)} dropped; {plan.roles} serving roles ({plan.simulations} "
        f"simulated now, the rest cached) in {plan.seconds:.1f} s",
        "",
    ]
    # where the times are predictions: the bound's latency and tokens/s beside them
    bound = any(c.decode_bound is not None for c in (*plan.ranked, *plan.dropped))
    static = plan.batching == "static"
    header = ["#", "layout", "batch", "peak/GPU", "weights", "KV cache", "1st token",
              "per token", "tok/s", "tok/s/GPU",
              *(["per token (bound)", "tok/s/GPU (bound)"] if bound else []),
              *(["tok/s/GPU (cont.)"] if static else [])]
    if plan.ranked:
        rows = [header] + [_serve_row(str(i + 1), c, bound, static)
                           for i, c in enumerate(plan.ranked[:top])]
        lines += _table(rows)
        if len(plan.ranked) > top:
            lines.append(f"... {len(plan.ranked) - top} more (--top N)")
        lines += table_line(plan.hardware, serve=True)
        lines.append("")
        step = "a decode step" if static else "a step"
        if plan.best_throughput is not None:
            lines += _serve_best("Best for throughput", plan.best_throughput, step=step)
        if plan.best_latency is not None:
            lines += _serve_best("Best for latency", plan.best_latency,
                                 plan.best_latency_without_host, step)
        lines += _serve_continuous(plan)
        lines += _serve_why(plan)
    else:
        lines.append("No layout fits the memory budget with one sequence.")
    if plan.dropped:
        lines += ["", f"Dropped ({len(plan.dropped)}, smallest first):"]
        for c in sorted(plan.dropped, key=lambda c: c.memory_bytes)[:top]:
            lines.append(f"  {c.layout.label}: {c.reason}")
        if len(plan.dropped) > top:
            lines.append(f"  ... {len(plan.dropped) - top} more")
    lines += ["", *(f"Note: {n}" for n in plan.notes)]
    return "\n".join(lines) + "\n"


#: a sweep's columns (name, width; the model and the layouts left-aligned): rows are written as
#: plans complete, so the widths are fixed
_SWEEP = {"train": (("model", 24), ("GPUs", 6), ("seq", 7), ("fit", 9), ("best layout", 24),
                    ("step", 9), ("MFU", 6), ("MFU (bound)", 11), ("tok/s/GPU", 11),
                    ("peak/GPU", 11)),
          "serve": (("model", 24), ("GPUs", 6), ("prompt", 7), ("fit", 9),
                    ("best throughput", 26), ("tok/s/GPU", 11), ("per token", 10),
                    ("best latency", 24), ("per token", 10))}


def _cells(widths: tuple[tuple[str, int], ...], cells: list[str]) -> str:
    return "  ".join(c.ljust(w) if name == "model" or name.startswith("best") else c.rjust(w)
                     for c, (name, w) in zip(cells, widths, strict=True)).rstrip()


def sweep_header(mode: str, hardware: Hardware | None = None) -> list[str]:
    """A sweep table's header lines.

    Args:
        mode: ``train`` or ``serve``.
        hardware: the profile the plans compute with: a first line then says what the times
            are (a prediction with its error bar, or the bound; a serving plan's prediction
            also says what its error bar was measured on).

    Returns:
        What the times are (with ``hardware``), the header and its rule.
    """
    widths = _SWEEP[mode]
    what = [] if hardware is None else [
        "step, MFU: " + compute_note(hardware) if mode == "train"
        else "tok/s/GPU, per token: " + compute_note(hardware, serve=True)]
    return [*what, _cells(widths, [n for n, _ in widths]), "  ".join("-" * w for _, w in widths)]


def sweep_line(row: SweepRow) -> str:
    """One plan of a sweep as a table line (the plan's best layouts, or why it failed), and
    under it, where a worker gave no result for some of its roles, which and why (the plan
    simulated them itself).

    Args:
        row: the sweep's row.

    Returns:
        The line (and those under it).
    """
    line = _sweep_line(row)
    return "\n".join([line, *(f"    worker failed, simulated here: {why}"
                              for why in row.worker_errors)])


def _sweep_line(row: SweepRow) -> str:
    start = [row.source, str(row.gpus), str(row.seq_len or "-")]
    result = row.plan
    if result is None:
        return f"{row.source:<24}  {row.gpus:>6}  {start[2]:>7}  error: {row.error}"
    fit = f"{len(result.ranked)}/{len(result.ranked) + len(result.dropped)}"
    if isinstance(result, ServePlan):
        start[2] = str(result.prompt)
        up, low = result.best_throughput, result.best_latency
        if up is None or low is None:
            return _cells(_SWEEP["serve"], [*start, fit, "nothing fits", "", "", "", ""])
        return _cells(_SWEEP["serve"], [*start, fit, up.label, f"{up.tokens_per_s_per_gpu:,.0f}",
                                        seconds(up.decode.total), low.label,
                                        seconds(low.decode.total)])
    start[2] = str(result.seq_len) if result.unit == "tokens" else "-"
    best = result.best
    if best is None:
        return _cells(_SWEEP["train"], [*start, fit, "nothing fits", "", "", "", "", ""])
    return _cells(_SWEEP["train"], [*start, fit, best.choice.label, seconds(best.time.total),
                                    f"{best.mfu:.1%}", f"{best.mfu_bound:.1%}",
                                    f"{best.tokens_per_s_per_gpu:,.0f}",
                                    human_bytes(best.memory_bytes)])
