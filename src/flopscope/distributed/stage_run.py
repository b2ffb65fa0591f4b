"""Counting one pipeline stage under torch's own schedule (:func:`run_stage`) and putting the
stages' runs together (:func:`pipeline_report`): the stage notes the order in which the
schedule runs its microbatches, and its point-to-point transfers are labelled by what they carry
(:class:`P2PLog`); the split, the report and the bubble are :mod:`flopscope.distributed.pipeline`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from flopscope.cost import Cost, OpCall, Phase
from flopscope.distributed.pipeline import SCHEDULES, DecoderStage, PipelineReport, bubble
from flopscope.errors import UsageError
from flopscope.report.records import CommRecord, OpRecord
from flopscope.report.report import Report
from flopscope.rules.collectives import communication, is_collective

__all__ = ["P2PLog", "StageRun", "pipeline_report", "run_stage"]


class P2PLog:
    """Point-to-point transfers of a stage, labelled by what they carry: to the next stage and
    from the previous one, activations (forward); the other way, gradients (backward). Also the
    backward work the counter sees in the forward phase: while the stage runs a microbatch's
    backward, reduces or scales the gradients (``backward`` set), calls outside any autograd
    node and module (FSDP2's reduce-scatter of gradients, the 1/m scaling)."""

    def __init__(self, me: int) -> None:
        self.me = me
        self.backward = False
        self.acc: dict[tuple[Phase, str, int, str], list[int]] = {}
        self.moved: dict[tuple[str, str], list[int]] = {}  # (module, op) -> calls, cost
        self.moved_comm: dict[tuple[str, str, int, str], list[int]] = {}

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        if call is None:
            return
        if op in ("c10d.send.default", "c10d.recv_.default"):
            peer = int(call.args[2])
            for c in communication(call):
                forward = peer == (self.me + 1 if c.kind == "send" else self.me - 1)
                key = (Phase.FORWARD if forward else Phase.BACKWARD, c.kind, *c.group_key)
                _add(self.acc.setdefault(key, [0, 0, 0]), (1, c.payload_bytes, c.bus_bytes))
                if not forward and phase is Phase.FORWARD:
                    self._move(path, op, cost)
            return
        if self.backward and phase is Phase.FORWARD and torch._C._current_autograd_node() is None:
            self._move(path, op, cost)
            if is_collective(call.op):
                for c in communication(call):
                    _add(self.moved_comm.setdefault((path, c.kind, *c.group_key), [0, 0, 0]),
                         (1, c.payload_bytes, c.bus_bytes))

    def _move(self, path: str, op: str, cost: Cost) -> None:
        _add(self.moved.setdefault((path, op), [0, 0, 0, 0, 0]),
             (1, cost.macs, cost.flops, cost.bytes_read, cost.bytes_written))

    def relabel(self, report: Report) -> Report:
        """The report with its send/recv records replaced by the labelled ones, and the backward
        work seen in the forward phase moved to the backward phase."""
        comm: dict[tuple[str, Phase, str, int, str], list[int]] = {}
        for r in report.communication:
            if r.kind in ("send", "recv"):
                continue
            sums, moved = [r.calls, r.payload_bytes, r.bus_bytes], (r.module, r.kind, *r.group_key)
            if r.phase is Phase.FORWARD and moved in self.moved_comm:
                back = self.moved_comm[moved]
                _add(comm.setdefault((r.module, Phase.BACKWARD, r.kind, *r.group_key), [0, 0, 0]),
                     back)
                sums = [a - b for a, b in zip(sums, back, strict=True)]
                if not sums[0]:
                    continue
            _add(comm.setdefault((r.module, r.phase, r.kind, *r.group_key), [0, 0, 0]), sums)
        kept = tuple(CommRecord(m, ph, kind, n, s[0], s[1], s[2], g)
                     for (m, ph, kind, n, g), s in comm.items())
        p2p = tuple(CommRecord("", phase, kind, n, calls, payload, bus, g)
                    for (phase, kind, n, g), (calls, payload, bus) in sorted(
                        self.acc.items(), key=lambda kv: (kv[0][0].value, kv[0][1])))
        return dataclasses.replace(report, communication=kept + p2p,
                                   records=_moved_records(report.records, self.moved))


def _add(acc: list[int], values: Sequence[int]) -> None:
    for i, v in enumerate(values):
        acc[i] += v


def _moved_records(records: tuple[OpRecord, ...],
                   moved: dict[tuple[str, str], list[int]]) -> tuple[OpRecord, ...]:
    """``records`` with the given calls and costs of forward-phase records moved to backward."""
    if not moved:
        return records
    left = dict(moved)
    out: list[OpRecord] = []
    for r in records:
        m = moved.get((r.module, r.op)) if r.phase is Phase.FORWARD and r.counted else None
        if m is None:
            out.append(r)
            continue
        calls, cost = r.calls - m[0], Cost(r.cost.macs - m[1], r.cost.flops - m[2],
                                           r.cost.bytes_read - m[3], r.cost.bytes_written - m[4])
        if calls:
            out.append(dataclasses.replace(r, calls=calls, cost=cost))
    for i, r in enumerate(out):
        m = left.get((r.module, r.op)) if r.phase is Phase.BACKWARD and r.counted else None
        if m is not None:
            del left[(r.module, r.op)]
            out[i] = dataclasses.replace(r, calls=r.calls + m[0], cost=r.cost + Cost(*m[1:]))
    out += [OpRecord(module, op, Phase.BACKWARD, m[0], Cost(*m[1:]))
            for (module, op), m in left.items()]
    return tuple(out)


@dataclass
class StageRun:
    """What :func:`run_stage` leaves: the stage's report and the forward and backward actions
    it ran, in order (``("F", microbatch)``, ``("B", microbatch)``)."""

    report: Report
    actions: list[tuple[str, int]]


def _recording_stage(pipelining: Any) -> type:
    """A ``PipelineStage`` that notes the order in which the schedule runs its microbatches."""

    class RecordingStage(pipelining.PipelineStage):  # type: ignore[misc]
        actions: list[tuple[str, int]]
        log: P2PLog | None = None
        watchers: Sequence[Any] = ()  # told when each action starts

        def _note(self, kind: str, microbatch: int) -> None:
            self.actions.append((kind, microbatch))
            for w in self.watchers:
                w.on_action(kind, microbatch)

        def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            self._note("F", fwd_chunk_id)
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

        def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            self._note("B", bwd_chunk_id)
            with self._backward():
                return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)

        def scale_grads(self, *args: Any, **kwargs: Any) -> Any:
            with self._backward():
                return super().scale_grads(*args, **kwargs)

        def perform_reduce_grad(self, *args: Any, **kwargs: Any) -> Any:
            with self._backward():
                return super().perform_reduce_grad(*args, **kwargs)

        @contextmanager
        def _backward(self) -> Iterator[None]:
            if self.log is not None:
                self.log.backward = True
            try:
                yield
            finally:
                if self.log is not None:
                    self.log.backward = False

    return RecordingStage


