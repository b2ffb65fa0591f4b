"""The collective probe: time collectives on a real process group of local processes and fit a
profile's link figures to them (``flopscope calibrate --comm``).

:func:`probe_links` spawns ``ranks`` processes (``torch.multiprocessing``, the ``spawn`` start
method; a file store in a temporary directory, no port), each with one intra-op thread, joined
in a process group of ``backend`` (gloo on CPUs, loopback here; NCCL with one GPU per rank).
They time all-reduce, all-gather, reduce-scatter, broadcast (over the whole group and, with
more than 2 ranks, over the first two) and send/recv (rank 0 to rank 1) at payloads of 1 KiB to
16 MiB (float32 tensors; payload and bus bytes by the conventions of
:mod:`flopscope.rules.collectives`). Each repetition is timed on every rank of its group from a
barrier to the return of a few calls back to back (16 at 1 KiB, 1 from 1 MiB; on a GPU, after a
device synchronisation), per call; a repetition's time is its slowest rank's, a point's the
median of ``repeats`` repetitions after one warm-up repetition.
:func:`calibrate_links` fits ``latency + bus bytes / bandwidth`` to the points
(:func:`flopscope.estimate.link_calibration.fit_alpha_beta`) and writes the fit into the
profile's link fields with the raw points (:class:`~flopscope.estimate.LinkCalibration`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from flopscope.errors import UsageError
from flopscope.estimate.link_calibration import LinkCalibration, LinkPoint
from flopscope.estimate.profile import Hardware
from flopscope.rules.collectives import BUS_FACTORS

__all__ = ["KINDS", "SIZES", "calibrate_links", "probe_links"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")
"""The collectives the probe times."""
SIZES = tuple(4**p for p in range(5, 13))
"""Payload bytes: 1 KiB to 16 MiB, by factors of 4."""
BACKENDS = ("gloo", "nccl")


def _call(kind: str, payload: int, n: int, group: Any, first: int, device: torch.device
          ) -> Callable[[], Any]:
    """One collective of ``payload`` bytes over ``group`` (of ``n`` ranks from ``first``)."""
    import torch.distributed as dist

    elems = max(n, payload // 4 // n * n)  # float32, a multiple of the group size
    if kind == "all_reduce":
        t = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(t, group=group)
    if kind == "all_gather":
        out, inp = torch.empty(elems, device=device), torch.ones(elems // n, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if kind == "reduce_scatter":
        inp, out = torch.ones(elems, device=device), torch.empty(elems // n, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if kind == "broadcast":
        t = torch.ones(elems, device=device)
        return lambda: dist.broadcast(t, src=first, group=group)
    t = torch.ones(elems, device=device)  # send: rank `first` to `first + 1`
    if dist.get_rank() == first:
        return lambda: dist.send(t, dst=first + 1)
    return lambda: dist.recv(t, src=first)


def _calls(size: int) -> int:
    """Calls per timed repetition: back to back, as a step issues them, so that the ranks'
    skew leaving the barrier is shared by several small calls (1 from 1 MiB up, 16 at 1 KiB)."""
    return max(1, min(16, 2**20 // size))


def _rank_main(rank: int, world: int, backend: str, store: str, out: str,
               sizes: Sequence[int], kinds: Sequence[str], repeats: int) -> None:
    """One probe process: time every (kind, group, size) and gather the times to rank 0."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_into_tensor's renaming
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        groups: list[tuple[int, Any]] = [(world, None)]
        if world > 2:
            groups.append((2, dist.new_group(ranks=[0, 1])))
        times: dict[str, list[float]] = {}
        for n, group in groups:
            for kind in kinds:
                if kind == "send" and n != 2:
                    continue
                member = rank < n
                for size in sizes:
                    fn = _call(kind, size, n, group, 0, device) if member else None
                    calls = _calls(size)
                    for i in range(repeats + 1):
                        dist.barrier()
                        start = time.perf_counter()
                        if fn is not None:
                            for _ in range(calls):
                                fn()
                            if device.type == "cuda":
                                torch.cuda.synchronize()
                        if fn is not None and i > 0:  # the first repetition warms up
                            times.setdefault(f"{kind}|{n}|{size}", []).append(
                                (time.perf_counter() - start) / calls)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def _points(gathered: Sequence[dict[str, list[float]]]) -> list[LinkPoint]:
    """Per (kind, group, size): each repetition's slowest rank, the median over repetitions."""
    points = []
    for key in gathered[0]:
        kind, n_s, size_s = key.split("|")
        n, size = int(n_s), int(size_s)
        ranks = [g[key] for g in gathered if key in g]
        slowest = [max(r[i] for r in ranks) for i in range(len(ranks[0]))]
        median = statistics.median(slowest)
        elems = max(n, size // 4 // n * n)
        payload = elems * 4
        bus = int(payload * BUS_FACTORS[kind](n))
        points.append(LinkPoint(kind, n, payload, bus, median,
                                (max(slowest) - min(slowest)) / median))
    return points


def probe_links(ranks: int = 2, *, backend: str = "gloo", sizes: Sequence[int] = SIZES,
                kinds: Sequence[str] = KINDS, repeats: int = 5,
                timeout_s: float = 600) -> list[LinkPoint]:
    """Time collectives on a real process group of ``ranks`` local processes (module docstring).

    Args:
        ranks: processes (at least 2).
        backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank).
        sizes: payload bytes.
        kinds: collectives (:data:`KINDS`).
        repeats: timed repetitions per point (after one warm-up call).
        timeout_s: the whole probe's limit.

    Returns:
        The points.

    Raises:
        UsageError: fewer than 2 ranks, an unknown backend or kind, NCCL without enough GPUs,
            a probe process that failed, or the time limit passed.
    """
    from torch.multiprocessing.spawn import (
        ProcessExitedException,
        ProcessRaisedException,
        start_processes,
    )

    if ranks < 2:
        raise UsageError(f"the collective probe needs at least 2 ranks, not {ranks}")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} for the collective probe: use "
                         f"{' or '.join(BACKENDS)}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"the probe does not time {', '.join(unknown)}; it times "
                         f"{', '.join(KINDS)}")
    if backend == "nccl" and torch.cuda.device_count() < ranks:
        raise UsageError(f"nccl with {ranks} ranks needs {ranks} GPUs; torch sees "
                         f"{torch.cuda.device_count()}: use --backend gloo or fewer --ranks")
    with tempfile.TemporaryDirectory(prefix="flopscope-probe-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "times.json")
        context = start_processes(
            _rank_main, args=(ranks, backend, store, out, tuple(sizes), tuple(kinds), repeats),
            nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise UsageError(f"the collective probe did not finish in {timeout_s:.0f} s "
                                     "(a rank hung?): try fewer --ranks")
        except ProcessRaisedException as e:
            last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise UsageError(f"a collective probe process failed ({backend}, {ranks} ranks): "
                             f"{last}") from None
        except ProcessExitedException as e:
            raise UsageError(f"a collective probe process died ({backend}, {ranks} ranks): "
                             f"{e}") from None
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
        gathered = json.loads(Path(out).read_text())
    return _points(gathered)


def calibrate_links(hardware: Hardware, ranks: int = 2, *, backend: str = "gloo",
                    link: str = "intra", sizes: Sequence[int] = SIZES, repeats: int = 5,
                    timeout_s: float = 600) -> Hardware:
    """Probe the links (:func:`probe_links`) and fit the profile's link fields to the points.

    Args:
        hardware: the profile to calibrate (its other figures kept, a compute calibration
            block included).
        ranks: processes.
        backend: ``gloo`` or ``nccl``.
        link: which link the ranks share: ``intra`` (one machine, as here) or ``inter``.
        sizes: payload bytes.
        repeats: repetitions per point.
        timeout_s: the probe's limit.

    Returns:
        A copy of ``hardware`` with the fit in ``intra_node_*`` (or ``inter_node_*``) and the
        :class:`~flopscope.estimate.LinkCalibration` block.

    Raises:
        UsageError: see :func:`probe_links`; an unknown link.
    """
    from importlib.metadata import PackageNotFoundError, version

    if link not in ("intra", "inter"):
        raise UsageError(f"link must be 'intra' or 'inter', not {link!r}")
    points = probe_links(ranks, backend=backend, sizes=sizes, repeats=repeats,
                         timeout_s=timeout_s)
    try:
        flopscope_version = version("flopscope")
    except PackageNotFoundError:
        flopscope_version = "unknown"
    host = (f"cuda ({torch.cuda.get_device_name()})" if backend == "nccl"
            else f"cpu ({platform.processor() or platform.machine()})")
    cal = LinkCalibration.of_points(
        points, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        backend=backend, ranks=ranks, link=link, host=host, threads=1,
        versions={"torch": torch.__version__, "flopscope": flopscope_version,
                  "python": platform.python_version()})
    fields = {f"{link}_node_bandwidth": cal.fit.bandwidth, f"{link}_node_latency": cal.fit.latency}
    return dataclasses.replace(hardware, link_calibration=cal, **fields)  # type: ignore[arg-type]
