"""Measured time beside every count (issue 27): :func:`~flopscope.timing.api.profile` counts a
model, runs it for real under ``torch.profiler`` and joins every counted operator call to its
measured time (:mod:`~flopscope.timing.join`, :mod:`~flopscope.timing.run`);
:class:`~flopscope.timing.display.MeasuredSection` shows it in a report (per operator and module,
achieved rates, efficiency against the roofline bound, the time outside every operator);
:func:`~flopscope.timing.block.profiling` counts and measures any block of code in one run;
:mod:`~flopscope.timing.trace` writes the Chrome/Perfetto traces, measured and estimated.
"""

from flopscope.timing.api import ProfileResult, profile
from flopscope.timing.block import Profiling, profiling
from flopscope.timing.run import CallTime, Timing

__all__ = ["CallTime", "ProfileResult", "Profiling", "Timing", "profile", "profiling"]
