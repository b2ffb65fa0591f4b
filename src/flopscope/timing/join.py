"""Joining counted operator calls to what ``torch.profiler`` measured.

A count sees each operator call at PyTorch's Python dispatch key (:mod:`flopscope.core.mode`);
the profiler records every operator the dispatcher enters, with its start, duration, thread and
nesting: composite operators above the call (``aten::linear`` around ``aten::addmm``), the
operators a kernel dispatches inside it (``aten::addmm``'s ``aten::copy_``), and on CUDA the
kernels each operator launched. The join walks the calls of a run in order and takes, for each,
the next profiler event of its name on the counting thread that starts after the previous match
ended: its children are inside it, its parents started before it and are skipped, so each call
gets the event of its own dispatch. The run's measured time is then split into the matched
events (each counted call's time) and the rest of the region (Python, module hooks, composite
wrappers, launch gaps): nothing is dropped, and the parts add up to the region's wall time.

The measured runs of :func:`flopscope.profile` are made without flopscope's dispatch mode (see
:mod:`flopscope.timing.run`), so the times carry none of flopscope's own overhead; the join needs
only the calls' names and order, which the count gives. A block counted and measured in one run
(:func:`flopscope.profiling`) runs under the counting mode: each operator's event then holds the
mode's work and, nested in it, the operator dispatched again below the mode, an event of the same
name: :func:`innermost` finds it, the operator's own time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["REGION", "Event", "device_events", "events_of", "innermost", "match",
           "region_events"]

_LOOKAHEAD = 4  # following calls whose events a call may not jump over

REGION = "flopscope::region"
"""The name of the ``record_function`` range around each measured run."""


@dataclass(frozen=True)
class Event:
    """One profiler event, as the join needs it.

    Attributes:
        name: the operator (``aten::addmm``) or range name.
        start_us: its start, microseconds on the profiler's clock.
        end_us: its end.
        thread: the thread it ran on.
        device_us: the time of the device kernels it launched, itself and below (0 on the CPU).
        kind: ``"op"`` for an operator or range on the CPU side.
    """

    name: str
    start_us: float
    end_us: float
    thread: int
    device_us: float = 0.0
    kind: str = "op"

    @property
    def dur_us(self) -> float:
        """Its duration."""
        return self.end_us - self.start_us


def _on_device(e: Any) -> bool:
    """Whether a ``FunctionEvent`` is a device's (a kernel, a copy), not the host's."""
    return not str(getattr(e, "device_type", "")).endswith("CPU")


def device_events(function_events: Iterable[Any]) -> list[Any]:
    """The device-side events (kernels, copies) of ``torch.profiler``'s ``prof.events()``.

    Args:
        function_events: ``FunctionEvent`` objects.

    Returns:
        Those that ran on a device, in order.
    """
    return [e for e in function_events if _on_device(e)]


def events_of(function_events: Iterable[Any]) -> list[Event]:
    """The CPU-side events of ``torch.profiler``'s ``prof.events()``, sorted by start.

    Args:
        function_events: ``FunctionEvent`` objects.

    Returns:
        The events, with each one's device (kernel) time where it launched kernels.
    """
    out = []
    for e in function_events:
        if _on_device(e):
            continue  # a kernel itself: counted through the operator that launched it
        device = float(getattr(e, "device_time_total", 0.0) or 0.0)
        out.append(Event(e.name, float(e.time_range.start), float(e.time_range.end),
                         int(e.thread), device))
    out.sort(key=lambda ev: (ev.start_us, -ev.end_us))
    return out


def region_events(events: Sequence[Event]) -> list[tuple[Event, list[Event]]]:
    """Each measured run's region event and the events inside it, in order of start.

    The region's own thread, and another thread's events while the region's thread is in none
    of its own: on CUDA the autograd engine runs a backward on a thread of its own per device
    while the thread that called ``backward()`` waits (on the CPU it runs on the calling thread),
    so a training step's backward calls are there. Another thread's work that overlaps the
    region thread's operators (a thread running beside the model) is not this run's.

    Args:
        events: every event of a profile, sorted by start.

    Returns:
        (region, events inside it) per run.
    """
    out = []
    for r in (e for e in events if e.name == REGION):
        inside = [e for e in events if e is not r and e.name != REGION
                  and r.start_us <= e.start_us and e.end_us <= r.end_us]
        busy: list[list[float]] = []  # the region thread's top-level spans, merged
        for e in inside:
            if e.thread != r.thread:
                continue
            if busy and e.start_us <= busy[-1][1]:
                busy[-1][1] = max(busy[-1][1], e.end_us)
            else:
                busy.append([e.start_us, e.end_us])
        starts = [lo for lo, _ in busy]

        def overlaps_busy(e: Event, busy: list[list[float]] = busy,
                          starts: list[float] = starts) -> bool:
            # the spans are disjoint and sorted: only the last one starting before e ends can
            # overlap it (a scan of every span made a long backward quadratic)
            k = bisect_left(starts, e.end_us) - 1
            return k >= 0 and busy[k][1] > e.start_us

        out.append((r, [e for e in inside if e.thread == r.thread or not overlaps_busy(e)]))
    return out


def match(names: Sequence[str], events: Sequence[Event]) -> list[int | None]:
    """For each call (by operator name, in order), the index of its event in ``events``.

    A call takes the next event of its name that starts at or after the end of the previous
    call's event (so a matched event's children and enclosing parents are never taken). Some
    calls have no event of their own (autograd's ``detach`` of a tensor it saves, the gradient
    ``add`` of its input buffers): such a call would take a later event of its name and push
    every call after it out of place, so a call is taken to have none when one of the next few
    calls (of another name) has an event before the candidate. A call with no event gets ``None``, and the search for the
    next call starts where this one did.

    Args:
        names: the calls' operator names (``aten::addmm``), in the order they ran.
        events: the events of the same run and thread, sorted by start.

    Returns:
        One index (or ``None``) per call.
    """
    n = len(events)

    def first(name: str, j: int, last_end: float) -> int:
        k = j
        while k < n and not (events[k].name == name and events[k].start_us >= last_end):
            k += 1
        return k

    found: list[int | None] = []
    j = 0
    last_end = float("-inf")
    for i, name in enumerate(names):
        k = first(name, j, last_end)
        # the next few calls of other names: when one of them has an event before this call's
        # candidate, this call has no event of its own (it would jump over theirs)
        ahead = {m for m in names[i + 1:i + 1 + _LOOKAHEAD] if m != name}
        if k == n or any(first(m, j, last_end) < k for m in ahead):
            found.append(None)
            continue
        found.append(k)
        last_end = events[k].end_us
        j = k + 1
    return found


def innermost(events: Sequence[Event], k: int) -> int:
    """The index of the innermost event of ``events[k]``'s name nested in it (``k`` itself when
    there is none): under a dispatch mode the operator runs again below the mode, inside the
    event of its call.

    Args:
        events: events of one thread, sorted by start.
        k: the matched event.

    Returns:
        The index of the operator's own event.
    """
    outer = events[k]
    j = k + 1
    while j < len(events) and events[j].start_us <= outer.end_us:
        ev = events[j]
        if ev.name == outer.name and ev.end_us <= outer.end_us and ev.thread == outer.thread:
            return innermost(events, j)
        j += 1
    return k
