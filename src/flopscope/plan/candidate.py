"""One layout of a training plan, evaluated from its roles: its peak memory per device (the
fullest stage, with AdamW's state), its step time, tokens/s and MFU, whether it fits, why not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flopscope.plan.options import applied
from flopscope.plan.roles import RoleRun
from flopscope.plan.space import Choice
from flopscope.plan.timing import Links, StepTime, compare, step_time
from flopscope.render.units import seconds

__all__ = ["DP_COMM", "Candidate", "evaluate", "pareto", "part_name", "why_it_wins"]


@dataclass(frozen=True)
class Candidate:
    """One layout, evaluated.

    Attributes:
        choice: the layout.
        memory_bytes: peak bytes per device (the fullest stage).
        at_peak: category -> bytes live at that peak (``optimizer_state`` added: AdamW).
        peak_where: ``module (phase)`` where that peak is reached, and the stage.
        time: the step time and its parts.
        tokens_per_s_per_gpu: training tokens per second per device.
        mfu: model FLOPs utilization (0-1).
        fits: whether the peak is within the budget.
        reason: why it was dropped (``None`` when it fits).
        applied: the plan-wide parallelisms this layout has (``"sequence"``, ``"loss"``).
        screened: its figures are a screen's estimate (:mod:`flopscope.plan.screen`), not
            simulated.
        bound_time: where :attr:`time` is a prediction (``time.compute``), the same step with
            the compute at the roofline bound (``None`` where ``time`` is that already).
    """

    choice: Choice
    memory_bytes: int
    at_peak: dict[str, int]
    peak_where: str
    time: StepTime
    tokens_per_s_per_gpu: float
    mfu: float
    fits: bool
    reason: str | None = None
    applied: tuple[str, ...] = ()
    screened: bool = False
    bound_time: StepTime | None = None

    @property
    def bound_step(self) -> StepTime:
        """The step with the compute at the roofline bound (:attr:`bound_time`, else
        :attr:`time`)."""
        return self.bound_time if self.bound_time is not None else self.time

    @property
    def mfu_bound(self) -> float:
        """MFU at :attr:`bound_step`: the most the layout can reach (its compute at peak)."""
        t = self.bound_step.total
        return self.mfu * self.time.total / t if t else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes, seconds)."""
        return {"layout": self.choice.label, **self.choice.to_dict(),
                "memory_bytes": self.memory_bytes, "at_peak": dict(self.at_peak),
                "peak_where": self.peak_where, "time_s": self.time.to_dict(),
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "fits": self.fits, "reason": self.reason, "applied": list(self.applied),
                "screened": self.screened, "time_kind": self.time.compute,
                "bound_time_s": self.bound_step.to_dict(), "mfu_bound": self.mfu_bound}


def _memory(runs: Sequence[RoleRun], choice: Choice) -> tuple[int, dict[str, int], str]:
    """The fullest stage's peak: the tracked step, AdamW's moments (two per parameter, in the
    parameter's dtype, live through the whole step; with ZeRO-1 a ``1 / dp`` share, rounded
    up) and, when microbatches accumulate without stages, the gradients the earlier
    microbatches left (the simulated first one starts without)."""
    best: tuple[int, dict[str, int], str] = (-1, {}, "")
    for run in runs:
        at = dict(run.memory.at_peak)
        at["optimizer_state"] = (at.get("optimizer_state", 0)
                                 + choice.optimizer_share(2 * run.parameter_bytes))
        if choice.pp == 1 and choice.microbatches > 1:
            missing = max(0, run.parameter_bytes - at.get("gradients", 0))
            at["gradients"] = at.get("gradients", 0) + missing
        total = sum(at.values())
        where = f"{run.memory.peak_module or '(root)'} ({run.memory.peak_phase})"
        if choice.pp > 1:
            where = f"stage {run.key.stage}: {where}"
        if total > best[0]:
            best = (total, at, where)
    return best


def _reason(peak: int, at: Mapping[str, int], where: str, budget: int) -> str:
    from flopscope.render.units import human_bytes

    category, size = max(at.items(), key=lambda kv: kv[1])
    return (f"peak {human_bytes(peak)} is {human_bytes(peak - budget)} over the "
            f"{human_bytes(budget)} budget, at {where}; largest: {category.replace('_', ' ')} "
            f"{human_bytes(size)}")


