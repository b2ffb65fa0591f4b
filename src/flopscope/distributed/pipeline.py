"""Pipeline parallelism: a decoder split into stages, one stage per rank of a pipeline group, run
by torch's own pipelining runtime (``torch.distributed.pipelining``: ``PipelineStage`` with static
metadata, ``ScheduleGPipe`` / ``Schedule1F1B``) on the fake process group, and counted per stage.

The split (:func:`split_layers`, :class:`DecoderStage`): the decoder layers in contiguous runs, as
even as possible, the extra layers on the earliest stages (``numpy.array_split``'s rule); the
embedding on the first stage, the final norm and the vocabulary head on the last; every stage
computes the rotary embedding's cos/sin table for its own layers (as torchtitan's stages do with
their ``freqs_cis``). Module paths are the whole model's (``model.layers.5.mlp``).

What a stage sends: per microbatch, the activations it hands to the next stage in forward and the
gradient of its input it hands back in backward (point-to-point ``send``/``recv``, bus bytes =
payload), issued outside any module and autograd node: attributed to the stage's root and to the
phase of what they carry (activations forward, gradients backward).

The bubble: the order in which torch's schedule ran each stage's forward and backward
microbatches (noted by the stage as it runs them) replayed with each action lasting its stage's
counted FLOPs per microbatch (every rank running at the same FLOP rate; communication time left
out), so the idle fraction is that of the counted work. With equal stages and backward = 2 x forward it is the textbook
``(p - 1) / (m + p - 1)`` for both GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from flopscope.cost import Cost, OpCall, Phase
from flopscope.errors import UsageError
from flopscope.report.records import CommRecord, OpRecord
from flopscope.report.report import Report
from flopscope.rules.collectives import communication, is_collective

__all__ = ["SCHEDULES", "DecoderStage", "PipelineReport", "bubble", "split_layers"]

#: pipeline schedules by name -> the torch class name in ``torch.distributed.pipelining``
SCHEDULES: dict[str, str] = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def split_layers(n_layers: int, stages: int) -> list[range]:
    """Contiguous runs of layer indices, one per stage, as even as possible (the first
    ``n_layers % stages`` stages take one more).

    Args:
        n_layers: decoder layers.
        stages: pipeline stages.

    Returns:
        One ``range`` per stage.

    Raises:
        UsageError: more stages than layers.
    """
    if stages > n_layers:
        raise UsageError(f"--pp {stages} is more pipeline stages than the model's {n_layers} "
                         "decoder layers: every stage needs at least one layer")
    base, extra = divmod(n_layers, stages)
    out: list[range] = []
    start = 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


class DecoderStage(nn.Module):
    """One pipeline stage of a transformers decoder LM (``model.embed_tokens``, ``model.layers``,
    ``model.norm``, ``model.rotary_emb``, ``lm_head``): the stage's layers, the embedding on the
    first stage, the norm and head on the last. Built from ``model`` by taking its modules (the
    model is consumed: its layer list becomes a ``ModuleDict`` of the stage's layers, keyed by
    their indices, so the paths stay those of the whole model).

    Args:
        model: a transformers causal LM (built for this stage alone).
        stage: this stage's index.
        stages: the number of stages.

    Raises:
        UsageError: the model does not have that structure, or has fewer layers than stages.
    """
    def __init__(self, model: nn.Module, stage: int, stages: int) -> None:
        super().__init__()
        base = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if (base is None or not isinstance(getattr(base, "layers", None), nn.ModuleList)
                or not all(hasattr(base, n) for n in needed)
                or not isinstance(getattr(model, "lm_head", None), nn.Module)):
            raise UsageError(
                f"{type(model).__name__} is not split into pipeline stages: --pp is written for "
                "transformers decoders with model.embed_tokens, model.layers, model.norm, "
                "model.rotary_emb and lm_head (Llama, Mistral, Qwen2 ...)")
        layers = base.layers
        self.first = stage == 0
        self.last = stage == stages - 1
        self.layer_indices = split_layers(len(layers), stages)[stage]
        base.layers = nn.ModuleDict({str(i): layers[i] for i in self.layer_indices})
        if not self.first:
            base.embed_tokens = None
        if not self.last:
            base.norm = None
        self.model = base
        self.lm_head = model.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states -> hidden states (logits on the last stage).

        Attention runs without a mask, causal (``is_causal``), as the whole model does for an
        unpadded batch."""
        base: Any = self.model
        h = base.embed_tokens(x) if self.first else x
        position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        position_embeddings = base.rotary_emb(h, position_ids=position_ids)
        for layer in base.layers.values():
            h = layer(h, attention_mask=None, position_embeddings=position_embeddings,
                      position_ids=position_ids)
        if self.last:
            head: Any = self.lm_head
            h = head(base.norm(h))
        return h


