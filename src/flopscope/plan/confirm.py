"""A screened plan's confirmation: the layouts that could win simulated, and the screen's
error measured on them (:mod:`flopscope.plan.screen` estimates every layout first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from flopscope.plan.candidate import Candidate
from flopscope.plan.space import Choice

__all__ = ["MEMORY_MARGIN", "TIME_MARGIN", "Screening", "confirm_best"]


#: a screened layout is simulated when it could win: its screened peak at most this much above
#: the budget, and its screened step time at most :data:`TIME_MARGIN` above the best simulated
#: one that fits (above the largest screening errors measured: docs/plan.md, "Screening")
MEMORY_MARGIN = 0.3
#: see :data:`MEMORY_MARGIN`
TIME_MARGIN = 0.10


@dataclass(frozen=True)
class Screening:
    """What a screened plan simulated and how far its screen was from the simulations.

    Attributes:
        layouts: layouts in the plan.
        references: reference runs the screen simulated.
        confirmed: screened layouts then simulated (their rows are the simulation's).
        memory_error: per confirmed layout, screened peak / simulated peak - 1.
        time_error: per confirmed layout, screened step time / simulated - 1.
    """

    layouts: int
    references: int
    confirmed: int
    memory_error: tuple[float, ...]
    time_error: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"layouts": self.layouts, "references": self.references,
                "confirmed": self.confirmed, "memory_error": list(self.memory_error),
                "time_error": list(self.time_error)}

    def note(self) -> str:
        """The plan's note on its screen."""
        def spread(errors: Sequence[float]) -> str:
            worst = max(errors, key=abs)
            return f"median {100 * median(abs(e) for e in errors):.1f}%, worst {100 * worst:+.1f}%"

        out = (f"screened: layouts estimated from {self.references} reference runs "
               "(flopscope.plan.screen), rows marked ~; ")
        if not self.memory_error:
            return out + ("none could win within the screen's margins: every row without ~ "
                          "was simulated")
        out += (f"the {self.confirmed} that could win were simulated; the screen against "
                f"them: peak memory {spread(self.memory_error)}, step time "
                f"{spread(self.time_error)}")
        return out


def confirm_best(choices: Sequence[Choice], screened_of: Callable[[Choice], Candidate],
                 simulated_of: Callable[[Choice], Candidate], budget: int, confirm: int,
                 references: Callable[[], int]) -> tuple[list[Candidate], Screening]:
    """Every layout screened, then the ones that could win simulated, fastest first: each whose
    screened peak is within :data:`MEMORY_MARGIN` of the budget, until ``confirm`` simulated
    layouts fit and the next screened step time is more than :data:`TIME_MARGIN` above the
    best of them.

    Args:
        choices: the layouts.
        screened_of: a layout's screened candidate (or its simulated one where it cannot be
            screened: ``screened`` is then ``False``).
        simulated_of: a layout's simulated candidate.
        budget: bytes per device.
        confirm: simulated layouts that fit to reach before stopping.
        references: how many reference runs the screen has made so far.

    Returns:
        The candidates in ``choices``' order and the :class:`Screening`.
    """
    out = {c: screened_of(c) for c in choices}
    best: list[float] = [c.time.total for c in out.values() if not c.screened and c.fits]
    mem_err: list[float] = []
    time_err: list[float] = []
    for choice in sorted(choices, key=lambda c: out[c].time.total):
        cand = out[choice]
        if not cand.screened or cand.memory_bytes > budget * (1 + MEMORY_MARGIN):
            continue
        if len(best) >= confirm and cand.time.total > min(best) * (1 + TIME_MARGIN):
            break
        sim = out[choice] = simulated_of(choice)
        mem_err.append(cand.memory_bytes / sim.memory_bytes - 1)
        time_err.append(cand.time.total / sim.time.total - 1 if sim.time.total else 0.0)
        if sim.fits:
            best.append(sim.time.total)
    return [out[c] for c in choices], Screening(len(choices), references(), len(mem_err),
                                                tuple(mem_err), tuple(time_err))
