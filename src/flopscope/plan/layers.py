"""A role at its full layer count, or its full microbatch count, from three small simulations
of it.

A role whose stage holds more than :data:`SMALL`'s largest count of decoder layers is simulated
with ``SMALL`` layers per stage (the model cut to its first ``pp x n`` layers, so the stage holds
``n``) and put together at its real count by :mod:`flopscope.distributed.repeat`: the report
(every record, collective and module), the peak of live bytes over the step's calls with where it
is reached and what is live then, the roofline estimate's total and phases, the parameter shards.
The first two small runs give the role at any count; the third is the check: what the first two
give at its count must equal what it simulated (the report record for record, the peak to the
byte with its module, phase and operator, the estimate's integers exactly and its seconds to
1e-9 of their value); if not, the role is simulated whole.

The same goes for a pipeline stage's microbatches (:data:`UNITS`): a role of ``pp`` stages runs
``pp`` microbatches, each the same work on the same shapes, so its counts are affine in them; under
1F1B the first stage runs every forward, then every backward, the second ``pp - 1`` forwards, one
backward, one forward, then the rest, the last a forward and a backward in turn: the live bytes
at a call of microbatch ``i``'s forward (backward) are affine in ``i`` and in ``pp``, as a middle
layer's are in its index and the layer count. So the stage is simulated in pipelines of
:data:`UNIT_SMALL` stages (as many microbatches) and put together at ``pp`` by the same code,
each call's module path prefixed with its microbatch (:class:`Actions`, :func:`by_microbatch`),
checked exact at the third.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from flopscope.cost import Cost, OpCall, Phase
from flopscope.distributed.pipeline import split_layers
from flopscope.distributed.repeat import WIDTH, Frame, NotRepeating, expand_report, line
from flopscope.distributed.repeat_peak import Point, extrapolate_peak
from flopscope.estimate import Estimate, MemoryProfile
from flopscope.estimate.bound import Row
from flopscope.estimate.call_record import CallRecord
from flopscope.report.report import Report

__all__ = ["UNITS", "UNIT_SMALL", "UNIT_WIDTH", "Actions", "Put", "Small", "by_microbatch",
           "check", "combine", "estimate_at", "frame_of", "unit_module"]

#: the path prefix of a pipeline stage's microbatches, as if they were layers
#: (``~microbatch.3.F|model.layers.1.mlp``: a call of microbatch 3's forward in that module)
UNITS = "~microbatch"
#: microbatches at each end of a stage's step that are not taken as repeated: the first, and the
#: backward after the one forward that follows it (FSDP2 gathers the layers again for it)
UNIT_WIDTH = 2
#: the small pipelines' stages (= microbatches): two to build from, one to check
UNIT_SMALL = (2 * UNIT_WIDTH + 1, 2 * UNIT_WIDTH + 2, 2 * UNIT_WIDTH + 3)


@dataclass
class Actions:
    """An observer that notes where each of a pipeline stage's actions starts among the calls
    a memory tracker sees (``run_stage`` tells it: ``on_action``).

    Attributes:
        calls: calls seen so far.
        starts: (calls before it, ``"F"`` or ``"B"``, microbatch) per action, in order.
    """

    calls: int = 0
    starts: list[tuple[int, str, int]] = field(default_factory=list)

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """Count the call (a memory tracker keeps a point for each call that is not a rule's)."""
        if call is not None:
            self.calls += 1

    def on_action(self, kind: str, microbatch: int) -> None:
        """Note that an action starts here."""
        self.starts.append((self.calls, kind, microbatch))


def by_microbatch(points: Sequence[Point], starts: Sequence[tuple[int, str, int]]
                  ) -> list[Point]:
    """Each call point's module path prefixed with its microbatch and action
    (``UNITS.i.K|module``); calls before the first action keep their path. A storage that grew
    outside an operator (op ``resize_``, no call of its own) belongs to the call after it.

    Args:
        points: the call points, in order.
        starts: :attr:`Actions.starts`.

    Returns:
        The points, renamed.
    """
    out: list[Point] = []
    j, t = -1, 0
    for module, phase, op, live in points:
        while j + 1 < len(starts) and starts[j + 1][0] <= t:
            j += 1
        t += op != "resize_"
        if j >= 0:
            module = f"{UNITS}.{starts[j][2]}.{starts[j][1]}|{module}"
        out.append((module, phase, op, live))
    return out


def unit_module(path: str) -> str:
    """The module path of a call named by :func:`by_microbatch` (any other path as it is)."""
    return path.partition("|")[2] if path.startswith(UNITS + ".") else path



@dataclass(frozen=True)
class Small:
    """One simulation of a role, with what the put-together needs.

    Attributes:
        frame: where its stage's layers are in module paths.
        report: the rank's count.
        points: live bytes at each call (``(module, phase, op, category -> bytes)``).
        memory: the memory profile.
        estimate: the roofline estimate.
        parameter_bytes: the rank's parameter shards.
        calls: every operator call's roofline record (what ``estimate`` is summed from), where
            kept (:meth:`flopscope.plan.roles.Roles.small`'s ``calls``).
        parameter_tensors: how many parameter shards the rank holds (each parameter is one,
            sharded or not: the optimizer's calls per parameter); 0: not known.
        parameters_dtensor: the parameters are DTensors (tensor parallelism, FSDP2, expert
            parallelism): each operator of the optimizer on them passes DTensor's dispatch.
        partial_tensors: parameters with a partial gradient after the backward
            (:func:`flopscope.plan.roles.shards`).
        partial_elements: those gradients' elements.
    """

    frame: Frame
    report: Report
    points: list[Point]
    memory: MemoryProfile
    estimate: Estimate
    parameter_bytes: int
    calls: list[CallRecord] = field(default_factory=list)
    parameter_tensors: int = 0
    parameters_dtensor: bool = False
    partial_tensors: int = 0
    partial_elements: int = 0


class Put(NamedTuple):
    """A role put together (:func:`combine`, :func:`flopscope.plan.microbatches.at_step`):
    what a :class:`~flopscope.plan.roles.RoleRun` holds of it."""

    report: Report
    memory: MemoryProfile
    estimate: Estimate
    parameter_bytes: int
    parameter_tensors: int
    parameters_dtensor: bool
    partial_tensors: int = 0
    partial_elements: int = 0

    @classmethod
    def of(cls, run: Small) -> Put:
        """A simulated run as it is."""
        return cls(run.report, run.memory, run.estimate, run.parameter_bytes,
                   run.parameter_tensors, run.parameters_dtensor, run.partial_tensors,
                   run.partial_elements)


def frame_of(prefix: str, layers: int, pp: int, stage: int) -> Frame:
    """Where stage ``stage`` of ``pp``'s layers are when the model has ``layers``."""
    held = split_layers(layers, pp)[stage]
    return Frame(prefix, held.start, len(held))


def _row(a: Row, b: Row, nb: int, n: int) -> Row:
    out = {}
    for f in dataclasses.fields(Row):
        x, y = getattr(a, f.name), getattr(b, f.name)
        out[f.name] = line(x, y, nb, n) if isinstance(y, int) else y + (n - nb) * (y - x)
    return Row(**out)


def estimate_at(a: Estimate, b: Estimate, nb: int, n: int) -> Estimate:
    """The estimate at ``n`` from ``a`` at ``nb - 1`` and ``b`` at ``nb`` (every figure affine)."""
    phases = {p: _row(a.by_phase.get(p, Row()), b.by_phase.get(p, Row()), nb, n)
              for p in {*a.by_phase, *b.by_phase}}
    return Estimate(b.hardware, b.tf32, _row(a.total, b.total, nb, n), phases,
                    tf32_convolution=b.tf32_convolution)


def combine(a: Small, b: Small, c: Small, to: Frame) -> Put:
    """The role at ``to.n`` layers per stage from two small runs (``b`` one layer more; ``c``,
    one more again, only tells which calls outside the layers repeat per layer); with ``to``'s
    prefix :data:`UNITS`, at ``to.n`` microbatches from small pipelines (the boundaries
    :data:`UNIT_WIDTH` microbatches wide; the peak's module path without its microbatch).

    The memory profile has the peak, where it is reached, what is live then and at the end; no
    per-module marks or timeline. The estimate has its total and phases only.

    Args:
        a: the run with fewer layers.
        b: the run with one more.
        c: the run with one more again.
        to: where the stage's layers are at the real count.

    Returns:
        The report, memory, estimate, parameter bytes and shards.

    Raises:
        NotRepeating: the runs do not show one repeated layer.
    """
    nb = b.frame.n
    width = UNIT_WIDTH if to.prefix == UNITS else WIDTH
    report = expand_report(a.report, a.frame, b.report, b.frame, to, width)
    peak = extrapolate_peak(a.points, a.frame, b.points, b.frame, to, width,
                            (c.points, c.frame))
    memory = MemoryProfile(peak.total, unit_module(peak.module), peak.phase, peak.op,
                           {c: v for c, v in peak.live.items() if v},
                           line(a.memory.end_bytes, b.memory.end_bytes, nb, to.n),
                           train=b.memory.train, note=b.memory.note)
    return Put(report, memory, estimate_at(a.estimate, b.estimate, nb, to.n),
               line(a.parameter_bytes, b.parameter_bytes, nb, to.n),
               line(a.parameter_tensors, b.parameter_tensors, nb, to.n),
               b.parameters_dtensor, line(a.partial_tensors, b.partial_tensors, nb, to.n),
               line(a.partial_elements, b.partial_elements, nb, to.n))


def _close(x: Row, y: Row) -> bool:
    for f in dataclasses.fields(Row):
        u, v = getattr(x, f.name), getattr(y, f.name)
        if isinstance(u, int) and isinstance(v, int):
            if u != v:
                return False
        elif not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-15):
            return False
    return True


