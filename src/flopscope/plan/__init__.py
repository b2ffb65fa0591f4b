"""Plan how to train a model on N devices, from the operators its ranks run.

``flopscope.plan(source, gpus=N, hardware=...)`` (and ``flopscope plan SOURCE --gpus N``)
enumerates the layouts that divide the model and the devices (tensor x pipeline x FSDP2
degrees, micro-batch, activation checkpointing; :mod:`flopscope.plan.space`), simulates each
distinct rank role once on torch's fake process group (:mod:`flopscope.plan.roles`), and gives
each layout its per-device peak memory, step time (:mod:`flopscope.plan.timing`), tokens per
second per device and MFU; layouts that do not fit are dropped with the reason, the rest ranked
(:mod:`flopscope.plan.planner`). ``mode="serve"`` plans serving instead: prefill and decode step
times, weights and KV-cache memory, the largest batch that fits, tokens/s and latency per token
(:mod:`flopscope.plan.serve`). ``sweep(...)`` (``from flopscope.plan import sweep``) plans many
models x device counts x sequence lengths, the roles simulated in worker processes or on Ray
(:mod:`flopscope.plan.sweeps`).
See ``docs/plan.md``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from flopscope.plan.candidate import Candidate
from flopscope.plan.planner import Plan, plan
from flopscope.plan.serve import ServePlan
from flopscope.plan.serve_rows import ServeCandidate, ServeLayout
from flopscope.plan.space import Choice, enumerate_layouts, parse_bytes
from flopscope.plan.sweeps import SweepRow, sweep
from flopscope.plan.timing import StepTime, step_time

__all__ = ["Candidate", "Choice", "Plan", "ServeCandidate", "ServeLayout", "ServePlan", "StepTime",
           "SweepRow", "enumerate_layouts", "parse_bytes", "plan", "step_time", "sweep"]


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`plan`: ``flopscope.plan(...)`` works whether the
    attribute ``flopscope.plan`` is the function or (once the package is imported) the
    package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Plan | ServePlan:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
