"""Counting many models of a library, one row each (shape-only): params, MACs, FLOPs, the
publisher's reference figure, time to count, or the error that stopped one model.

    >>> for row in sweep("torchvision", ["resnet18", "vit_b_16"], jobs=2, batches=[1, 8]):
    ...     print(row.model, row.batch, row.macs, row.reference_gmacs)

A sweep over several models or shapes runs in worker processes (``jobs``; one per core by
default in the command line), each counting one model at a time, single-threaded; rows come back
as they finish. A worker that dies (a crash, the kernel's out-of-memory killer) fails the models
it was counting, named in their rows, and the sweep goes on with a fresh worker.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from flopscope._text import one_line

__all__ = ["HF_ZOO", "LIBRARIES", "TIMM_ZOO", "ZooRow", "count_model", "default_jobs", "sweep",
           "worker_init", "zoo_models"]

LIBRARIES = ("torchvision", "timm", "hf")

HF_ZOO = ("bert", "gpt2", "llama", "mistral", "qwen2", "t5")
"""The default ``hf`` selection: transformers model types, built from their default configs."""

TIMM_ZOO = (
    "resnet18", "resnet50", "resnext50_32x4d", "efficientnet_b0", "efficientnet_b3",
    "mobilenetv3_large_100", "mobilenetv4_conv_small", "convnext_tiny", "convnext_base",
    "regnety_016", "vit_tiny_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
    "swin_tiny_patch4_window7_224", "beit_base_patch16_224", "eva02_tiny_patch14_224",
    "levit_128", "mixer_b16_224", "poolformer_s12", "coat_lite_tiny", "convmixer_768_32",
    "edgenext_small", "fastvit_t8", "efficientvit_b0", "ghostnet_100", "mobilevit_s",
)
"""The default timm selection: one or two of each architecture family."""


@dataclass(frozen=True)
class ZooRow:
    """One model of a sweep.

    Attributes:
        model: the model name.
        seconds: wall time to build and count it.
        input: its input, described (``1x3x224x224``).
        params: parameters.
        macs: multiply-accumulates of one forward.
        flops: floating-point operations of one forward.
        uncounted_ops: how many operators had no rule.
        reference_gmacs: the publisher's figure (torchvision's GFLOPS, which are MACs), if any.
        error: ``ExceptionType: message`` when the model failed (the counts are then 0).
        batch: the batch size asked for (``None``: the source's default).
        seq_len: the sequence length asked for (``hf`` models; ``None``: the default).
    """

    model: str
    seconds: float
    input: str = ""
    params: int = 0
    macs: int = 0
    flops: int = 0
    uncounted_ops: int = 0
    reference_gmacs: float | None = None
    error: str | None = None
    batch: int | None = None
    seq_len: int | None = None


def zoo_models(library: str, models: Sequence[str] | None = None) -> list[str]:
    """The model names of a sweep.

    Args:
        library: ``"torchvision"``, ``"timm"`` or ``"hf"``.
        models: explicit names (items may be comma-separated lists; ``all``: every model the
            library lists, ``timm.list_models()`` for timm); ``None`` or empty: every
            torchvision classification model, :data:`TIMM_ZOO` or :data:`HF_ZOO`.

    Returns:
        The names, in order.

    Raises:
        ImportError: the library is needed to list its models and is not installed.
        SourceError: an explicit name the library does not have (close names suggested),
            checked before anything is counted.
    """
    from flopscope.sources import check_library_name

    names = [m.strip() for item in models or () for m in item.split(",") if m.strip()]
    if names and names != ["all"]:
        for name in names:
            check_library_name(library, name)
        return names
    if library == "torchvision":
        import torchvision.models as tvm  # type: ignore[import-untyped]

        return list(tvm.list_models(module=tvm))
    if library == "timm":
        if names == ["all"]:
            import timm

            return list(timm.list_models())
        return list(TIMM_ZOO)
    return list(HF_ZOO)


def default_jobs() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def count_model(library: str, name: str, *, batch: int | None = None,
                seq_len: int | None = None) -> ZooRow:
    """Build one model on ``meta`` and count one forward (shape-only); a failure becomes a row
    with ``error`` set, never an exception (``KeyboardInterrupt`` still stops it).

    Args:
        library: ``"torchvision"``, ``"timm"`` or ``"hf"``.
        name: the model name.
        batch: the batch size (``None``: the source's default, 1).
        seq_len: the sequence length of ``hf`` models (``None``: their default, 128).

    Returns:
        The row.
    """
    from flopscope.run import count
    from flopscope.sources import load_model

    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # constructors' FutureWarnings would drown the progress
            warnings.simplefilter("ignore")
            loaded = load_model(f"{library}:{name}", shape_only=True, batch=batch, seq_len=seq_len)
            report = count(loaded.model, loaded.inputs, shape_only=True, warn=False)
    except Exception as e:  # noqa: BLE001  (one failing model must not stop the sweep)
        return ZooRow(name, time.perf_counter() - start,
                      error=one_line(f"{type(e).__name__}: {e}", 160), batch=batch,
                      seq_len=seq_len)
    return ZooRow(
        name, time.perf_counter() - start, input=" ".join(loaded.meta.inputs),
        params=report.params, macs=report.macs, flops=report.flops,
        uncounted_ops=len(report.uncounted), reference_gmacs=loaded.meta.reference_gmacs,
        batch=batch, seq_len=seq_len,
    )


_Task = tuple[str, str, int | None, int | None]


def _count_task(task: _Task) -> ZooRow:
    library, name, batch, seq_len = task
    if batch is None and seq_len is None:
        return count_model(library, name)
    return count_model(library, name, batch=batch, seq_len=seq_len)


def worker_init() -> None:
    """A sweep worker's start (this sweep's and ``flopscope plan --jobs``'s): Ctrl-C is the
    parent's to handle (it stops the workers), one thread."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)


def _parallel(tasks: list[_Task], jobs: int,
              on_start: Callable[[str], None] | None) -> Iterator[ZooRow]:
    """Count ``tasks`` in ``jobs`` worker processes, at most ``jobs`` in flight, yielding rows as
    they finish; a dead worker's tasks become failed rows and a new pool takes the rest."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    todo = list(reversed(tasks))
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
    while todo:
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=worker_init)
        running: dict[Future[ZooRow], _Task] = {}
        try:
            while todo or running:
                while todo and len(running) < jobs:
                    task = todo.pop()
                    if on_start is not None:
                        on_start(task[1])
                    running[pool.submit(_count_task, task)] = task
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for future in done:
                    task = running.pop(future)
                    try:
                        yield future.result()
                    except BrokenProcessPool:
                        broken = True
                        yield ZooRow(task[1], 0.0, batch=task[2], seq_len=task[3],
                                     error="the worker process counting it died (crash or out of "
                                           "memory); count it alone to see why")
                if broken:  # the other tasks in flight died with the pool
                    for task in running.values():
                        yield ZooRow(task[1], 0.0, batch=task[2], seq_len=task[3],
                                     error="the worker process counting it died (crash or out of "
                                           "memory); count it alone to see why")
                    running.clear()
                    break
        finally:
            _stop(pool)


def _stop(pool: object) -> None:
    """Shut a pool down now: queued work cancelled, workers still counting terminated (on
    Ctrl-C or when the caller stops reading the rows)."""
    processes = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=False, cancel_futures=True)  # type: ignore[attr-defined]
    for process in processes.values():
        if process.is_alive():
            process.terminate()


def sweep(
    library: str,
    names: Sequence[str],
    *,
    on_start: Callable[[str], None] | None = None,
    jobs: int = 1,
    batches: Sequence[int | None] = (None,),
    seq_lens: Sequence[int | None] = (None,),
) -> Iterator[ZooRow]:
    """Count every model at every shape, yielding each row as it finishes (so a caller can write
    rows as they come and keep them when interrupted).

    Args:
        library: ``"torchvision"``, ``"timm"`` or ``"hf"``.
        names: the model names.
        on_start: called with each name before it is counted (progress display).
        jobs: worker processes; 1 counts in this process, one model after the other.
        batches: batch sizes to count each model at (``None``: the source's default).
        seq_lens: sequence lengths to count each ``hf`` model at (``None``: the default).

    Yields:
        One :class:`ZooRow` per (name, batch, sequence length): in order with one job, as they
        finish with several.
    """
    tasks: list[_Task] = [(library, name, batch, seq_len)
                          for name in names for batch in batches for seq_len in seq_lens]
    if jobs > 1 and len(tasks) > 1:
        yield from _parallel(tasks, min(jobs, len(tasks)), on_start)
        return
    for task in tasks:
        if on_start is not None:
            on_start(task[1])
        yield _count_task(task)
