"""``flopscope.profiling``: count and measure any block of code in one run (a training loop, a
decode loop, a step with its data loading), every counted operator call joined to its time.

:func:`flopscope.profile` counts a model once and measures it in separate runs, without
flopscope's dispatch mode; a block of the user's code runs once, so here the count and the
measurement are the same run: the block runs inside a :class:`~flopscope.Counter` and
``torch.profiler`` together. The counting mode's work then sits inside each operator's event,
around the operator dispatched again below the mode (an event of the same name nested in it):
each call's time is that inner event, the operator's own (:func:`~flopscope.timing.join.innermost`),
and the mode's share is measured and reported apart (:attr:`~flopscope.timing.run.Timing.countings`),
inside the time outside the calls. The rest of the counting (module hooks) is in that time too:
the block's wall time is the counted run's, longer than an uncounted run of the same code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from flopscope.core.counter import Counter
from flopscope.core.unseen import unseen
from flopscope.errors import UsageError
from flopscope.estimate.hardware import get_hardware
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog
from flopscope.report.report import Report
from flopscope.rules.user import RulesArg
from flopscope.timing.display import MeasuredSection
from flopscope.timing.join import REGION, events_of
from flopscope.timing.run import CallList, Timing, join_calls, module_ranges, recording

__all__ = ["Profiling", "profiling"]


@dataclass
class Profiling:
    """What :func:`profiling` gives the ``with`` block; filled in when the block ends.

    Attributes:
        counter: the Counter the block runs in (its report is the count).
        report: the count with the measured time as its ``"measured"`` section (after the block).
        timing: every counted call with its measured time (after the block).
    """

    counter: Counter
    report: Report | None = None
    timing: Timing | None = None


@contextmanager
def profiling(
    model: nn.Module | None = None,
    *,
    hardware: str | Hardware | None = None,
    tf32: bool | None = None,
    rules: RulesArg = None,
    cuda: bool | None = None,
) -> Iterator[Profiling]:
    """Count and measure the ``with`` block: any code, run once (a few training steps, a decode
    loop); operator calls are attributed to ``model``'s modules.

    Example::

        with flopscope.profiling(model, hardware="this-machine") as p:
            for batch in batches:
                loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
        print(p.report)       # counts, measured time, efficiency per module and operator

    Args:
        model: the model whose modules name the rows (``None``: every call is the root's).
        hardware: a profile for each call's roofline bound (name, file, ``"this-machine"`` or a
            Hardware); ``None``: measured time only.
        tf32: float32 products as TF32 on ``hardware``.
        rules: extra rules, as for :class:`flopscope.Counter`.
        cuda: record CUDA kernels (their time is a call's time); default: when ``model`` has a
            parameter on a CUDA device.

    Yields:
        A :class:`Profiling`, whose ``report`` and ``timing`` are set when the block ends.

    Raises:
        UsageError: ``model`` is on ``meta`` (nothing to measure), an unknown hardware profile,
            or the block recorded no operator call.
    """
    from torch.profiler import record_function

    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    if model is not None and any(p.is_meta for p in model.parameters()):
        raise UsageError("profiling measures a real run: the model holds meta tensors (count it "
                         "shape-only with flopscope.count instead)")
    if cuda is None:
        cuda = model is not None and any(p.is_cuda for p in model.parameters())
    calls, log = CallList(), CallLog()
    counter = Counter(model, rules=rules, warn=False, observers=[calls, log])
    result = Profiling(counter)
    with ExitStack() as stack:
        prof = stack.enter_context(recording(cuda))
        if model is not None:
            stack.enter_context(module_ranges(model))
        stack.enter_context(counter)
        region = record_function(REGION)
        with unseen():  # the profiler's own operators are not the block's
            region.__enter__()
        try:
            yield result
        finally:
            if cuda:
                torch.cuda.synchronize()
            with unseen():
                region.__exit__(None, None, None)
    if not calls.calls:
        raise UsageError("the profiled block ran no operator: put the model's work inside the "
                         "`with flopscope.profiling(...)` block")
    timing = join_calls(calls.calls, log, events_of(prof.events()), 0,
                        "cuda" if cuda else "cpu", hw, tf32, counted=True)
    report = counter.report
    result.timing = timing
    result.report = report.with_sections(MeasuredSection(timing, tuple(report.modules)))

