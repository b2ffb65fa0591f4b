"""A measured run as a trace the usual viewers open: Chrome trace / Perfetto JSON (the format
``torch.profiler`` writes: ``traceEvents`` of complete events, ``ph: "X"``, ``ts`` and ``dur`` in
microseconds, everything else in ``args``; ``distributedInfo`` with the rank for Holistic Trace
Analysis).

The measured trace has one track of the counted operator calls (each with its module path, phase,
FLOPs, bytes, achieved rates and, with a hardware profile, its roofline bound and efficiency) and
one track of module spans. The estimated trace lays each call's roofline time (a lower bound)
end to end on the same time axis, so the two can be opened side by side.

Times are written in whole nanoseconds (microseconds with three decimals, as ``torch.profiler``
writes them): each event's start and end are rounded to the nanosecond and its duration is their
difference, so an event inside another in the run stays inside it in the file, and the estimated
calls meet end to end exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flopscope.timing.run import CallTime, Timing

__all__ = ["estimated_trace", "measured_trace", "write_trace"]

_PID = 0
_OPS, _MODULES = 1, 2  # thread ids of the two tracks


def _call_args(c: CallTime) -> dict[str, Any]:
    args: dict[str, Any] = {"module": c.module or "(root)", "phase": c.phase.value,
                            "macs": c.cost.macs, "flops": c.cost.flops, "bytes": c.cost.bytes,
                            "call": c.index}
    if c.seconds:
        args["flops_per_s"] = c.cost.flops / c.seconds
        args["bytes_per_s"] = c.cost.bytes / c.seconds
    if c.bound is not None:
        args["bound_us"] = c.bound.time_s * 1e6
        args["bound"] = c.bound.bound
        if c.seconds:
            args["efficiency"] = c.bound.time_s / c.seconds
    return args


def _span(start_s: float, end_s: float) -> dict[str, float]:
    """``ts`` and ``dur`` (microseconds) of an event from ``start_s`` to ``end_s`` (seconds),
    both ends rounded to the nanosecond so that rounding never moves one event out of another."""
    start_ns, end_ns = round(start_s * 1e9), round(end_s * 1e9)
    return {"ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3}


def _meta(name: str, tid: int, label: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": _PID, "tid": tid, "args": {"name": label}}


def _header(what: str) -> list[dict[str, Any]]:
    return [{"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": what}},
            _meta("thread_name", _OPS, "operators (counted calls)"),
            _meta("thread_name", _MODULES, "modules")]


def measured_trace(timing: Timing, *, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """The median run as a trace: operator calls and module spans, times from the run's start.

    Args:
        timing: what :func:`~flopscope.timing.profile` measured.
        rank: the rank in a distributed job (for HTA).
        world_size: ranks in the job.

    Returns:
        The trace as JSON-ready data.
    """
    events = _header("flopscope: measured")
    for c in timing.calls:
        if c.runs[timing.median_run] is None:
            continue
        events.append({"name": c.op, "cat": "cpu_op" if timing.device == "cpu" else "kernel",
                       "ph": "X", **_span(c.start_s, c.start_s + c.seconds), "pid": _PID,
                       "tid": _OPS, "args": _call_args(c)})
    for path, start, end in timing.modules:
        events.append({"name": path, "cat": "user_annotation", "ph": "X", **_span(start, end),
                       "pid": _PID, "tid": _MODULES, "args": {"module": path}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "flopscope": {"wall_us": timing.wall_s * 1e6, "outside_us": timing.outside_s * 1e6,
                          "device": timing.device, "runs": len(timing.walls)},
            "distributedInfo": {"backend": "none", "rank": rank, "world_size": world_size},
            "deviceProperties": [], "traceName": "flopscope measured run"}


def estimated_trace(timing: Timing, *, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """Each counted call's roofline time (a lower bound) laid end to end, on the measured
    trace's time axis (both start at 0).

    A call whose bound rounds to no nanosecond on this axis (a view, an allocation: no FLOPs,
    no bytes) takes no time and is left out, counted in ``flopscope.zero_time_calls``: a
    zero-length event where the next call starts is read by Perfetto and by HTA as that call's
    child (both put the longer of two events starting together outside the shorter).

    Args:
        timing: what was measured, with a hardware profile.
        rank: the rank in a distributed job.
        world_size: ranks in the job.

    Returns:
        The trace as JSON-ready data.

    Raises:
        ValueError: the timing has no hardware profile (no bounds).
    """
    if timing.hardware is None:
        raise ValueError("an estimated trace needs a hardware profile (the roofline bounds)")
    events = _header(f"flopscope: roofline on {timing.hardware.name} (lower bound)")
    clock, zero = 0.0, 0
    for c in timing.calls:
        if c.bound is None:
            continue
        span = _span(clock, clock + c.bound.time_s)
        clock += c.bound.time_s
        if not span["dur"]:
            zero += 1
            continue
        events.append({"name": c.op, "cat": "cpu_op", "ph": "X", **span, "pid": _PID,
                       "tid": _OPS, "args": _call_args(c)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "flopscope": {"zero_time_calls": zero, "hardware": timing.hardware.name},
            "distributedInfo": {"backend": "none", "rank": rank, "world_size": world_size},
            "deviceProperties": [], "traceName": "flopscope estimated run"}


def write_trace(trace: dict[str, Any], path: str | Path) -> None:
    """Write a trace as JSON (Perfetto, chrome://tracing and HTA open it).

    Args:
        trace: from :func:`measured_trace` or :func:`estimated_trace`.
        path: the file.
    """
    Path(path).write_text(json.dumps(trace) + "\n")
