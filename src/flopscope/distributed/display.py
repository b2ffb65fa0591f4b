"""How a rank's communication and a pipeline show in a report: their sections (table columns,
summary lines, JSON) (the edge: human units here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flopscope.distributed.pipeline import PipelineReport
from flopscope.render.units import human
from flopscope.report.records import is_within
from flopscope.report.report import Report
from flopscope.report.sections import Column

__all__ = ["CommunicationSection", "PipelineSection", "communication_columns",
           "communication_lines", "loss_parallel_section", "pipeline_lines", "rank_step_section",
           "step_lines"]


def communication_columns(report: Report) -> list[Column]:
    """Table columns of a report's communication: collective calls and bus bytes per rank, per
    module (inclusive: a module and everything below it).

    Args:
        report: the report.

    Returns:
        Columns of the report's tables (empty when no collective ran).
    """
    if not report.communication:
        return []
    calls: dict[str, int] = {}
    bus: dict[str, int] = {}
    for path in report.modules:
        for r in report.communication:
            if is_within(r.module, path):
                calls[path] = calls.get(path, 0) + r.calls
                bus[path] = bus.get(path, 0) + r.bus_bytes
    total = report.communication_total()
    return [
        Column("comm calls", {p: str(n) for p, n in calls.items()}, {}, str(total.calls)),
        Column("comm bus B", {p: human(n, "B") for p, n in bus.items()}, {},
               human(total.bus_bytes, "B")),
    ]


def communication_lines(report: Report) -> list[str]:
    """Summary lines: the rank, its compute beside the logical figure, replicated work, and each
    collective kind's calls, payload and bus bytes per rank.

    Args:
        report: the report.

    Returns:
        Lines of text (empty when the report was not made under torch.distributed).
    """
    lines: list[str] = []
    if report.rank is not None:
        # the logical and replicated figures only where they were computed (not for a pipeline
        # stage or an expert-parallel rank without DTensor work)
        parts = [f"rank {report.rank} of {report.world_size}: {human(report.flops, 'FLOPs')} on "
                 "this rank's shards"]
        if report.logical:
            parts.append(f"logical (unsharded) {human(report.logical_total().flops, 'FLOPs')}")
        if report.replicated:
            parts.append("replicated on every tensor-parallel rank "
                         f"{human(report.replicated_total().flops, 'FLOPs')}")
        lines.append("; ".join(parts))
    for kind, s in report.communication_by_kind().items():
        sizes = sorted({r.group_size for r in report.communication if r.kind == kind})
        lines.append(f"  {kind:<15} {s.calls:>5} calls  payload {human(s.payload_bytes, 'B'):>10}  "
                     f"bus {human(s.bus_bytes, 'B'):>10} per rank  (group size "
                     f"{', '.join(map(str, sizes))})")
    if report.communication:
        t = report.communication_total()
        lines.append(f"  {'total':<15} {t.calls:>5} calls  payload {human(t.payload_bytes, 'B'):>10}  "
                     f"bus {human(t.bus_bytes, 'B'):>10} per rank (ring algorithm; "
                     "docs/distributed.md)")
    return lines


def pipeline_lines(pipeline: PipelineReport) -> list[str]:
    """Summary lines of a pipeline: each stage's rank, FLOPs, bytes sent per microbatch and idle
    fraction, and the schedule's bubble.

    Args:
        pipeline: every stage's report.

    Returns:
        Lines of text.
    """
    lines = [f"pipeline: {len(pipeline.stages)} stages, {pipeline.schedule}, "
             f"{pipeline.microbatches} microbatches; bubble {float(pipeline.bubble):.1%} of the "
             "group's time (counted FLOPs at one rate, communication time left out)"]
    for s, r in enumerate(pipeline.stages):
        p2p = pipeline.p2p_per_microbatch(s)
        lines.append(
            f"  stage {s} (rank {pipeline.ranks[s]}): {human(r.flops, 'FLOPs'):>12}  sends "
            f"{human(p2p['send_forward'], 'B')} activations, {human(p2p['send_backward'], 'B')} "
            f"gradients per microbatch; idle {float(pipeline.stage_bubbles[s]):.1%}")
    return lines


@dataclass(frozen=True)
class CommunicationSection:
    """A rank's communication as a report section: its columns and lines (the data is the
    report's own ``communication``, so it has no JSON key).

    Attributes:
        report: the rank's report (before the section is added).
    """

    report: Report
    key: str | None = None

    def to_dict(self) -> Any:
        """Nothing: the report writes its communication itself."""
        return None

    def columns(self) -> Sequence[Column]:
        """See :func:`communication_columns`."""
        return communication_columns(self.report)

    def lines(self) -> Sequence[str]:
        """See :func:`communication_lines`."""
        return communication_lines(self.report)


@dataclass(frozen=True)
class PipelineSection:
    """A pipeline's stages and bubble as a report section: ``"pipeline"`` in JSON and its lines.

    Attributes:
        pipeline: every stage's report.
    """

    pipeline: PipelineReport
    key: str = "pipeline"

    def to_dict(self) -> Any:
        """The pipeline's summary."""
        return self.pipeline.summary()

    def columns(self) -> Sequence[Column]:
        """None."""
        return ()

    def lines(self) -> Sequence[str]:
        """See :func:`pipeline_lines`."""
        return pipeline_lines(self.pipeline)


