"""Calibrate a hardware profile: microbenchmarks flopscope runs itself (:func:`calibrate`).

Each point is one operator on one shape (:mod:`flopscope.estimate.workloads`: generic shapes, no
model's), run eagerly from Python as a model runs it, timed per call in five passes over all the
points (:func:`calibration_points`): in each, a warm-up call, then three batches of calls sized
to about ``budget_s / 5`` each (or rounds of a rotation); the median of the batches no other
process preempted, over the passes (on CUDA, CUDA events around each batch; on the CPU
:func:`~flopscope.estimate.timers.clock`). Its FLOPs and bytes are what
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
    after_host_times,
    evicted_host_times,
    fault_cost,
    host_times,
    median_rows,
    median_table,
    module_call_time,
    op_host_times,
)
from flopscope.estimate.profile import Hardware
from flopscope.estimate.regime import parallel_add_s
from flopscope.estimate.timers import (
    Sample,
    batch_samples,
    clock,
    counted_call,
    robust_median,
    rotation_samples,
    time_per_call,
)
from flopscope.estimate.workloads import Workload, workloads

__all__ = ["calibrate", "calibration_points"]


def calibration_points(device: str = "cpu", *, budget_s: float = 0.01, passes: int = 5,
                       progress: Callable[[str], None] | None = None,
                       before_pass: Callable[[int], None] | None = None) -> list[Point]:
    """Time every microbenchmark (see the module docstring) on ``device`` in ``passes`` passes
    over all of them, each point's time the :func:`robust_median` of its samples of every pass:
    a point's samples are spread over the whole calibration, so a moment of contention on a
    shared machine (another process on the other core, a burst of load) moves one pass of it,
    not the point. On a CPU, the families of
    :data:`~flopscope.estimate.families.ROTATED_FAMILIES` are timed in rotation within their
    group (:func:`rotation_samples`), the others each in a loop of itself
    (:func:`batch_samples`: the streaming operators' activations stay in the caches, as a
    model's just-written ones do; their host time's growth in a model is measured apart,
    :func:`evicted_host_times`). Each pass spends ``1 / passes`` of a point's time, about three
    ``budget_s`` per point in all whatever the passes: a loop-timed point three batches of
    ``budget_s / passes`` after a warm-up call in the first pass, then up to three batches in
    each other (one call, without a warm-up, where a call takes the pass's share).

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        budget_s: about a third of a point's time in all (above).
        passes: how many passes (at least 1).
        progress: called with a line per group of each pass.
        before_pass: called with each pass's index before it (the host probes' runs).

    Returns:
        The points.
    """
    from flopscope.estimate.families import ROTATED_FAMILIES

    if passes < 1:
        raise UsageError(f"calibrate: passes must be at least 1, not {passes}")
    with torch.no_grad():
        groups: dict[str, list[Workload]] = {}
        for w in workloads(device):
            groups.setdefault(w.group, []).append(w)
        todo = [w for group in groups.values() for w in group]
        counted = [counted_call(w.fn) for w in todo]
        samples: list[list[Sample]] = [[] for _ in todo]
        once: list[float | None] = [None] * len(todo)
        rounds = (-(-5 // passes), -(-200 // passes))  # 5-200 rounds in all, as in one pass
        share = 3 * budget_s / passes  # a loop-timed point's time in one pass
        for p in range(passes):
            if before_pass is not None:
                before_pass(p)
            first = 0
            for group, members in groups.items():
                start = time.perf_counter()
                index = range(first, first + len(members))
                first += len(members)
                rotated = [i for i in index if counted[i].family in ROTATED_FAMILIES
                           and not device.startswith("cuda")]
                for i, s in zip(rotated, rotation_samples(
                        [todo[i].fn for i in rotated], device, budget_s=budget_s / passes,
                        rounds=rounds), strict=True):
                    samples[i] += s
                for i in index:
                    if i in rotated:
                        continue
                    took = once[i]
                    if took is None:  # the first pass: a warm-up call, one to size the batches
                        s, once[i] = batch_samples(todo[i].fn, device,
                                                   budget_s=budget_s / passes)
                    else:  # a pass's share, in up to 3 batches; a long call's without warm-up
                        k = int(min(3, max(1, share / took)))
                        s, _ = batch_samples(todo[i].fn, device, budget_s=share / k, batches=k,
                                             once=took, warm=3 * took < share)
                    samples[i] += s
                if progress is not None:
                    progress(f"pass {p + 1}/{passes}, {group}: "
                             f"{time.perf_counter() - start:.1f} s")
    return [Point(c.family, w.dtype, w.what, c.flops, c.bytes, max(robust_median(s), 1e-9),
                  c.function, c.inplace, c.op, c.reduction, c.fresh)
            for w, c, s in zip(todo, counted, samples, strict=True)]


def calibrate(hardware: Hardware, *, device: str | None = None, threads: int | None = None,
              budget_s: float = 0.01, passes: int = 5,
              progress: Callable[[str], None] | None = None, chains: bool = False) -> Hardware:
    """Calibrate ``hardware`` on the machine this runs on: the microbenchmarks' raw points, the
    host time per call (:mod:`flopscope.estimate.calibration`) and, with ``chains``, last, the
    chains of layers over fresh outputs timed whole against what the points predict for them
    (:mod:`flopscope.estimate.chains`), stored in a copy of the profile, from which estimates
    predict time (:mod:`flopscope.estimate.predict`). The chains are off by default since
    round 7: at 2 threads their factor moved the training steps' predictions 15-20% below
    the measured time at load 1-6 (docs/prediction.md, round 7).

    Args:
        hardware: the profile the calibration is stored in (its peaks stay the bound's).
        device: ``"cpu"`` or ``"cuda"``; ``None``: CUDA when available, else the CPU.
        threads: torch's intra-op threads during the run (put back after); ``None``: as set.
        budget_s: about a third of each point's time (:func:`calibration_points`).
        passes: the passes over the points (:func:`calibration_points`).
        progress: called with a line per group of points.
        chains: time the chains (at more than one thread; :func:`chain_points`) and store
            them: every call of their families is then predicted at their measured /
            predicted.

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
        module_s = module_call_time(device)
        # host time: any device
        dtensor_s, pointwise_s, fsdp_s = framework_costs(clock(device)[1])
        # the host probes: a share of them before each pass of the points, the median of the
        # runs (a moment of contention moves one run, not the probe)
        probes: list[tuple[dict[str, float], dict[str, float],
                           dict[str, tuple[float, ...]], dict[str, float]]] = []
        calls, samples = max(400 // passes, 40), max(9 // passes, 3)
        points = calibration_points(
            device, budget_s=budget_s, passes=passes, progress=progress,
            before_pass=lambda _: probes.append((
                host_times(device, calls=calls), op_host_times(device, calls=calls),
                evicted_host_times(device, samples=samples),
                after_host_times(device, samples=samples))))
        host = median_table([p[0] for p in probes])
        host_op = median_table([p[1] for p in probes])
        evicted = median_rows([p[2] for p in probes])
        after = median_table([p[3] for p in probes])
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
            dtensor_pointwise_s=pointwise_s, fsdp_collective_s=fsdp_s, host_after_s=after,
            parallel_add_s=parallel_add_s() if device == "cpu" else 0.0)  # the regime's probe
        # last, when asked: the chains' prediction is the points'
        chained = chain_points(dataclasses.replace(hardware, calibration=calibration), device,
                               lambda fn, dev: time_per_call(fn, dev,
                                                             budget_s=2 * budget_s / passes),
                               passes=passes) if chains else ()
    finally:
        torch.set_num_threads(before)
    return dataclasses.replace(hardware, calibration=dataclasses.replace(calibration,
                                                                         chains=chained))
