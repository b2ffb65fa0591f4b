"""A pipeline stage's peak memory over more microbatches than it was simulated with.

Under 1F1B a stage runs a warm-up (forwards only), a steady state of one forward and one
backward in turn, and a cool-down (backwards only). From ``pp + 1`` microbatches on every stage
has a steady state in which forwards run while the parameters' gradients already exist, and
each microbatch leaves something live to the step's end: its input chunk (the schedule splits
the batch at the start), on the last stage its output (torch's schedule keeps every
microbatch's output to merge them when the step ends, and the merge is one more copy of them
all). So one more microbatch adds one steady pair of calls, and the live bytes at a call that
keeps its place counted from the step's start (the warm-up, the early pairs) or from its end
(the late pairs, the cool-down, the merge) are affine in the microbatch count.

:func:`extend_points` takes the call points of two simulations of the stage, at ``m`` and
``m + 1`` microbatches (both ``pp + 1`` or more), lines their calls up (from the end as far as
they agree, then from the start; the second's extra calls are runs that repeat the run before
or after them: one call in each per-microbatch group at the start, a steady pair before the
common end), and evaluates every call of the second at the step's count along its line: the
peak is the largest, ties to the earliest call as the memory tracker's own peak. A stage of
many layers does this at each of its small layer counts before they are put together
(:func:`at_step`). Checked against simulating every microbatch in
``tests/plan/test_more_microbatches.py`` (not at run time: a third simulation would cost more
than the two).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from flopscope.distributed.repeat import SMALL, Frame, NotRepeating, expand_report
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate import MemoryProfile
from flopscope.plan.layers import UNITS, Put, Small, check, combine, estimate_at

__all__ = ["at_step", "extend_points", "peak_of"]


def _line_up(sa: Sequence[tuple[str, str, str]], sb: Sequence[tuple[str, str, str]]
             ) -> list[tuple[int, int]]:
    """For each call of ``sb`` (the step with one microbatch more than ``sa``'s) its line, as
    ``(k, j)``: ``sb[k]`` and ``sa[j]`` are the same call one microbatch apart. The calls of
    the longest common end are lined up from the end; the others from the start, where
    ``sb`` may have runs of calls more, each repeating the run after or before it (the extra
    microbatch's input chunk; its steady forward-backward pair, just before the common end):
    an inserted call's line is that next (or previous) run's call's."""
    extra = len(sb) - len(sa)
    if extra <= 0:
        raise NotRepeating("one microbatch more made no more calls")
    tail = 0
    while tail < len(sa) and sa[-1 - tail] == sb[-1 - tail]:
        tail += 1
    partner = {k: k - extra for k in range(len(sb) - tail, len(sb))}
    runs: dict[int, int] = {}  # an inserted call -> the call one run before or after it
    head_a, head_b = len(sa) - tail, len(sb) - tail
    i = j = 0
    while j < head_b:
        if i < head_a and sa[i] == sb[j]:
            partner[j] = i
            i, j = i + 1, j + 1
            continue
        # the shortest run of calls here that repeats the run before or after it, after which
        # the calls line up again (at the common end, all that is left)
        fits = [n for n in range(1, extra - len(runs) + 1)
                if (j + n == head_b if i == head_a else j + n < head_b and sb[j + n] == sa[i])
                and (sb[j:j + n] == sb[j + n:j + 2 * n] or j >= n and sb[j:j + n] == sb[j - n:j])]
        if not fits:
            raise NotRepeating("one microbatch more is not runs of calls repeated")
        n = fits[0]
        after = sb[j:j + n] == sb[j + n:j + 2 * n]
        runs.update((j + t, j + t + n if after else j + t - n) for t in range(n))
        j += n
    if i != head_a or len(runs) != extra:
        raise NotRepeating("one microbatch more is not runs of calls repeated")
    out = []
    for k in range(len(sb)):
        line, hops = k, 0
        while line in runs and hops <= len(runs):
            line, hops = runs[line], hops + 1
        if line not in partner:
            raise NotRepeating("inserted runs of calls repeat one another only")
        out.append((line, partner[line]))
    return out


def extend_points(a: Sequence[Point], b: Sequence[Point], microbatches: int, to: int
                  ) -> list[Point]:
    """``b``'s call points, each moved along its line to ``to`` microbatches (see the module
    docstring): what is live at each call of the stage's step at ``to`` microbatches, for the
    calls that keep their place from the step's start or end (the pairs between hold no
    more than these).

    Args:
        a: the call points (module, phase, operator, live bytes by category) with one
            microbatch fewer.
        b: the call points at ``microbatches``.
        microbatches: ``b``'s microbatch count.
        to: the step's microbatches (``microbatches`` or more).

    Returns:
        The points, in ``b``'s order.

    Raises:
        NotRepeating: ``b`` is not ``a`` with one run of calls more between a common start
            and a common end, or a count falls below zero along its line.
    """
    lines = _line_up([p[:3] for p in a], [p[:3] for p in b])
    steps = to - microbatches
    out: list[Point] = []
    for (module, phase, op, live), (k, j) in zip(b, lines, strict=True):
        at_k, at_j = b[k][3], a[j][3]  # the line through a's call and b's: one microbatch
        moved = {c: live.get(c, 0) + steps * (at_k.get(c, 0) - at_j.get(c, 0))
                 for c in {*live, *at_k, *at_j}}
        if min(moved.values(), default=0) < 0:
            raise NotRepeating("a live count falls below zero along its line")
        out.append((module, phase, op, moved))
    return out


def peak_of(points: Sequence[Point], end_bytes: int, memory: MemoryProfile) -> MemoryProfile:
    """The memory profile of call points: the largest total (ties to the earliest call, as the
    memory tracker's own peak), where, what is live then; ``end_bytes`` at the end; whether a
    training step and the note from ``memory``.

    Args:
        points: the call points.
        end_bytes: bytes live at the end.
        memory: a profile of the same run (its ``train`` and ``note``).

    Returns:
        The profile (no per-module marks or timeline).
    """
    best: tuple[int, int] = (-1, 0)
    for i, (_, _, _, live) in enumerate(points):
        total = sum(live.values())
        if total > best[0]:
            best = (total, i)
    total, i = best
    module, phase, op, live = points[i]
    return MemoryProfile(total, module, phase, op, {c: v for c, v in live.items() if v},
                         end_bytes, train=memory.train, note=memory.note)


def at_step(run: Callable[[int, int | None], Small], microbatches: int, to: int,
            layers: Frame | None) -> Put:
    """A stage at ``to`` microbatches from its simulations at ``microbatches - 1`` and
    ``microbatches``: the peak from :func:`extend_points` and :func:`peak_of`, the report and
    estimate affine in the count (a step's per-microbatch work and its once-per-step
    collectives alike). With ``layers`` (a stage of more than ``sum(SMALL)`` layers, where they
    are), from those of ``SMALL``'s layer counts, each moved to ``to`` and the three put
    together at the stage's layers by :func:`~flopscope.plan.layers.combine`, checked exact at
    the third.

    Args:
        run: ``run(m, n)``: the stage simulated over ``m`` microbatches with ``n`` layers per
            stage (``None``: the model's own).
        microbatches: the simulated count (``pp + 2``).
        to: the step's microbatches.
        layers: where the stage's layers are, for a stage put together from small counts.

    Returns:
        The report, memory profile, estimate and parameter shards at ``to`` microbatches.

    Raises:
        NotRepeating: the calls do not line up, or the small counts do not repeat.
    """
    def moved(n: int | None) -> Small:
        a, b = run(microbatches - 1, n), run(microbatches, n)
        points = extend_points(a.points, b.points, microbatches, to)
        end = b.memory.end_bytes + (to - microbatches) * (b.memory.end_bytes -
                                                          a.memory.end_bytes)
        # no record is a microbatch's own (they are summed over the step): every one affine
        report = expand_report(a.report, Frame(UNITS, 0, microbatches - 1), b.report,
                               Frame(UNITS, 0, microbatches), Frame(UNITS, 0, to), 0)
        return dataclasses.replace(b, report=report, points=points,
                                   memory=peak_of(points, end, b.memory),
                                   estimate=estimate_at(a.estimate, b.estimate, microbatches,
                                                        to))

    if layers is None:
        return Put.of(moved(None))
    smalls = [moved(n) for n in SMALL]
    check(smalls[0], smalls[1], smalls[2])
    return combine(smalls[0], smalls[1], smalls[2], layers)
