"""A Lightning ``Callback``: FLOPs per step, tokens/s, TFLOP/s and MFU through ``self.log``.

Lightning shows a callback the batch before the step, so a step with a new signature (shapes,
dtypes, training mode, which parameters require grad) is counted *live*: a Counter is active from
``on_train_batch_start`` to ``on_train_batch_end``, so the forward, the loss, the backward and the
optimizer step are counted as they ran. Later steps with the same signature reuse the count.
Install with ``pip install 'flopscope[lightning]'``.
"""

from __future__ import annotations

from typing import Any

from flopscope.llm.integrations.base import MonitorCallback

try:
    import lightning as L
except ImportError as e:  # pragma: no cover - exercised only without lightning
    raise ImportError("flopscope.llm.integrations.lightning needs lightning: "
                      "pip install 'flopscope[lightning]'") from e

__all__ = ["FlopscopeLightningCallback"]


class FlopscopeLightningCallback(MonitorCallback, L.Callback):
    """Log flopscope's step figures with the LightningModule's ``log_dict``.

    Example::

        trainer = L.Trainer(callbacks=[FlopscopeLightningCallback(peak="h100-sxm")])

    Takes :class:`~flopscope.llm.integrations.base.MonitorCallback`'s arguments (``peak``,
    ``dtype``, ``recount_every``, ``prefix``) and raises what it raises.
    """

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Make the monitor for the module being trained."""
        self.make_monitor(pl_module)

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
        pl_module.log_dict(self.metrics(), on_step=True, on_epoch=False,
                           batch_size=max(self.last.tokens, 1))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close a live count left open by a failing step."""
        if self.monitor is not None:
            self.monitor.abort()
