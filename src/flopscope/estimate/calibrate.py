"""Calibrate a hardware profile: microbenchmarks flopscope runs itself (:func:`calibrate`).

Each point is one operator on one shape (:mod:`flopscope.estimate.workloads`: generic shapes, no
model's), run eagerly from Python as a model runs it, timed per call: a warm-up call, then three
batches of calls sized to about ``budget_s`` each, the median batch's time per call (on CUDA,
CUDA events around each batch; on the CPU the wall clock). Its FLOPs and bytes are what
flopscope counts for the same call (one counted run of it), so points and predictions use one
unit, and its operator is the ATen operator flopscope records for it.

How a call is timed and counted: :mod:`flopscope.estimate.timers`; the host's costs beside
the operators (per eager call, per family and per operator, after evicted caches, per page
fault, per module call): :mod:`flopscope.estimate.host_probes`.
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable

import torch

from flopscope.errors import UsageError
from flopscope.estimate.calibration import Calibration, Point
from flopscope.estimate.chains import chain_points
from flopscope.estimate.framework import framework_costs
from flopscope.estimate.host_probes import (
    EVICTIONS,
    evicted_host_times,
    fault_cost,
    host_times,
    module_call_time,
    op_host_times,
)
from flopscope.estimate.profile import Hardware
from flopscope.estimate.timers import clock, counted_call, time_in_rotation, time_per_call
from flopscope.estimate.workloads import Workload, workloads

__all__ = ["calibrate", "calibration_points"]


def calibration_points(device: str = "cpu", *, budget_s: float = 0.01,
                       progress: Callable[[str], None] | None = None) -> list[Point]:
    """Time every microbenchmark (see the module docstring) on ``device``: on a CPU, the
    families of :data:`~flopscope.estimate.families.ROTATED_FAMILIES` in rotation within their
    group (:func:`time_in_rotation`), the others each in a loop of itself
    (:func:`time_per_call`: the streaming operators' activations stay in the caches, as a model's
    just-written ones do; their host time's growth in a model is measured apart,
    :func:`evicted_host_times`).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: the time of one timed batch.
        progress: called with a line per group.

    Returns:
        The points.
    """
    from flopscope.estimate.families import ROTATED_FAMILIES

    points: list[Point] = []
    with torch.no_grad():
        groups: dict[str, list[Workload]] = {}
        for w in workloads(device):
            groups.setdefault(w.group, []).append(w)
        for group, todo in groups.items():
            start = time.perf_counter()
            counted = [counted_call(w.fn) for w in todo]
            rotated = [i for i, c in enumerate(counted)
                       if c.family in ROTATED_FAMILIES and not device.startswith("cuda")]
            seconds = dict(zip(rotated, time_in_rotation([todo[i].fn for i in rotated], device,
                                                         budget_s=budget_s), strict=True))
            for i, (w, c) in enumerate(zip(todo, counted, strict=True)):
                t = seconds[i] if i in seconds else time_per_call(w.fn, device, budget_s=budget_s)
                points.append(Point(c.family, w.dtype, w.what, c.flops, c.bytes, t, c.function,
                                    c.inplace, c.op, c.reduction, c.fresh))
            if progress is not None:
                progress(f"{group}: {time.perf_counter() - start:.1f} s")
    return points


def calibrate(hardware: Hardware, *, device: str | None = None, threads: int | None = None,
              budget_s: float = 0.01,
              progress: Callable[[str], None] | None = None) -> Hardware:
    """Calibrate ``hardware`` on the machine this runs on: the microbenchmarks' raw points, the
    host time per call (:mod:`flopscope.estimate.calibration`) and, last, the chains of layers
    over fresh outputs timed whole against what the points predict for them
    (:mod:`flopscope.estimate.chains`), stored in a copy of the profile, from which estimates
    predict time (:mod:`flopscope.estimate.predict`).

    Args:
        hardware: the profile the calibration is stored in (its peaks stay the bound's).
        device: ``"cpu"`` or ``"cuda"``; ``None``: CUDA when available, else the CPU.
        threads: torch's intra-op threads during the run (put back after); ``None``: as set.
        budget_s: the time of one timed batch (three per point).
        progress: called with a line per group of points.

    Returns:
        The calibrated profile.

    Raises:
        UsageError: ``cuda`` without a CUDA device, or threads below 1.
    """
    import dataclasses
    from importlib.metadata import PackageNotFoundError, version

    try:  # the installed version (the package's __init__ would be an import cycle)
        __version__ = version("flopscope")
    except PackageNotFoundError:  # run from a source tree that is not installed
        __version__ = "unknown"

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"calibrate: device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("calibrate: device 'cuda' asked for, but torch sees no CUDA device; "
                         "use device='cpu'")
    if threads is not None and threads < 1:
        raise UsageError(f"calibrate: threads must be at least 1, not {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        mmap_bytes, fault = fault_cost(device)  # first: before the heap has grown
        host = host_times(device)
        host_op = op_host_times(device)
        evicted = evicted_host_times(device)
        module_s = module_call_time(device)
        dtensor_s, fsdp_s = framework_costs(clock(device)[1])  # host time: any device
        points = calibration_points(device, budget_s=budget_s, progress=progress)
        name = device if device == "cpu" else f"cuda ({torch.cuda.get_device_name()})"
        calibration = Calibration(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            device=name if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
            threads=torch.get_num_threads(),
            versions={"torch": torch.__version__, "flopscope": __version__,
                      "python": platform.python_version()},
            host_s=host, points=tuple(points), host_op_s=host_op, clock=clock(device)[0],
            host_evicted_s=evicted, evictions=EVICTIONS if evicted else (), mmap_bytes=mmap_bytes,
            fault_s_per_byte=fault, module_call_s=module_s, dtensor_call_s=dtensor_s,
            fsdp_collective_s=fsdp_s)
        # last: the chains' prediction is the points'
        chained = chain_points(dataclasses.replace(hardware, calibration=calibration), device,
                               lambda fn, dev: time_per_call(fn, dev, budget_s=2 * budget_s))
    finally:
        torch.set_num_threads(before)
    return dataclasses.replace(hardware, calibration=dataclasses.replace(calibration,
                                                                         chains=chained))
