"""What a Counter tells the user when its ``with`` block ends: one warning per kind of thing a
report cannot show by itself (operators with no rule, TorchScript modules, lazy outputs, work in
threads that were not counted, modules whose work may bypass the dispatcher, layers that ran in
training mode outside a training step)."""

from __future__ import annotations

import warnings

from torch import nn

from flopscope.core.tracker import ModuleTracker
from flopscope.core.training_mode import TRAINING_ADVICE, mode_dependent, warn_training_mode
from flopscope.cost import Phase
from flopscope.errors import FlopscopeWarning
from flopscope.report.report import Report

__all__ = ["warn_about"]


def warn_about(report: Report, tracker: ModuleTracker, stacklevel: int,
               model: nn.Module | None = None) -> None:
    """Emit the warnings a finished count calls for.

    Args:
        report: the count's report.
        tracker: its module tracker (TorchScript, lazy outputs, foreign threads).
        stacklevel: where the warning points, from the caller's frame.
        model: the counted model, to warn about layers that ran in training mode when no
            backward did (:mod:`flopscope.core.training_mode`); ``None`` not to.
    """
    level = stacklevel + 1
    if report.uncounted:
        listed = ", ".join(f"{op} ({n} calls)" for op, n in report.uncounted.items())
        warnings.warn(
            f"flopscope: {len(report.uncounted)} operator(s) had no rule and were counted as 0 "
            f"FLOPs: {listed}. See Report.uncounted; add rules or count with strict=True.",
            FlopscopeWarning, stacklevel=level)
    if tracker.scripted:
        warnings.warn(
            "flopscope: TorchScript modules (torch.jit.script/trace) run their submodules "
            "inside the TorchScript interpreter, so their work is charged to the scripted "
            "module itself and its submodules show no calls: "
            f"{', '.join(repr(p) if p else repr(p) + ' (the model)' for p in tracker.scripted)}. "
            "Count the eager (unscripted) model for a per-submodule breakdown.",
            FlopscopeWarning, stacklevel=level)
    if tracker.lazy:
        listed = ", ".join(f"'{p}' ({t})" for p, t in tracker.lazy.items())
        warnings.warn(
            f"flopscope: these modules returned a lazy object, so the work it does when it is "
            f"consumed is not counted as theirs: {listed}. Consume it inside the forward "
            "(e.g. return a list or tuple instead of a generator).",
            FlopscopeWarning, stacklevel=level)
    if tracker.foreign_calls:
        warnings.warn(
            f"flopscope: the model's modules ran {tracker.foreign_calls} time(s) in another "
            "thread, which this Counter does not count; run that work inside "
            "`with counter.attach():` in the worker thread.",
            FlopscopeWarning, stacklevel=level)
    if report.opaque:
        warnings.warn(
            "flopscope: these modules produced outputs with no arithmetic operator (only "
            f"allocations), so their work may bypass the dispatcher: {', '.join(report.opaque)}. "
            "Give them a module rule.",
            FlopscopeWarning, stacklevel=level)
    if model is not None and Phase.BACKWARD not in report.phases:
        ran = {path for path, n in tracker.calls.items() if n}
        warn_training_mode(mode_dependent(model, ran), TRAINING_ADVICE, stacklevel=level)
