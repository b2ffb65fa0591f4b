"""``flopscope.profile``: count a model and measure it, every counted call joined to its
measured time; the report carries the measurement as a section."""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import nn

from flopscope.estimate.hardware import get_hardware
from flopscope.estimate.profile import Hardware
from flopscope.report.report import Report
from flopscope.report.source import SourceInfo
from flopscope.timing.display import MeasuredSection
from flopscope.timing.run import Timing, measure

__all__ = ["ProfileResult", "profile"]


class ProfileResult(NamedTuple):
    """What :func:`profile` returns (it unpacks as ``report, timing``).

    Attributes:
        report: the count, with the measured time as its ``"measured"`` section.
        timing: every counted call with its measured time, the runs' wall times.
    """

    report: Report
    timing: Timing


def profile(
    model: nn.Module | str,
    /,
    *args: Any,
    backward: bool = False,
    train: bool = False,
    optimizer: Any = "adamw",
    warmup: int = 2,
    repeat: int = 5,
    hardware: str | Hardware | None = None,
    tf32: bool | None = None,
    rules: Any = None,
    source: SourceInfo | None = None,
    **kwargs: Any,
) -> ProfileResult:
    """Count ``model(*args, **kwargs)``, run it for real under ``torch.profiler`` and join every
    counted operator call to its measured time (:mod:`flopscope.timing`).

    Example::

        report, timing = flopscope.profile(model, x, hardware="this-machine")
        print(report)          # measured time, achieved FLOP/s, efficiency per module
        timing.wall_s          # the median run's wall time

    Args:
        model: the model, on real tensors, or a SOURCE string (``"torchvision:resnet50"``:
            :func:`flopscope.sources.named`, its default inputs unless given).
        *args: its positional arguments (or one :class:`flopscope.Inputs`).
        backward: forward and backward (parameter gradients); otherwise an inference forward
            under ``no_grad``.
        train: a steady-state training step (train mode, forward, backward of the summed
            outputs, ``optimizer.step()``; a warm-up step first).
        optimizer: with ``train``: ``"adamw"`` (default), ``"adam"``, ``"sgd"``, ``None``, or a
            function of the parameters.
        warmup: unmeasured runs first.
        repeat: measured runs (the figures are the median run's; the spread is over all).
        hardware: a profile (name, file, ``"this-machine"`` or a Hardware) for each call's
            roofline bound, efficiency and time above the roof; ``None``: measured time only.
        tf32: float32 products as TF32 on ``hardware``.
        rules: extra rules, as for :func:`flopscope.count`.
        source: where the model came from (the report's ``meta``).
        **kwargs: keyword arguments of the model.

    Returns:
        The report (with the ``"measured"`` section) and the :class:`Timing`.

    Raises:
        UsageError: a model on ``meta``, bad run counts, an unknown hardware profile.
    """
    hw = get_hardware(hardware) if hardware is not None else None
    report, timing = measure(model, *args, backward=backward, train=train, optimizer=optimizer,
                             warmup=warmup, repeat=repeat,
                             hardware=hw, tf32=tf32, rules=rules, source=source, **kwargs)
    section = MeasuredSection(timing, tuple(report.modules))
    return ProfileResult(report.with_sections(section), timing)
