"""A ``transformers`` ``TrainerCallback``: FLOPs per step, tokens/s, TFLOP/s and MFU in the
Trainer's logs.

The Trainer does not show a callback the batch before the step, so the counts are *shadow*
counts (:mod:`flopscope.llm.monitor`): a forward pre-hook records the inputs of a forward with a
new signature, and after the step flopscope counts forward + backward of those inputs
(shape-only, on a meta copy of the model; real tensors for data-dependent models). The figures
of the latest step are added to every ``logs`` dict the Trainer emits (``on_log``), so
``state.log_history``, the console and the reporting integrations that run after this callback
carry them.
"""

from __future__ import annotations

from typing import Any

from flopscope.llm.integrations.base import MonitorCallback

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("flopscope.llm.integrations.hf needs transformers: "
                      "pip install 'flopscope[hf]'") from e

__all__ = ["FlopscopeCallback"]


class FlopscopeCallback(MonitorCallback, TrainerCallback):
    """Log flopscope's step figures through the Trainer.

    Example::

        trainer = Trainer(model, args, train_dataset=ds,
                          callbacks=[FlopscopeCallback(peak="h100-sxm")])

    Takes :class:`~flopscope.llm.integrations.base.MonitorCallback`'s arguments (``peak``,
    ``dtype``, ``recount_every``, ``prefix``) and raises what it raises.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        """Attach the monitor to the model being trained."""
        if model is not None:
            self.make_monitor(model).attach()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start timing the step."""
        if self.monitor is not None:
            self.monitor.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the step: its figures (a count if its signature is new) and time."""
        if self.monitor is not None:
            self.last = self.monitor.end()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Add the latest step's figures to the Trainer's logs."""
        if self.last is None or logs is None or "loss" not in logs:
            return
        metrics = self.metrics()
        logs.update(metrics)
        if state.log_history:
            state.log_history[-1].update(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the forward hook."""
        if self.monitor is not None:
            self.monitor.detach()
