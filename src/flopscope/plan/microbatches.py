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

:func:`extend_peak` takes the call points of two simulations of the stage, at ``m`` and
``m + 1`` microbatches (both ``pp + 1`` or more), lines their calls up from both ends (the
second has one pair more, between the lines), and evaluates every call of the second at the
step's count along its line: the peak is the largest, ties to the earliest call as the memory
tracker's own peak. Checked against simulating every microbatch in ``tests/plan/
test_microbatches.py`` (not at run time: a third simulation would cost more than the two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flopscope.distributed.repeat import NotRepeating
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate import MemoryProfile

__all__ = ["extend_peak"]


def _common(a: Sequence[tuple[str, str, str]], b: Sequence[tuple[str, str, str]]) -> int:
    """How many leading entries ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _at(b: Mapping[str, int], a: Mapping[str, int], steps: int) -> dict[str, int]:
    """``b`` moved ``steps`` microbatches further along the line from ``a`` to ``b``."""
    return {c: b.get(c, 0) + steps * (b.get(c, 0) - a.get(c, 0)) for c in {*a, *b}}


def extend_peak(a: Sequence[Point], b: Sequence[Point], microbatches: int, to: int,
                memory_a: MemoryProfile, memory_b: MemoryProfile) -> MemoryProfile:
    """The stage's memory profile at ``to`` microbatches from its call points at
    ``microbatches - 1`` (``a``) and ``microbatches`` (``b``).

    Args:
        a: the call points (module, phase, operator, live bytes by category) with one
            microbatch fewer.
        b: the call points at ``microbatches``.
        microbatches: ``b``'s microbatch count.
        to: the step's microbatches (``microbatches`` or more).
        memory_a: ``a``'s memory profile (its bytes at the end).
        memory_b: ``b``'s (its bytes at the end, whether a training step, its note).

    Returns:
        The profile: the peak, where it is reached, what is live then and at the end; no
        per-module marks or timeline.

    Raises:
        NotRepeating: ``b`` is not ``a`` with one run of calls more between a common start
            and a common end, or a count falls below zero along its line.
    """
    sa, sb = [p[:3] for p in a], [p[:3] for p in b]
    extra = len(b) - len(a)
    head = _common(sa, sb)
    tail = _common(sa[::-1], sb[::-1])
    if extra <= 0 or head + tail < len(a):
        raise NotRepeating("one microbatch more is not one run of calls more")
    steps = to - microbatches
    best: tuple[int, int, dict[str, int]] = (-1, -1, {})
    for i, (_, _, _, live) in enumerate(b):
        if i < head:  # in place from the step's start
            moved = _at(live, a[i][3], steps)
        elif i >= len(b) - tail:  # in place from its end
            moved = _at(live, a[i - extra][3], steps)
        else:  # the pair one more microbatch added: its line is the next pair's
            if sb[i] != sb[i + extra]:
                raise NotRepeating("the added calls are not a repeat of the next ones")
            nxt = b[i + extra][3]
            moved = {c: live.get(c, 0) + steps * (nxt.get(c, 0) - a[i][3].get(c, 0))
                     for c in {*live, *nxt}}
        if min(moved.values(), default=0) < 0:
            raise NotRepeating("a live count falls below zero along its line")
        total = sum(moved.values())
        if total > best[0]:
            best = (total, i, moved)
    total, i, live = best
    module, phase, op, _ = b[i]
    end = memory_b.end_bytes + steps * (memory_b.end_bytes - memory_a.end_bytes)
    return MemoryProfile(total, module, phase, op, {c: v for c, v in live.items() if v}, end,
                         train=memory_b.train, note=memory_b.note)