def check(a: Small, b: Small, c: Small) -> None:
    """That ``a`` and ``b`` give ``c`` (one layer more than ``b``) exactly.

    Args:
        a: the run with the fewest layers.
        b: one more.
        c: one more again.

    Raises:
        NotRepeating: they do not.
    """
    report, memory, estimate, params, tensors, _, partial, partial_elements = combine(
        a, b, c, c.frame)
    m = c.memory
    if report != c.report:
        raise NotRepeating("the put-together report differs from the simulated one")
    if (memory.peak_bytes, memory.peak_module, memory.peak_phase, memory.peak_op,
            memory.at_peak, memory.end_bytes) != (m.peak_bytes, m.peak_module, m.peak_phase,
                                                  m.peak_op, m.at_peak, m.end_bytes):
        raise NotRepeating("the put-together peak differs from the simulated one")
    if params != c.parameter_bytes or tensors != c.parameter_tensors or \
            (partial, partial_elements) != (c.partial_tensors, c.partial_elements) or \
            not _close(estimate.total, c.estimate.total) or \
            estimate.by_phase.keys() != c.estimate.by_phase.keys() or not all(
                _close(estimate.by_phase[p], c.estimate.by_phase[p]) for p in estimate.by_phase):
        raise NotRepeating("the put-together estimate differs from the simulated one")
