"""Capacity planning: many plans from one call, their role simulations spread over worker
processes or a Ray cluster.

``sweep(["hf:llama", ...], gpus=[8, 64], seq_lens=[2048, 4096], ...)`` (``from flopscope.plan
import sweep``; and ``flopscope plan SOURCE[,SOURCE...] --gpus 8,64 --seq-len 2048,4096
[--jobs N | --ray [ADDRESS]]``) plans every model x device count x sequence length. Every plan's roles are listed
first (:func:`role_tasks`: the same layouts and roles :func:`flopscope.plan.plan` will ask for),
the distinct ones run as tasks (:func:`flopscope.plan.workers.results`), and each plan is made,
in this process from the cached roles, as soon as the last of its roles is in: rows stream out
in the order plans complete. Plans that share roles (the same model at another device count with
the same degrees and micro-batch) share their simulations.

A serving plan's largest-batch roles depend on its batch-1 and batch-2 roles, so they are
simulated when the plan is made, in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flopscope.distributed.layout import tp_plan_problem
from flopscope.errors import UsageError
from flopscope.estimate import Hardware, get_hardware
from flopscope.estimate.profile import compiled_hardware
from flopscope.execution.inputs import token_ids
from flopscope.plan.build import build_model
from flopscope.plan.checkpointing import CHECKPOINTING
from flopscope.plan.degrees import shared_degrees
from flopscope.plan.experts import decoder_layouts, expert_role_key
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.planner import Plan, plan
from flopscope.plan.precision import mixed_precision
from flopscope.plan.serve import ServePlan
from flopscope.plan.serve_rows import serve_layouts
from flopscope.plan.serve_time import micro_batch
from flopscope.plan.space import ModelShape, data_parallel_kinds, sequence_parallel_mode
from flopscope.plan.vision import (
    data_parallel_layouts,
    is_decoder,
    vision_role_key,
    vision_variant,
)
from flopscope.plan.workers import RoleTask, TaskFailure, remember_result, results
from flopscope.sources import DEFAULT_SEQ_LEN

__all__ = ["SweepRow", "role_tasks", "sweep"]


@dataclass(frozen=True)
class SweepRow:
    """One plan of a sweep.

    Attributes:
        source: the model.
        gpus: devices.
        seq_len: the sequence length asked for (``None``: the source's).
        plan: the plan (``None`` when it failed).
        error: why it failed (one line), else ``None``.
        worker_errors: the roles of this plan a worker (a process, a Ray task) gave no result
            for, each with why (:class:`~flopscope.plan.workers.TaskFailure`, one line): the
            plan simulated them itself.
    """

    source: str
    gpus: int
    seq_len: int | None
    plan: Plan | ServePlan | None
    error: str | None = None
    worker_errors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the point of the sweep and its plan's dict."""
        return {"source": self.source, "gpus": self.gpus, "seq_len": self.seq_len,
                "error": self.error, "worker_errors": list(self.worker_errors),
                "plan": self.plan.to_dict() if self.plan is not None else None}


def role_tasks(source: str, *, gpus: int, hardware: Hardware, mode: str = "train",
               seq_len: int | None = None, dtype: str = "bfloat16",
               config: Mapping[str, Any] | None = None, global_batch: int | None = None,
               checkpointing: Sequence[str] = CHECKPOINTING,
               batches: Sequence[int] | None = None, max_new_tokens: int | None = None,
               tp: int | None = None, pp: int | None = None,
               ep: int | None = None, param_dtype: str | None = None,
               reduce_dtype: str | None = None,
               sequence_parallel: bool | str = False,
               loss_parallel: bool = True,
               data_parallel: str | None = None) -> list[RoleTask]:
    """The role simulations :func:`flopscope.plan.plan` with these options will ask for (a
    serving plan's largest-batch roles aside).

    Args:
        source: the model.
        gpus: devices.
        hardware: the profile.
        mode: ``train`` or ``serve``.
        seq_len: tokens per sequence (the prompt when serving).
        dtype: the model's dtype.
        config: config overrides.
        global_batch: sequences (samples) per training step.
        checkpointing: checkpointing choices.
        batches: serving batch sizes.
        max_new_tokens: serving: tokens generated.
        tp: only this tensor-parallel degree.
        pp: only this many stages.
        ep: only this expert-parallel degree.
        param_dtype: training: the parameters' dtype (mixed precision where it differs).
        reduce_dtype: training: the gradients' reduce dtype.
        sequence_parallel: training: sequence parallelism on tensor-parallel layouts
            (``True``, or ``"search"``: with and without).
        loss_parallel: training: loss parallelism on tensor-parallel layouts.
        data_parallel: training: the data-parallel kinds (``fsdp``, ``ddp``, ``zero1``,
            ``search``;
            :func:`~flopscope.plan.space.data_parallel_kinds`).

    Returns:
        The distinct tasks, in the order the plan meets them.
    """
    dtype, mixed = mixed_precision(dtype, param_dtype, reduce_dtype)
    build = build_model(source, seq_len, dtype, config)
    probe, args, kwargs = build(1, "none")
    model_config = getattr(probe, "config", None)
    decoder = is_decoder(probe)
    tensor_parallel = tp_plan_problem(probe) is None
    ids = token_ids(args, kwargs)
    prompt = int(ids.shape[-1]) if ids is not None else (seq_len or DEFAULT_SEQ_LEN)
    del probe
    items = tuple(sorted((config or {}).items()))

    def task(kind: str, **role: Any) -> RoleTask:
        return RoleTask(kind, source, seq_len, dtype, items, hardware, **role)

    tasks: list[RoleTask] = []
    if mode == "serve":
        try:
            shape = ModelShape.from_config(model_config)
        except UsageError:
            return []  # refused by the plan itself, with its message
        for layout in serve_layouts(gpus, shape, tensor_parallel):
            if tp in (None, layout.tp) and pp in (None, layout.pp):
                asked = {1, 2, *(batches or ())}  # and the micro-batches of a pipeline's
                for batch in sorted(asked | {micro_batch(b, layout.pp) for b in asked}):
                    tasks.append(task("serve", serve=(layout.tp, batch, prompt,
                                                      max_new_tokens or 128)))
        return list(dict.fromkeys(tasks))
    if not decoder:
        if max(tp or 1, pp or 1, ep or 1) > 1:
            return []  # refused by the plan itself, with its message
        for choice in data_parallel_layouts(gpus, global_batch or gpus,
                                            data_parallel_kinds(data_parallel, False)):
            tasks.append(task("vision", key=vision_role_key(choice),
                              data_parallel=vision_variant(choice)))
        return list(dict.fromkeys(tasks))
    shape = ModelShape.from_config(model_config)
    for choice in decoder_layouts(gpus, shape, global_batch or gpus, checkpointing,
                                  sequence_parallel_mode(sequence_parallel), tp=tp, pp=pp,
                                  ep=ep, data_parallel=data_parallel_kinds(data_parallel)):
        if choice.ep > 1:
            tasks.append(task("experts", key=expert_role_key(choice), ep=choice.ep))
        else:
            tasks += [task("train", key=key)
                      for key in roles_of(choice, shape.layers, mixed, loss_parallel)]
    return list(dict.fromkeys(tasks))


def sweep(
    sources: Sequence[str],
    *,
    gpus: Sequence[int],
    seq_lens: Sequence[int | None] = (None,),
    hardware: str | Hardware = "h100-sxm",
    jobs: int = 1,
    ray: str | None = None,
    on_task: Callable[[RoleTask, int, int], None] | None = None,
    **options: Any,
) -> Iterator[SweepRow]:
    """Plan every model x device count x sequence length, yielding each plan as it completes.

    Args:
        sources: the models.
        gpus: device counts.
        seq_lens: sequence lengths (``None``: the source's).
        hardware: the profile.
        jobs: local worker processes simulating roles (1: in this process, plan after plan);
            with ``ray="local"`` the local cluster's CPUs.
        ray: ``None``, ``"local"`` (start a local Ray cluster) or a running cluster's address.
        on_task: called with each finished role task, how many are done and how many in all
            (progress).
        **options: the other options of :func:`flopscope.plan.plan` (``mode``,
            ``global_batch``, ``memory_budget``, ``config``, ``dtype`` ...).

    Yields:
        One :class:`SweepRow` per plan: in order without workers, as they complete with them.

    Raises:
        UsageError: bad arguments (no sources, no device counts), or Ray asked for and missing.
    """
    if not sources or not gpus:
        raise UsageError("sweep(): give at least one source and one device count")
    # the roles' tasks keyed by the profile each plan predicts on
    hw = compiled_hardware(get_hardware(hardware), bool(options.get("compiled")))
    points = [(s, g, n) for s in sources for g in gpus for n in seq_lens]

    failed: dict[RoleTask, TaskFailure] = {}  # the tasks a worker gave no result for

    def row(point: tuple[str, int, int | None]) -> SweepRow:
        source, count, seq = point
        why = tuple(sorted(str(failed[t]) for t in needed.get(point, ()) if t in failed))
        try:
            made = plan(source, gpus=count, seq_len=seq, hardware=hw, **options)
        except UsageError as e:
            return SweepRow(source, count, seq, None, str(e), why)
        return SweepRow(source, count, seq, made, None, why)

    needed: dict[tuple[str, int, int | None], set[RoleTask]] = {}
    if jobs <= 1 and ray is None:
        with shared_degrees():  # a role at a third device count from the first two
            for point in points:
                yield row(point)
        return
    keep = {k: options[k] for k in ("mode", "dtype", "config", "global_batch", "checkpointing",
                                     "batches", "max_new_tokens", "tp", "pp", "ep",
                                     "param_dtype", "reduce_dtype", "sequence_parallel",
                                     "loss_parallel", "data_parallel")
            if k in options}
    for point in points:
        source, count, seq = point
        try:
            needed[point] = set(role_tasks(source, gpus=count, hardware=hw, seq_len=seq, **keep))
        except UsageError:
            needed[point] = set()  # the plan says why
    tasks = list(dict.fromkeys(t for point in points for t in needed[point]))
    done: set[RoleTask] = set()
    waiting = list(points)

    def ready() -> Iterator[SweepRow]:
        for point in [p for p in waiting if needed[p] <= done]:
            waiting.remove(point)
            yield row(point)

    yield from ready()
    for n, (task, result) in enumerate(results(tasks, jobs=jobs, ray=ray), 1):
        if isinstance(result, TaskFailure):
            failed[task] = result
        else:
            remember_result(task, result)
        done.add(task)
        if on_task is not None:
            on_task(task, n, len(tasks))
        yield from ready()
    for point in list(waiting):  # nothing left to wait for
        waiting.remove(point)
        yield row(point)
