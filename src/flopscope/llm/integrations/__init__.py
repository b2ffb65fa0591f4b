"""Training-framework callbacks that log flopscope's step figures through the framework's own
logging: :mod:`~flopscope.llm.integrations.hf` (``transformers.TrainerCallback``) and
:mod:`~flopscope.llm.integrations.lightning` (``lightning.Callback``). Each imports its framework
only when used; both take their options and make their monitor in one place,
:class:`~flopscope.llm.integrations.base.MonitorCallback`. A plain loop uses
:class:`flopscope.llm.monitor.TrainingMonitor` directly."""

from __future__ import annotations

__all__: list[str] = []