def pareto(ranked: Sequence[Candidate]) -> tuple[Candidate, ...]:
    front: list[Candidate] = []
    for c in ranked:  # fastest first: keep each that needs less memory than every faster one
        if not front or c.memory_bytes < front[-1].memory_bytes:
            front.append(c)
    return tuple(front)


def evaluate(choice: Choice, runs: Sequence[RoleRun], links: Links, *, budget: int,
             tokens: int, flops: int, peak: float, screened: bool = False,
             param_dtype: torch.dtype | None = None) -> Candidate:
    """A layout from its roles' runs.

    Args:
        choice: the layout.
        runs: its roles, in stage order.
        links: the collectives' links.
        budget: bytes per device.
        tokens: tokens (or samples) per step.
        flops: the unsharded model's FLOPs per step (MFU's numerator).
        peak: one device's dense peak FLOP rate for the compute dtype.
        screened: the runs are estimates (:mod:`flopscope.plan.screen`).
        param_dtype: the parameters' dtype: the step's optimizer update and gradient
            accumulation counted in it (:func:`~flopscope.plan.timing.step_time`).

    Returns:
        The :class:`Candidate`.
    """
    t = step_time(runs, choice, links, param_dtype=param_dtype)
    bound = (step_time(runs, choice, links, bound=True, param_dtype=param_dtype)
             if t.compute == "prediction" else None)
    used, at, where = _memory(runs, choice)
    gpus = choice.gpus
    per_gpu = tokens / t.total / gpus if t.total else 0.0
    mfu = flops / (t.total * gpus * peak) if t.total else 0.0
    fits = used <= budget
    reason = None if fits else _reason(used, at, where, budget) + (
        " (screened estimate)" if screened else "")
    return Candidate(choice, used, at, where, t, per_gpu, mfu, fits, reason,
                     applied([r.key for r in runs]), screened, bound)


#: what a layout's data-parallel communication is, by :attr:`Choice.data_parallel`
DP_COMM = {"fsdp": "FSDP gathers/reduce-scatters", "ddp": "DDP all-reduces",
           "zero1": "ZeRO-1 reduce-scatters/gathers", "zero2": "FSDP gathers/reduce-scatters"}


def part_name(name: str, choice: Choice) -> str:
    """A part's name for ``choice`` (a DDP layout's data-parallel communication is
    all-reduces, a ZeRO-1 layout's reduce-scatters and gathers)."""
    return name.replace(DP_COMM["fsdp"], DP_COMM[choice.data_parallel])


def why_it_wins(ranked: Sequence[Candidate], unit: str) -> list[str]:
    """Why the best layout wins: against the next fastest, the fastest of each other (tp, pp)
    family and the same layout with sequence parallelism the other way (where it was searched),
    where the others spend more time (or need the memory).

    Args:
        ranked: a plan's layouts that fit, fastest first (at least one).
        unit: what a step processes (``"tokens"`` or ``"samples"``).

    Returns:
        A blank line, the title, then a line per rival (none when there is no rival).
    """
    best = ranked[0]
    # where sequence parallelism was searched: the best layout the other way round, listed
    # right after the next fastest (or as it)
    other = dataclasses.replace(best.choice,
                                sequence_parallel=not best.choice.sequence_parallel)
    twin = next((c for c in ranked[1:] if c.choice == other), None)
    rivals = list(ranked[1:2]) + ([twin] if twin is not None and twin is not ranked[1] else [])
    seen = {(c.choice.tp, c.choice.pp, c.choice.data_parallel, c.choice.ep)
            for c in (best, *rivals)}
    for c in ranked[2:]:
        family = (c.choice.tp, c.choice.pp, c.choice.data_parallel, c.choice.ep)
        if family not in seen:
            rivals.append(c)
            seen.add(family)
    if not rivals:
        return []
    out = ["", "Why it wins (the next fastest, "
               + ("the same layout " + ("without" if best.choice.sequence_parallel else "with")
                  + " sequence parallelism, " if twin else "")
               + "and the fastest of each other TP x PP"
               + (" x EP" if any(c.choice.ep > 1 for c in ranked) else "")
               + (")" if unit == "tokens" else ", DDP or FSDP)") + ":"]
    for c in rivals[:4]:
        diffs = compare(best.time, c.time)[:2]
        said = "; ".join(f"{part_name(name, c.choice)} "
                         f"{'+' if d > 0 else '-'}{seconds(abs(d))}" for name, d in diffs)
        out.append(f"  {c.choice.label}: {seconds(c.time.total)} "
                   f"(+{c.time.total / best.time.total - 1:.0%}): {said}")
    return out
