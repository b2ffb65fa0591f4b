"""Role simulations away from the planning process: in local worker processes or as Ray tasks.

A plan's work is its role simulations (:mod:`flopscope.plan.roles`, :mod:`~flopscope.plan.vision`,
:mod:`~flopscope.plan.serving`); each is independent of the others, so each can run anywhere
that has flopscope and torch. A :class:`RoleTask` names one (picklable: the model's SOURCE,
sequence length, dtype and config, the hardware profile, the role), :func:`run_task` simulates
it, :func:`remember_result` keeps its result in the planning process's role caches as if it had
simulated it there, and :func:`results` runs many and yields each as it finishes:

- ``jobs`` local worker processes (``concurrent.futures`` with the ``spawn`` start method and
  the zoo's worker start, :func:`flopscope.zoo.worker_init`: one thread each, Ctrl-C the
  parent's);
- or Ray (``ray=...``): each task a Ray task on a running cluster (``ray="auto"``,
  ``"ray://host:10001"``, ``"host:6379"``) or on a local one started for the run
  (``ray="local"``: ``ray.init(num_cpus=jobs)``, shut down at the end). Ray is an optional
  extra (``pip install flopscope[ray]``); a cluster's workers need flopscope installed.

A task that fails (or whose worker dies) yields a :class:`TaskFailure` instead of its result:
which role, the exception's type and message and where it was raised; the plan then simulates
that role itself (and reports the error where it happens), and a sweep's row says which of its
roles did not come from a worker and why (:attr:`flopscope.plan.sweeps.SweepRow.worker_errors`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopscope.errors import UsageError
from flopscope.estimate import Hardware
from flopscope.plan.checkpointing import LABEL_SUFFIX
from flopscope.plan.roles import RoleKey, RoleRun

__all__ = ["RoleTask", "TaskFailure", "remember_result", "results", "run_task"]


@dataclass(frozen=True)
class RoleTask:
    """One role simulation, as a worker process or a Ray task receives it.

    Attributes:
        kind: ``"train"`` (a decoder's rank, :class:`~flopscope.plan.roles.Roles`),
            ``"experts"`` (an expert-parallel rank, :class:`~flopscope.plan.experts.ExpertRoles`),
            ``"vision"`` (a data-parallel rank, :class:`~flopscope.plan.vision.VisionRoles`) or
            ``"serve"`` (:class:`~flopscope.plan.serving.ServeRoles`).
        source: the model's SOURCE.
        seq_len: the sequence length asked for (``None``: the source's).
        dtype: the model's dtype.
        config: config overrides, sorted ``(key, value)`` pairs.
        hardware: the profile the roofline estimates are for (not compared: a sweep has one).
        key: the role (``train`` and ``vision``).
        data_parallel: ``fsdp`` or ``ddp`` (``vision``: the simulation's; a ZeRO-1 layout's
            is DDP's).
        serve: ``(tp, batch, prompt, new tokens)`` (``serve``).
        ep: the expert-parallel degree (``experts``).
    """

    kind: str
    source: str
    seq_len: int | None
    dtype: str
    config: tuple[tuple[str, Any], ...]
    hardware: Hardware = field(compare=False)  # one per sweep; a profile holds dicts
    key: RoleKey | None = None
    data_parallel: str = "fsdp"
    serve: tuple[int, int, int, int] | None = None
    ep: int = 1

    @property
    def identity(self) -> tuple[Any, ...]:
        """The model's identity in the role caches (what :func:`flopscope.plan.plan` uses)."""
        from flopscope.plan.build import model_identity

        base = model_identity(self.source, self.seq_len, self.dtype, dict(self.config))
        return ("serve", *base) if self.kind == "serve" else base

    @property
    def label(self) -> str:
        """A short description for progress lines."""
        if self.serve is not None:
            tp, batch, _, _ = self.serve
            return f"{self.source} serving TP{tp} batch {batch}"
        k = self.key
        assert k is not None
        return (f"{self.source} TP{k.tp} PP{k.pp} stage {k.stage} DP{k.dp} "
                f"mb{k.micro_batch}{LABEL_SUFFIX[k.checkpoint]}"
                + (" DDP" if self.data_parallel == "ddp" else "")
                + (f" EP{self.ep}" if self.ep > 1 else ""))


@dataclass(frozen=True)
class TaskFailure:
    """Why a task gave no result (picklable: it comes back from a worker as a result would).

    Attributes:
        task: the role (:attr:`RoleTask.label`).
        error: the exception's type (``BrokenProcessPool`` for a worker that died).
        message: its message.
        where: where it was raised (``file:line in function``, the innermost frame), or ``""``.
    """

    task: str
    error: str
    message: str
    where: str = ""

    @classmethod
    def of(cls, task: RoleTask, exc: BaseException) -> TaskFailure:
        """The failure of ``task`` by ``exc``.

        Args:
            task: the task.
            exc: what it raised.

        Returns:
            The :class:`TaskFailure`.
        """
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        where = (f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
                 if frames else "")
        return cls(task.label, type(exc).__name__, str(exc), where)

    def __str__(self) -> str:
        """``role: Type: message (at where)``, one line."""
        at = f" (at {self.where})" if self.where else ""
        message = " ".join(self.message.split())
        return f"{self.task}: {self.error}: {message}{at}"


def run_task(task: RoleTask) -> Any:
    """Simulate one role (in a worker process, a Ray task, or here).

    Args:
        task: the role.

    Returns:
        Its :class:`~flopscope.plan.roles.RoleRun` or :class:`~flopscope.plan.serving.ServeRun`.
    """
    from flopscope.plan.build import build_model
    from flopscope.plan.experts import ExpertRoles
    from flopscope.plan.roles import Roles
    from flopscope.plan.serving import ServeRoles
    from flopscope.plan.space import Choice
    from flopscope.plan.vision import VisionRoles

    build = build_model(task.source, task.seq_len, task.dtype, dict(task.config))
    if task.kind == "serve":
        assert task.serve is not None
        tp, batch, prompt, new_tokens = task.serve
        roles = ServeRoles(lambda: build(1, "none")[0].eval(), task.hardware, task.identity,
                           prompt, new_tokens)
        return roles.get(tp, batch)
    assert task.key is not None
    k = task.key
    if task.kind == "vision":
        choice = Choice(1, 1, k.dp, k.micro_batch, 1, "none", task.data_parallel)
        return VisionRoles(build, task.hardware, task.identity).runs(choice)[0]
    if task.kind == "experts":
        choice = Choice(k.tp, 1, k.dp, k.micro_batch, 1, k.checkpoint, "fsdp", task.ep)
        return ExpertRoles(build, task.hardware, task.identity).runs(choice)[0]
    return Roles(build, task.hardware, task.identity).get(task.key)


def remember_result(task: RoleTask, result: Any) -> None:
    """Keep a task's result in this process's role caches (a plan then finds the role
    simulated).

    Args:
        task: the task.
        result: what :func:`run_task` returned for it.
    """
    from flopscope.plan import experts, roles, serving, vision

    if task.kind == "serve":
        serving.remember(task.identity, task.hardware, result)
    elif task.kind == "experts":
        experts.remember(task.identity, task.hardware, task.ep, result)
    elif task.kind == "vision":
        vision.remember(task.identity, task.hardware, task.data_parallel, result)
    else:
        assert isinstance(result, RoleRun)
        roles.remember(task.identity, task.hardware, result)


def results(tasks: Sequence[RoleTask], *, jobs: int = 1, ray: str | None = None
            ) -> Iterator[tuple[RoleTask, Any]]:
    """Run ``tasks``, yielding ``(task, result or TaskFailure)`` as each finishes.

    Args:
        tasks: the roles.
        jobs: local worker processes (1: here, one after the other); with ``ray="local"``,
            the local cluster's CPUs.
        ray: ``None`` (no Ray), ``"local"`` (start a local cluster), or the address of a
            running one.

    Yields:
        Each task with its result, or a :class:`TaskFailure` saying why there is none (the plan
        simulates it again).

    Raises:
        UsageError: ``ray`` given without Ray installed, or a cluster that cannot be reached.
    """
    if ray is not None:
        yield from _on_ray(tasks, jobs, ray)
    elif jobs > 1 and len(tasks) > 1:
        yield from _in_processes(tasks, min(jobs, len(tasks)))
    else:
        for task in tasks:
            yield task, _safely(task)


def _safely(task: RoleTask) -> Any:
    try:
        return run_task(task)
    except Exception as e:  # noqa: BLE001  (the plan simulates it again; the row says why)
        return TaskFailure.of(task, e)


def _in_processes(tasks: Sequence[RoleTask], jobs: int) -> Iterator[tuple[RoleTask, Any]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    from flopscope.zoo import worker_init

    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=worker_init)
    todo = list(reversed(tasks))
    running: dict[Future[Any], RoleTask] = {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                task = todo.pop()
                try:
                    running[pool.submit(_safely, task)] = task
                except BrokenProcessPool as e:  # the pool died: the plans simulate the rest
                    for left in [task, *reversed(todo)]:
                        yield left, TaskFailure.of(left, e)
                    todo.clear()
                    break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                task = running.pop(future)
                try:
                    result = future.result()
                except Exception as e:  # noqa: BLE001  (a dead worker: the plan simulates it)
                    result = TaskFailure.of(task, e)
                yield task, result
    finally:
        processes = dict(getattr(pool, "_processes", None) or {})
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes.values():
            if process.is_alive():
                process.terminate()


def _on_ray(tasks: Sequence[RoleTask], jobs: int, address: str) -> Iterator[tuple[RoleTask, Any]]:
    try:
        import ray as ray_module
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'flopscope[ray]'") from None
    started = False
    if not ray_module.is_initialized():
        try:
            if address == "local":
                ray_module.init(num_cpus=max(1, jobs), include_dashboard=False,
                                log_to_driver=False)
            else:
                ray_module.init(address=address, log_to_driver=False)
        except Exception as e:  # noqa: BLE001  (Ray raises bare Exceptions on start-up)
            ray_module.shutdown()
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            if address == "local":
                raise UsageError(f"--ray: the local Ray cluster did not start ({why}); try "
                                 "again, or use --jobs N for local worker processes") from None
            raise UsageError(f"--ray {address}: cannot connect to a Ray cluster there ({why}); "
                             "give its address (ray://HOST:10001, HOST:6379, auto) or --ray "
                             "alone for a local one") from None
        started = True
    try:
        remote = ray_module.remote(num_cpus=1)(_safely)
        pending = {remote.remote(task): task for task in tasks}
        while pending:
            done, _ = ray_module.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    result = ray_module.get(ref)
                except Exception as e:  # noqa: BLE001  (a lost worker: the plan simulates it)
                    result = TaskFailure.of(task, e)
                yield task, result
    finally:
        if started:
            ray_module.shutdown()
