"""Sharded models: per-rank compute and communication under ``torch.distributed``.

- every collective and point-to-point operator is costed (0 FLOPs) and logged as communication
  (``Report.communication``; conventions in :mod:`flopscope.rules.collectives`);
- under DTensor a report is the rank's work on its local shards, with the logical (global) figure
  beside it (``Report.logical``) and replicated work (``Report.replicated``);
- :func:`simulate` counts one rank of a job of any size on torch's fake process group, with the
  standard tensor-parallel plan and FSDP2 (:class:`Layout`); :func:`count_rank` is the same
  program for a real job, and :func:`gather_reports` brings every rank's report to one rank;
- :func:`simulate_pipeline` counts every stage of a pipeline (``Layout(pp=...)``) under torch's
  pipeline schedules, with the activations and gradients sent between stages and the bubble.

See ``docs/distributed.md``.
"""

from __future__ import annotations

from flopscope.core.comm import CommLog
from flopscope.distributed.gather import gather_reports
from flopscope.distributed.layout import Layout, apply_layout, llama_tp_plan
from flopscope.distributed.pipeline import PipelineReport
from flopscope.distributed.simulate import count_rank, fake_world, simulate, simulate_pipeline

__all__ = [
    "CommLog",
    "Layout",
    "PipelineReport",
    "apply_layout",
    "count_rank",
    "fake_world",
    "gather_reports",
    "llama_tp_plan",
    "simulate",
    "simulate_pipeline",
]
