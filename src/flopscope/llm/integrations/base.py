"""What the training-framework callbacks share: their options and the monitor they make.

:class:`MonitorCallback` is mixed in before the framework's own callback class
(``class FlopscopeCallback(MonitorCallback, TrainerCallback)``); it holds the options, makes the
:class:`~flopscope.llm.monitor.TrainingMonitor` when training starts and keeps the latest
:class:`~flopscope.llm.monitor.StepStats`. It imports no framework.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flopscope.llm.monitor import StepStats, TrainingMonitor

__all__ = ["MonitorCallback"]


class MonitorCallback:
    """The options and state every flopscope training callback has.

    Args:
        peak: hardware peak for MFU (a profile name, a Hardware or FLOP/s); ``None``: no MFU.
        dtype: dtype of the matrix products (picks the profile's peak).
        recount_every: count again every k steps (MoE routing, data-dependent shapes).
        prefix: put before every logged name.

    Raises:
        UsageError: an unknown hardware profile or a peak that is not positive (checked here,
            before training starts, not at the first step).
    """

    def __init__(self, *, peak: Any = None, dtype: torch.dtype = torch.bfloat16,
                 recount_every: int | None = None, prefix: str = "flopscope/") -> None:
        from flopscope.llm.flops import peak_flops

        super().__init__()
        if peak is not None:
            peak_flops(peak, dtype)  # a bad profile name fails now, not when training starts
        self.peak, self.dtype, self.recount_every, self.prefix = peak, dtype, recount_every, prefix
        self.monitor: TrainingMonitor | None = None
        self.last: StepStats | None = None

    def make_monitor(self, model: nn.Module) -> TrainingMonitor:
        """A :class:`TrainingMonitor` of ``model`` with these options (kept in :attr:`monitor`).

        Args:
            model: the model being trained.

        Returns:
            The monitor.
        """
        self.monitor = TrainingMonitor(model, peak=self.peak, dtype=self.dtype,
                                       recount_every=self.recount_every)
        return self.monitor

    def metrics(self) -> dict[str, float]:
        """The latest step's figures under :attr:`prefix` (empty before the first step)."""
        return self.last.metrics(self.prefix) if self.last is not None else {}