def step_lines(step: Any, rank: int) -> list[str]:
    """Lines of a simulated rank's predicted step (:class:`~flopscope.estimate.comm_time
    .RankStep`): compute, communication (per kind, exposed and hidden), the pipeline stage's
    idle time, the step, what kind of figure it is and its measured error.

    Args:
        step: the rank's step.
        rank: the rank.

    Returns:
        Lines of text.
    """
    from flopscope.estimate.display import human_seconds as _seconds

    kind = "prediction" if step.compute_kind == "prediction" else "bound"
    c = step.comm
    kinds = ", ".join(f"{k} {_seconds(v)}" for k, v in sorted(c.by_kind.items(),
                                                               key=lambda kv: -kv[1]))
    error = (f"measured error +-{step.error:.0%} on real jobs (link calibration's error bar)"
             if step.error is not None else "not validated on this profile (no error bar)")
    compute = ("compute predicted from the profile's calibration" if kind == "prediction" else
               "compute at its roofline lower bound (the profile is not calibrated)")
    lines = [f"step time of rank {rank} ({kind}): {_seconds(step.total)} = {compute} "
             f"{_seconds(step.compute)} + exposed communication {_seconds(step.exposed)}"
             + (f", over the pipeline stage's busy fraction (idle {step.bubble:.1%})"
                if step.bubble else "") + f"; {error}"]
    if c.by_kind:
        lines.append(f"  communication {_seconds(c.total)} ({kinds}): exposed "
                     f"{_seconds(step.exposed)}, hidden behind compute "
                     f"{_seconds(c.total - step.exposed)}; links: {step.links}")
        lines.append("  overlap: tensor-parallel all-reduces and all-to-alls block; FSDP2 "
                     "all-gathers are prefetched and reduce-scatters overlap backward (the "
                     "step's first all-gather is exposed); pipeline sends are exposed")
    return lines


def rank_step_section(report: Report, estimate: Any, layout: Any, hardware: Any,
                      gpus_per_node: int | None = None, bubble: float = 0.0) -> Any:
    """The ``"step_time"`` section of a simulated rank's report with ``--hardware``: its
    predicted step (:func:`flopscope.estimate.comm_time.rank_step`), or a line saying why there
    is none (a profile without link figures).

    Args:
        report: the rank's report (its communication records).
        estimate: its :class:`~flopscope.estimate.Estimate`.
        layout: its :class:`~flopscope.distributed.Layout`.
        hardware: the profile.
        gpus_per_node: ranks per node (default 8).
        bubble: the stage's idle fraction (pipeline).

    Returns:
        A :class:`~flopscope.report.sections.DataSection`.
    """
    from flopscope.errors import UsageError
    from flopscope.estimate.comm_time import Links, rank_step
    from flopscope.report.sections import DataSection

    try:
        links = Links.of(hardware, gpus_per_node or 8, layout.world_size)
    except UsageError as e:
        return DataSection("step_time", {"status": "no links", "note": str(e)},
                           (f"step time: not predicted: {e}",))
    cal = hardware.link_calibration
    error = cal.error_bars.get("step") if cal is not None else None
    step = rank_step(estimate, report.communication, links, tp=layout.tp, dp=layout.dp,
                     gpus=layout.world_size, bubble=bubble, error=error)
    rank = report.rank if report.rank is not None else layout.rank
    return DataSection("step_time", step.to_dict(), tuple(step_lines(step, rank)))


def loss_parallel_section(layout: Any, loss: str | None) -> Any:
    """The ``"loss_parallel"`` section of a simulated tensor-parallel rank's report: whether its
    head ran with loss parallelism (:attr:`~flopscope.distributed.Layout.loss_parallel`) and
    what backward ran from.

    Args:
        layout: the rank's :class:`~flopscope.distributed.Layout`.
        loss: what backward ran from (``"sum"``, ``"cross_entropy"``), ``None`` forward only.

    Returns:
        A :class:`~flopscope.report.sections.DataSection` (``{"on": bool, "loss": ...}``).
    """
    from flopscope.report.sections import DataSection

    losses = {"sum": "the sum of the outputs", "cross_entropy": "the causal LM's cross-entropy",
              None: "no loss (forward only)"}
    stage = " of the last pipeline stage" if layout.pp > 1 else ""
    if layout.loss_parallel:
        line = (f"loss parallelism: on: lm_head{stage} column-wise over the vocabulary, its "
                f"logits vocabulary shards on each of the {layout.tp} tensor-parallel ranks; "
                f"backward from {losses[loss]}"
                + (" on the shards (torch's loss_parallel)" if loss == "cross_entropy" else ""))
    else:  # the hint only where --loss-parallel is built (not with experts)
        hint = ("--loss-parallel shards it, as flopscope plan does by default"
                if layout.ep == 1 else "loss parallelism is not built with --ep")
        line = (f"loss parallelism: off: lm_head{stage} whole on every tensor-parallel rank "
                f"({hint}); backward from {losses[loss]}")
    return DataSection("loss_parallel", {"on": layout.loss_parallel, "loss": loss}, (line,))
