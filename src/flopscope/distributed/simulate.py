"""Simulated ranks: PyTorch's fake process group stands in for a job of any size on one process
(no network, no devices), so one rank's program (its shards, its collectives) runs and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter

from flopscope.core.counter import Counter
from flopscope.cost import Cost, Phase
from flopscope.distributed.layout import Layout, apply_layout
from flopscope.distributed.pipeline import DecoderStage, PipelineReport
from flopscope.distributed.shape_only import fake_tree, shape_only_rank
from flopscope.distributed.stage_run import StageRun, pipeline_report, run_stage
from flopscope.distributed.world import fake_world, shared_world, world_of
from flopscope.errors import UsageError
from flopscope.execution.copies import to_fake
from flopscope.execution.inputs import Inputs, token_ids
from flopscope.execution.training import causal_lm_loss
from flopscope.report.records import CommRecord, OpRecord
from flopscope.report.report import Report
from flopscope.run import count

#: called with a simulated rank's model (sharded, its shards materialized) and inputs just
#: before the rank is counted: e.g. to register them with a memory tracker among the observers
Prepare = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]

#: the losses a simulated training step backpropagates from (:func:`count_rank`)
LOSSES = ("sum", "cross_entropy")

__all__ = ["LOSSES", "Prepare", "after_backward", "count_rank", "count_stage", "fake_world",
           "simulate", "simulate_pipeline"]


def count_rank(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = False,
    loss: str = "sum",
    loss_parallel: bool = False,
    **counter_kwargs: Any,
) -> Report:
    """Count this rank's forward (and backward) of a sharded model: the same program on a real
    job (``torchrun``) and on a simulated rank, so the two reports compare exactly.

    Backward runs from the loss: ``"sum"``, the sum of every floating-point output that
    requires grad (one ``ones_like`` per output, as ``sum().backward()`` does), or
    ``"cross_entropy"``, a causal LM's cross-entropy on its token ids
    (:func:`~flopscope.execution.training.causal_lm_loss`), with ``loss_parallel`` computed on
    vocabulary-sharded logits under torch's
    :func:`~torch.distributed.tensor.parallel.loss_parallel` (the loss and its backward).

    Args:
        model: the model, sharded (DTensor parameters, ``fully_shard``).
        args: its positional inputs (this rank's local batch).
        kwargs: its keyword inputs.
        backward: also count backward.
        loss: ``"sum"`` or ``"cross_entropy"``.
        loss_parallel: the logits are vocabulary shards (:attr:`Layout.loss_parallel`).
        **counter_kwargs: options of :class:`flopscope.Counter` (``rules``, ``strict``, ``warn``).

    Returns:
        The rank's report.

    Raises:
        UsageError: an unknown loss, or no output to backpropagate from.
    """
    from contextlib import nullcontext

    from torch.distributed.tensor.parallel import loss_parallel as on_shards

    if loss not in LOSSES:
        raise UsageError(f"unknown loss {loss!r}: use one of {', '.join(LOSSES)}")
    kwargs = kwargs or {}
    before: Report | None = None
    with Counter(model, **counter_kwargs) as counter:
        out = model(*args, **kwargs)
        if backward:
            with on_shards() if loss_parallel else nullcontext():
                if loss == "cross_entropy":
                    roots = [causal_lm_loss(out, _token_ids(args, kwargs))]
                else:
                    roots = [t.sum() for t in tree_iter(out) if isinstance(t, torch.Tensor)
                             and t.is_floating_point() and t.requires_grad]
                if not roots:
                    raise UsageError("backward=True, but no floating-point output requires grad")
                # a trainer drops the output once the loss is computed (torchtitan's `del pred`,
                # transformers' Trainer.compute_loss returning the loss alone): the logits are
                # not held through backward, only what autograd saved of them
                del out
                before = counter.report
                torch.autograd.backward(roots)
    if before is None:
        return counter.report
    return after_backward(before, counter.report)


def _delta_records(before: tuple[OpRecord, ...], after: tuple[OpRecord, ...]
                   ) -> tuple[OpRecord, ...]:
    """``after`` with what forward-phase records gained since ``before`` moved to backward."""
    was = {(r.module, r.op, r.counted, r.decomposed): r for r in before
           if r.phase is Phase.FORWARD}
    out: list[OpRecord] = []
    moved: dict[tuple[str, str, bool, bool], tuple[int, Cost]] = {}
    for r in after:
        key = (r.module, r.op, r.counted, r.decomposed)
        old = was.get(key) if r.phase is Phase.FORWARD else None
        if r.phase is Phase.FORWARD and (old is None or old.calls != r.calls):
            calls, cost = (r.calls, r.cost) if old is None else (r.calls - old.calls,
                                                                   _minus(r.cost, old.cost))
            moved[key] = (calls, cost)
            if old is None:
                continue
            r = old
        out.append(r)
    for i, r in enumerate(out):
        key = (r.module, r.op, r.counted, r.decomposed)
        if r.phase is Phase.BACKWARD and key in moved:
            calls, cost = moved.pop(key)
            out[i] = dataclasses.replace(r, calls=r.calls + calls, cost=r.cost + cost)
    out += [OpRecord(m, op, Phase.BACKWARD, calls, cost, counted, decomposed)
            for (m, op, counted, decomposed), (calls, cost) in moved.items()]
    return tuple(out)


def _minus(a: Cost, b: Cost) -> Cost:
    return Cost(a.macs - b.macs, a.flops - b.flops, a.bytes_read - b.bytes_read,
                a.bytes_written - b.bytes_written)


def after_backward(before: Report, after: Report) -> Report:
    """A training step's report with the work autograd's final callbacks did (FSDP2's root
    reduce-scatter of gradients and its averaging, queued with
    ``Variable._execution_engine.queue_callback``) in the backward phase: those callbacks run
    after the last autograd node, outside any module and node, where a counter sees the forward
    phase. Everything the forward phase gained while ``backward()`` ran is moved.

    Args:
        before: the report taken just before ``backward()``.
        after: the report at the end.

    Returns:
        ``after`` with those records (operators and communication) in the backward phase.
    """
    was = {(c.module, c.kind, *c.group_key): c for c in before.communication
           if c.phase is Phase.FORWARD}
    comm: dict[tuple[str, Phase, str, int, str], list[int]] = {}

    def add(module: str, phase: Phase, kind: str, group: tuple[int, str],
            sums: tuple[int, int, int]) -> None:
        acc = comm.setdefault((module, phase, kind, *group), [0, 0, 0])
        for i, v in enumerate(sums):
            acc[i] += v

    for c in after.communication:
        old = was.get((c.module, c.kind, *c.group_key)) if c.phase is Phase.FORWARD else None
        if c.phase is Phase.FORWARD and (old is None or old.calls != c.calls):
            if old is not None:
                add(c.module, c.phase, c.kind, c.group_key,
                    (old.calls, old.payload_bytes, old.bus_bytes))
            add(c.module, Phase.BACKWARD, c.kind, c.group_key,
                (c.calls - (old.calls if old else 0),
                 c.payload_bytes - (old.payload_bytes if old else 0),
                 c.bus_bytes - (old.bus_bytes if old else 0)))
        else:
            add(c.module, c.phase, c.kind, c.group_key,
                (c.calls, c.payload_bytes, c.bus_bytes))
    return dataclasses.replace(
        after, records=_delta_records(before.records, after.records),
        logical=_delta_records(before.logical, after.logical),
        replicated=_delta_records(before.replicated, after.replicated),
        communication=tuple(CommRecord(m, ph, kind, n, s[0], s[1], s[2], g)
                            for (m, ph, kind, n, g), s in comm.items()))


def count_stage(
    model: nn.Module,
    input_ids: torch.Tensor,
    layout: Layout,
    *,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    backward: bool = False,
    **counter_kwargs: Any,
) -> Report:
    """Count this rank's pipeline stage over one step: the program every rank of a real job runs
    (``torchrun``; each with the whole model built the same way), and the one a simulated rank
    runs.

    Args:
        model: a transformers decoder LM (consumed: it becomes the stage).
        input_ids: the step's token ids (batch, sequence); read on the first stage.
        layout: the layout (``pp`` > 1), ``layout.rank`` this process's rank.
        microbatches: microbatches per step (``None``: ``pp``).
        schedule: ``1f1b`` or ``gpipe``.
        backward: a training step (loss = the sum of the logits).
        **counter_kwargs: options of :class:`flopscope.Counter`.

    Returns:
        The stage's report (send/recv labelled: activations forward, gradients backward).
    """
    config = getattr(model, "config", None)
    stage = DecoderStage(model, layout.stage, layout.pp, layout.sequence_shards)
    mesh = layout.mesh()
    apply_layout(stage, layout, mesh)
    return run_stage(stage, input_ids, stage=layout.stage, stages=layout.pp,
                     group=mesh["pp"].get_group(), microbatches=microbatches or layout.pp,
                     schedule=schedule, backward=backward, config=config,
                     count_kwargs=counter_kwargs).report


def _token_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    ids = token_ids(args, kwargs)
    if ids is None:
        raise UsageError("a pipeline-parallel simulation takes the model's token ids, a (batch, "
                         "sequence) tensor, as input_ids (or the first argument)")
    return ids


def _stage_run(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    backward: bool,
    shape_only: bool,
    microbatches: int | None,
    schedule: str,
    count_kwargs: dict[str, Any],
    prepare: Prepare | None = None,
    loss: str = "sum",
) -> StageRun:
    """Count the pipeline stage of ``layout.rank`` (sharded by the rest of the layout)."""
    with world_of(layout):
        model, args, kwargs = build()
        ids = _token_ids(args, kwargs)
        config = getattr(model, "config", None)
        stage = DecoderStage(model, layout.stage, layout.pp, layout.sequence_shards)
        del model
        mesh = layout.mesh()
        apply_layout(stage, layout, mesh)
        run = dict(stage=layout.stage, stages=layout.pp, group=mesh["pp"].get_group(),
                   microbatches=microbatches or layout.pp, schedule=schedule,
                   backward=backward, config=config, count_kwargs=count_kwargs, loss=loss,
                   loss_parallel=layout.loss_parallel and layout.stage == layout.pp - 1)
        if not shape_only:
            if prepare is not None:
                prepare(stage, (ids,), {})
            return run_stage(stage, ids, **run)
        with shape_only_rank(stage) as mode:
            fake_ids = to_fake(mode, ids)
            if prepare is not None:
                prepare(stage, (fake_ids,), {})
            return run_stage(stage, fake_ids, **run)


def simulate_pipeline(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    backward: bool = False,
    shape_only: bool = True,
    **count_kwargs: Any,
) -> PipelineReport:
    """Count every stage of a pipeline: the ranks of ``layout.rank``'s pipeline group, each on
    its own fake process group, under torch's pipeline schedule, and the schedule's bubble.

    Args:
        build: returns ``(model, args, kwargs)``: a transformers decoder LM (on ``meta`` for large
            models) and one step's token ids (batch, sequence) for the pipeline group.
        layout: the layout (``pp`` > 1; with ``tp`` and ``fsdp`` the stages are sharded too).
        microbatches: microbatches per step (``None``: ``pp``); must divide the batch.
        schedule: ``1f1b`` or ``gpipe``.
        backward: a training step (loss = the sum of the logits).
        shape_only: count on fake tensors.
        **count_kwargs: options of :class:`flopscope.Counter` (``rules``, ``strict``, ``warn``).

    Returns:
        A :class:`~flopscope.distributed.pipeline.PipelineReport`.

    Raises:
        UsageError: ``pp`` is 1, a bad layout, schedule or microbatch count, or a model that is
            not a decoder of the expected structure.
    """
    if layout.pp < 2:
        raise UsageError("simulate_pipeline() needs a layout with pp >= 2")
    ranks = layout.stage_ranks()
    runs = [_stage_run(build, dataclasses.replace(layout, rank=r), backward=backward,
                       shape_only=shape_only, microbatches=microbatches, schedule=schedule,
                       count_kwargs=count_kwargs) for r in ranks]
    runs = [StageRun(dataclasses.replace(r.report, shape_only=shape_only), r.actions) for r in runs]
    return pipeline_report(schedule, microbatches or layout.pp, ranks, runs)


def simulate(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    backward: bool = False,
    shape_only: bool = True,
    logical: bool = True,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    prepare: Prepare | None = None,
    repeat_layers: bool = True,
    loss: str = "sum",
    **count_kwargs: Any,
) -> Report:
    """Count one rank of a sharded model: build it, shard it with ``layout`` (the standard
    tensor-parallel plan and FSDP2, see :func:`~flopscope.distributed.layout.apply_layout`) on a
    fake process group of ``layout.world_size`` ranks, and count ``layout.rank``'s forward (and
    backward).

    Only the simulated rank's shards exist: memory and time do not grow with the world size
    beyond the process groups themselves. The report's ``logical`` records are those of the same
    model unsharded on the same inputs (built again with ``build``), backward from the same
    ``loss`` (on the whole logits), and ``replicated`` (with
    tensor parallelism) the rank's records that equal their unsharded counterpart: work every rank
    of a tensor-parallel group does in full (embedding, norms, the head, the loss).

    Args:
        build: returns ``(model, args, kwargs)``: the model (build it on the ``meta`` device for
            large models) and the rank's own inputs (its local batch).
        layout: world size, tensor-parallel and FSDP2 degrees, the rank.
        backward: also count backward.
        shape_only: count on fake/meta tensors (no arithmetic).
        logical: also count the unsharded model for ``logical`` and ``replicated`` (about doubles
            the time).
        microbatches: with ``layout.pp`` > 1, microbatches per step (``None``: ``pp``).
        schedule: with ``layout.pp`` > 1, the pipeline schedule (``1f1b`` or ``gpipe``); the
            rank's stage is counted over one step (every stage: :func:`simulate_pipeline`).
        prepare: called with the rank's model (sharded; shape-only: its shards fake tensors)
            and inputs just before the rank is counted, e.g. to register them with a
            :class:`~flopscope.estimate.MemoryTracker` passed in ``observers`` (refused with
            ``ep`` > 1).
        repeat_layers: shape-only, without pipeline stages, experts, ``prepare`` or
            observers: when the model has more than 12 alike decoder layers, count it cut to 3,
            4 and 5 layers and put the report together at its own count from the first two,
            checked against the third (:mod:`flopscope.distributed.repeat`; the same report
            record for record); where the check fails, every layer is counted.
        loss: what backward runs from (:func:`count_rank`): ``"sum"`` of the outputs, or
            ``"cross_entropy"`` (a causal LM's on its token ids; on vocabulary shards with
            :attr:`Layout.loss_parallel`; a pipeline's last stage too).

    With ``layout.ep`` > 1 (expert parallelism, real weights only) ``build`` returns the whole
    expert-parallel group's batch, split along dimension 0 into the ranks' batches, and must
    build the same weights every call (seed it): every rank's routing is taken from one run of
    the whole model (:mod:`flopscope.distributed.experts`).
        **count_kwargs: options of :class:`flopscope.Counter` (``rules``, ``strict``, ``warn``).

    Returns:
        The rank's :class:`~flopscope.Report` (``communication``, ``logical``, ``replicated``,
        ``rank``, ``world_size`` set).

    Raises:
        UsageError: a bad layout, or torch.distributed already initialized.
    """
    if (repeat_layers and shape_only and layout.pp == 1 and layout.ep == 1 and prepare is None
            and not count_kwargs.get("observers")):
        from flopscope.distributed.repeat import NotRepeating, from_small

        def run(small: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]
                ) -> Report:
            return simulate(small, layout, backward=backward, shape_only=True, logical=logical,
                            repeat_layers=False, loss=loss, **count_kwargs)

        try:
            with fake_world(layout.world_size, layout.rank), shared_world(layout):
                return from_small(build, run)
        except NotRepeating:
            pass
    local: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    if layout.pp > 1:
        report = _stage_run(build, layout, backward=backward, shape_only=shape_only,
                            microbatches=microbatches, schedule=schedule,
                            count_kwargs=count_kwargs, prepare=prepare, loss=loss).report
    elif layout.ep > 1:
        if prepare is not None:
            raise UsageError("simulate(prepare=...) is not built for expert parallelism (ep > 1)")
        report, local = _expert_rank(build, layout, backward=backward, shape_only=shape_only,
                                     count_kwargs={**count_kwargs, "loss": loss})
    else:
        report = _one_rank(build, layout, backward=backward, shape_only=shape_only,
                           count_kwargs={**count_kwargs, "loss": loss}, prepare=prepare)
    if not logical:
        return dataclasses.replace(report, shape_only=shape_only)
    # the logical figure: the same model unsharded, on the same (local) inputs, backward from
    # the same loss (on the whole logits)
    model, args, kwargs = build()
    if local is not None:
        args, kwargs = local
    whole = _unsharded(model, args, kwargs, backward=backward, shape_only=shape_only, loss=loss)
    mine: dict[tuple[str, str, Phase], Cost] = {}
    for r in report.records:
        mine[(r.module, r.op, r.phase)] = mine.get((r.module, r.op, r.phase), Cost()) + r.cost
    unsharded: dict[tuple[str, str, Phase], Cost] = {}
    for r in whole.records:
        key = (r.module, r.op, r.phase)
        unsharded[key] = unsharded.get(key, Cost()) + r.cost
    replicated = tuple(r for r in report.records if layout.tp > 1 and r.cost.flops
                       and mine[(r.module, r.op, r.phase)] == unsharded.get((r.module, r.op, r.phase)))
    return dataclasses.replace(report, shape_only=shape_only, logical=whole.records,
                               replicated=replicated)


def _unsharded(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
               backward: bool, shape_only: bool, loss: str) -> Report:
    """Count the model unsharded (the logical figure), backward from ``loss``: from the sum of
    the outputs, ``flopscope.count``'s own backward (so the figure is ``count --backward``'s of
    the whole model); from another loss (the cross-entropy), as a rank is counted
    (:func:`count_rank`), shape-only on fake CPU tensors as a simulated rank
    (:func:`~flopscope.distributed.shape_only.shape_only_rank`)."""
    if loss == "sum":
        return count(model, Inputs(*args, **kwargs), backward=backward, shape_only=shape_only,
                     warn=False)
    if not shape_only:
        return count_rank(model, args, kwargs, backward=backward, loss=loss, warn=False)
    with shape_only_rank(model) as mode:
        fake_args, fake_kwargs = fake_tree(mode, (args, kwargs))
        return count_rank(model, fake_args, fake_kwargs, backward=backward, loss=loss,
                          warn=False)


def _expert_rank(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    backward: bool,
    shape_only: bool,
    count_kwargs: dict[str, Any],
) -> tuple[Report, tuple[tuple[Any, ...], dict[str, Any]] | None]:
    """Count ``layout.rank`` of an expert-parallel layout: every rank's routing first (the whole
    model on each rank's share of ``build``'s batch), then the rank on the fake process group
    with that routing (:mod:`flopscope.distributed.experts`). Returns the report and the rank's
    own inputs. Shape-only: ``build``'s inputs are every rank's batch, routing assumed balanced
    (:class:`~flopscope.distributed.experts.BalancedRouting`)."""
    from flopscope.distributed.experts import route, routed_as

    if shape_only:
        return _one_rank(build, layout, backward=backward, shape_only=True,
                         count_kwargs=count_kwargs), None
    routing, per_rank = route(build, layout.ep)
    args, kwargs = per_rank[layout.rank]
    with fake_world(layout.world_size, layout.rank):
        model, _, _ = build()
        apply_layout(model, layout, layout.mesh())
        with routed_as(model, routing, layout.rank):
            report = count_rank(model, args, kwargs, backward=backward, **count_kwargs)
        del model
    return report, (args, kwargs)


def _one_rank(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
    layout: Layout,
    *,
    backward: bool,
    shape_only: bool,
    count_kwargs: dict[str, Any],
    prepare: Prepare | None = None,
) -> Report:
    """Count ``layout.rank`` of a layout without pipeline stages."""
    with world_of(layout):
        model, args, kwargs = build()
        apply_layout(model, layout, layout.mesh())
        if not shape_only:
            if prepare is not None:
                prepare(model, args, kwargs)
            report = count_rank(model, args, kwargs, backward=backward,
                                loss_parallel=layout.loss_parallel, **count_kwargs)
        else:
            # FSDP2 refuses meta parameters: the rank's shards become fake CPU tensors (no memory)
            with shape_only_rank(model) as mode:
                fake = fake_tree(mode, (args, kwargs))
                if prepare is not None:
                    prepare(model, *fake)
                report = count_rank(model, *fake, backward=backward,
                                    loss_parallel=layout.loss_parallel, **count_kwargs)
        del model
    return report