def run_stage(
    stage_module: DecoderStage,
    inputs: torch.Tensor,
    *,
    stage: int,
    stages: int,
    group: Any,
    microbatches: int,
    schedule: str,
    backward: bool,
    config: Any,
    count_kwargs: dict[str, Any],
    loss: str = "sum",
    loss_parallel: bool = False,
) -> StageRun:
    """Count one step of ``stage_module`` under torch's pipeline schedule (every rank of the
    pipeline group runs this with its own stage; on the fake process group only one does).

    Args:
        stage_module: the stage (sharded already, if tensor parallel or FSDP2).
        inputs: the step's token ids, (batch, sequence) (used on the first stage; their shape
            on every stage).
        stage: this stage's index.
        stages: the number of stages.
        group: the pipeline process group.
        microbatches: microbatches per step (divides the batch).
        schedule: a key of :data:`SCHEDULES`.
        backward: a training step, from ``loss``: ``sum`` (of the logits) or ``cross_entropy``.
        config: the model's config (``hidden_size``, ``vocab_size``).
        count_kwargs: options of :class:`flopscope.Counter` (an observer with ``on_action(kind,
            microbatch)`` is told when each action starts: ``F`` or ``B``, and its microbatch).
        loss: what backward runs from.
        loss_parallel: the last stage's logits are vocabulary shards: the step runs under
            torch's :func:`~torch.distributed.tensor.parallel.loss_parallel` (the loss and its
            backward on the shards).

    Returns:
        The stage's report (its point-to-point records labelled) and the order of its actions.

    Raises:
        UsageError: an unknown schedule, or microbatches that do not divide the batch.
    """
    from torch.distributed import pipelining

    from flopscope.core.counter import Counter
    from flopscope.execution.training import causal_lm_loss

    if schedule not in SCHEDULES:
        raise UsageError(f"unknown pipeline schedule {schedule!r}: use {', '.join(SCHEDULES)}")
    batch, seq = int(inputs.shape[0]), int(inputs.shape[1])
    if microbatches < 1 or batch % microbatches:
        raise UsageError(f"{microbatches} microbatches do not split the batch of {batch} "
                         "evenly: give a batch that is a multiple of the microbatches")
    if schedule == "1f1b" and microbatches < stages:
        raise UsageError(f"1F1B needs at least as many microbatches as stages ({microbatches} < "
                         f"{stages}): give more microbatches, or the gpipe schedule")
    shards = stage_module.sequence_shards
    if seq % shards:
        raise UsageError(f"sequence parallelism with pipeline stages sends sequence shards: the "
                         f"sequence of {seq} tokens does not split over {shards} tensor-parallel "
                         "ranks; give a sequence length that is a multiple of --tp")
    mb = batch // microbatches
    dtype = next(p.dtype for p in stage_module.parameters() if p.is_floating_point())
    # with sequence parallelism a stage boundary carries this rank's sequence shard
    hidden = (mb, seq // shards, int(config.hidden_size))
    out_shape = (mb, seq, int(config.vocab_size)) if stage == stages - 1 else hidden
    # static metadata (a fake process group cannot exchange it); a shape-only run calls this
    # inside its fake tensor mode, so these are fake too
    example_in = (torch.empty(mb, seq, dtype=inputs.dtype) if stage == 0
                  else torch.empty(hidden, dtype=dtype, requires_grad=backward))
    example_out = torch.empty(out_shape, dtype=dtype, requires_grad=backward)
    pipe_stage = _recording_stage(pipelining)(
        stage_module, stage, stages, torch.device("cpu"), input_args=(example_in,),
        output_args=(example_out,), group=group)
    pipe_stage.actions = []
    log = P2PLog(stage)
    pipe_stage.log = log
    cls = getattr(pipelining, SCHEDULES[schedule])
    loss_fn = causal_lm_loss if loss == "cross_entropy" else (lambda out, target: out.sum())
    sched = cls(pipe_stage, n_microbatches=microbatches, loss_fn=loss_fn if backward else None)
    kwargs = dict(count_kwargs)
    kwargs["observers"] = [*kwargs.get("observers", ()), log]
    pipe_stage.watchers = [o for o in kwargs["observers"] if hasattr(o, "on_action")]
    target = {"target": inputs} if backward and stage == stages - 1 else {}
    import torch.distributed as dist

    if dist.get_backend(group) != "fake":
        # a real group: torch's first step also runs a one-time warm-up (the stages vote on
        # static metadata with point-to-point messages), no part of a training step; run it
        # uncounted and count the next step, from fresh gradients as the first would be
        if stage == 0:
            sched.step(inputs, **target)
        else:
            sched.step(**target)
        stage_module.zero_grad(set_to_none=True)
        pipe_stage.actions = []
    from contextlib import nullcontext

    from torch.distributed.tensor.parallel import loss_parallel as on_shards

    with Counter(stage_module, **kwargs) as counter, \
            on_shards() if loss_parallel else nullcontext():
        if stage == 0:
            sched.step(inputs, **target)
        else:
            sched.step(**target)
    return StageRun(log.relabel(counter.report), list(pipe_stage.actions))


def pipeline_report(
    schedule: str, microbatches: int, ranks: Sequence[int], runs: Sequence[StageRun],
) -> PipelineReport:
    """Put the stages' runs together and replay the schedule for the bubble.

    Args:
        schedule: the schedule's name.
        microbatches: microbatches per step.
        ranks: the rank counted for each stage.
        runs: each stage's :class:`StageRun`, in stage order.

    Returns:
        The :class:`PipelineReport`.
    """
    forward = [Fraction(r.report.total(Phase.FORWARD).flops, microbatches) for r in runs]
    backward = [Fraction(r.report.total(Phase.BACKWARD).flops, microbatches) for r in runs]
    whole, each = bubble([r.actions for r in runs], forward, backward)
    return PipelineReport(schedule, microbatches, tuple(ranks), tuple(r.report for r in runs),
                          whole, each)
