"""The communication log: collectives seen by a :class:`~flopscope.Counter`, per module, phase,
kind and process group (its size and name) (conventions: :mod:`flopscope.rules.collectives`).

A :class:`~flopscope.Counter` installs a :class:`CommLog` as one of its observers the first time
an operator from a distributed namespace runs, and puts its :meth:`CommLog.records` in
``Report.communication``.
"""

from __future__ import annotations

from flopscope.cost import Cost, OpCall, Phase
from flopscope.report.records import CommRecord
from flopscope.rules.collectives import NAMESPACES, communication

__all__ = ["CommLog"]


class CommLog:
    """Accumulates what collectives send (a :class:`~flopscope.core.counter.CallObserver`)."""

    def __init__(self) -> None:
        # (module path, phase, kind, group size, group) -> [calls, payload bytes, bus bytes]
        self._acc: dict[tuple[str, Phase, str, int, str], list[int]] = {}

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call: logged when it is a collective.

        Args:
            path: the module path that made the call.
            phase: its phase.
            op: the operator's report name.
            call: the call (``None`` for a module rule's cost).
            cost: what it cost (unused).
        """
        if call is None or getattr(call.op, "namespace", None) not in NAMESPACES:
            return
        for c in communication(call):
            key = (path, phase, c.kind, c.group_size, c.group)
            sums = self._acc.get(key)
            if sums is None:
                sums = self._acc[key] = [0, 0, 0]
            sums[0] += 1
            sums[1] += c.payload_bytes
            sums[2] += c.bus_bytes

    def reset(self) -> None:
        """Forget everything (an abandoned attempt of :func:`flopscope.count`)."""
        self._acc.clear()

    def records(self) -> tuple[CommRecord, ...]:
        """The log as report records, in the order the collectives first ran.

        Returns:
            One :class:`~flopscope.report.report.CommRecord` per (module, phase, kind, group).
        """
        return tuple(CommRecord(path, phase, kind, n, calls, payload, bus, group)
                     for (path, phase, kind, n, group), (calls, payload, bus)
                     in self._acc.items())
