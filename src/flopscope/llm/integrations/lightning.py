"""A Lightning ``Callback``: FLOPs per step, tokens/s, TFLOP/s and MFU through ``self.log``.

Lightning shows a callback the batch before the step, so a step with a new signature (shapes,
dtypes, training mode, which parameters require grad) is counted *live*: a Counter is active from
``on_train_batch_start`` to ``on_train_batch_end``, so the forward, the loss, the backward and the
optimizer step are counted as they ran. Later steps with the same signature reuse the count.
Install with ``pip install 'flopscope[lightning]'``.
"""

from __future__ import annotations

from typing import Any

import torch

from flopscope.llm.monitor import StepStats, TrainingMonitor

try:
    import lightning as L
except ImportError as e:  # pragma: no cover - exercised only without lightning
    raise ImportError("flopscope.llm.integrations.lightning needs lightning: "
                      "pip install 'flopscope[lightning]'") from e

__all__ = ["FlopscopeLightningCallback"]


class FlopscopeLightningCallback(L.Callback):
    """Log flopscope's step figures with the LightningModule's ``log_dict``.

    Example::

        trainer = L.Trainer(callbacks=[FlopscopeLightningCallback(peak="h100-sxm")])

    Args:
        peak: hardware peak for MFU (a profile name, a Hardware or FLOP/s); ``None``: no MFU.
        dtype: dtype of the matrix products (picks the profile's peak).
        recount_every: count again every k steps (MoE routing, data-dependent shapes).
        prefix: put before every logged name.
    """

    def __init__(self, *, peak: Any = None, dtype: torch.dtype = torch.bfloat16,
                 recount_every: int | None = None, prefix: str = "flopscope/") -> None:
        super().__init__()
        self.peak, self.dtype, self.recount_every, self.prefix = peak, dtype, recount_every, prefix
        self.monitor: TrainingMonitor | None = None
        self.last: StepStats | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Make the monitor for the module being trained."""
        self.monitor = TrainingMonitor(pl_module, peak=self.peak, dtype=self.dtype,
                                       recount_every=self.recount_every)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        """Start the step (counted live if its signature is new)."""
        if self.monitor is not None:
            self.monitor.begin(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Close the step and log its figures."""
        if self.monitor is None:
            return
        self.last = self.monitor.end()
        pl_module.log_dict(self.last.metrics(self.prefix), on_step=True, on_epoch=False,
                           batch_size=max(self.last.tokens, 1))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close a live count left open by a failing step."""
        if self.monitor is not None:
            self.monitor.abort()
