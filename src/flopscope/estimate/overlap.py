"""How a step's host, device and communication timelines overlap: ONE rule,
:func:`host_overlap`, and the split of a row of calls into the device's and the host's time
(:func:`row_parts`) that it takes. A training step's phases and communication
(:meth:`flopscope.estimate.comm_time.CommTime.exposure`: the planner's
:func:`flopscope.plan.timing.step_time` and a simulated rank's
:func:`flopscope.estimate.comm_time.rank_step`), a serving step
(:func:`flopscope.plan.serve_time.serve_step_time`) and a row of calls
(:func:`flopscope.plan.serve_time.row_seconds`) all take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flopscope.estimate.bound import Estimate, Row

__all__ = ["host_overlap", "phase_times", "row_parts"]


def host_overlap(host: float, device: float, comm: float = 0.0) -> tuple[float, float]:
    """THE rule of a GPU's step or phase: the host issues every kernel, collective and send
    without waiting for the device (a collective or a send is a kernel on a device stream,
    ordered between the work around it), so the time is the longer of the host's time and the
    device's work with its communication, ``max(host, device + comm)``, and the communication
    is exposed only beyond the time the device waits for the host,
    ``max(0, comm - max(0, host - device))``. On a CPU's prediction and at the roofline bound
    the host is 0 (one timeline): the time is ``device + comm``, every second of it exposed.

    Args:
        host: the host's time issuing the calls (seconds).
        device: the device's work (seconds).
        comm: device work the host does not wait for beside it (collectives, sends).

    Returns:
        (the time, the part of ``comm`` exposed).
    """
    return max(host, device + comm), max(0.0, comm - max(0.0, host - device))


def row_parts(row: Row, estimate: Estimate, *, bound: bool = False) -> tuple[float, float]:
    """A row of ``estimate``'s calls (a phase, a forward) as (device time, host time): on a
    GPU's prediction the sums of the calls' device and host times apart; on a CPU's prediction
    their sum and 0 (one timeline); at the roofline bound (``bound``, or without a
    calibration) the bound and 0.

    Args:
        row: the summed calls.
        estimate: the estimate they are of (its profile's calibration).
        bound: the roofline bound whatever the profile.

    Returns:
        (seconds of device work, seconds of host time beside it).
    """
    cal = estimate.hardware.calibration
    if bound or cal is None:
        return row.time_s, 0.0
    if cal.device.startswith("cuda"):
        return row.predicted_s - row.host_s, row.host_s
    return row.predicted_s, 0.0


def phase_times(estimate: Estimate, *, scale: float = 1.0,
                bound: bool = False) -> dict[str, tuple[float, float]]:
    """Each phase of a rank's step as (the phase's time, the device's wait for the host in
    it): the longer of its calls' host and device times (:func:`row_parts`,
    :func:`host_overlap`), the calls' times by ``scale`` (a step's microbatches over the
    simulated ones).

    Args:
        estimate: the rank's estimate.
        scale: the factor on every call's time.
        bound: the roofline bound whatever the profile (then no wait).

    Returns:
        Phase name -> (seconds, seconds of the device's wait), for the phases that ran.
    """
    out = {}
    for name, row in estimate.by_phase.items():
        device, host = row_parts(row, estimate, bound=bound)
        device, host = device * scale, host * scale
        out[name] = host_overlap(host, device)[0], max(0.0, host - device)
    return out