@dataclass(frozen=True)
class PipelineReport:
    """Every stage of a pipeline: its rank's report, and the schedule's bubble.

    Attributes:
        schedule: ``gpipe`` or ``1f1b``.
        microbatches: microbatches per step (m).
        ranks: the rank counted for each stage (one pipeline group).
        stages: the reports, in stage order (each with its point-to-point communication).
        bubble: the idle fraction of the pipeline group (see :func:`bubble`).
        stage_bubbles: the idle fraction of each stage.
    """

    schedule: str
    microbatches: int
    ranks: tuple[int, ...]
    stages: tuple[Report, ...]
    bubble: Fraction
    stage_bubbles: tuple[Fraction, ...]

    def p2p_per_microbatch(self, stage: int) -> dict[str, int]:
        """Bytes stage ``stage`` sends and receives per microbatch.

        Returns:
            ``{"send_forward", "recv_forward", "send_backward", "recv_backward"}``: payload
            bytes per microbatch (forward: activations; backward: gradients).
        """
        out = {f"{k}_{p.value}": 0 for p in (Phase.FORWARD, Phase.BACKWARD) for k in
               ("send", "recv")}
        for r in self.stages[stage].communication:
            if r.kind in ("send", "recv") and r.phase in (Phase.FORWARD, Phase.BACKWARD):
                out[f"{r.kind}_{r.phase.value}"] += r.payload_bytes // self.microbatches
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready: schedule, microbatches, bubble (float and exact fraction), and per stage
        its rank, idle fraction, MACs, FLOPs, bus bytes of its collectives and point-to-point
        bytes per microbatch."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "bubble": float(self.bubble),
            "bubble_fraction": str(self.bubble),
            "stages": [
                {"stage": s, "rank": self.ranks[s], "bubble": float(self.stage_bubbles[s]),
                 "macs": r.macs, "flops": r.flops,
                 "bus_bytes": r.communication_total().bus_bytes,
                 "p2p_bytes_per_microbatch": self.p2p_per_microbatch(s)}
                for s, r in enumerate(self.stages)],
        }

    def to_dict(self) -> dict[str, Any]:
        """:meth:`summary` with every stage's whole report (``Report.to_dict``)."""
        out = self.summary()
        for entry, r in zip(out["stages"], self.stages, strict=True):
            entry["report"] = r.to_dict()
        return out


# -- the bubble ----------------------------------------------------------------------------------
def bubble(
    order: Sequence[Sequence[tuple[str, int]]],
    forward: Sequence[Fraction | int],
    backward: Sequence[Fraction | int],
) -> tuple[Fraction, tuple[Fraction, ...]]:
    """Replay a pipeline's actions with given durations and measure the idle time.

    Each stage runs its actions in order; a forward of stage s on microbatch i starts when stage
    s-1 has finished that microbatch's forward, a backward when stage s+1 has finished its
    backward (the last stage: its own forward).

    Args:
        order: per stage, its actions in the order it ran them: ``("F", microbatch)`` or
            ``("B", microbatch)``.
        forward: duration of one microbatch's forward per stage.
        backward: duration of one microbatch's backward per stage.

    Returns:
        The group's idle fraction (1 - busy / (stages x makespan)) and each stage's.

    Raises:
        RuntimeError: the order deadlocks (an action waits for one that never comes first).
    """
    p = len(order)
    done: dict[tuple[str, int, int], Fraction] = {}
    clock = [Fraction(0)] * p
    busy = [Fraction(0)] * p
    pos = [0] * p
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(order[s]):
                kind, i = order[s][pos[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break
                start = max(clock[s], done[dep] if dep is not None else Fraction(0))
                length = Fraction(forward[s] if kind == "F" else backward[s])
                done[(kind, s, i)] = clock[s] = start + length
                busy[s] += length
                pos[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the pipeline's actions deadlock when replayed")
    span = max(clock)
    if span == 0:
        return Fraction(0), tuple(Fraction(0) for _ in range(p))
    return 1 - sum(busy) / (p * span), tuple(1 - b / span for b in busy)


# -- counting one stage --------------------------------------------------------------------------
class _P2PLog:
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
        log: _P2PLog | None = None
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
    mb = batch // microbatches
    dtype = next(p.dtype for p in stage_module.parameters() if p.is_floating_point())
    hidden = (mb, seq, int(config.hidden_size))
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
    log = _P2PLog(stage)
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
    with Counter(stage_module, **kwargs) as counter:
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
