"""What "the same role" means for a role put together from small simulations (small layer
counts, small pipelines) against the whole simulation: the report record for record, the peak
to the byte with where it is reached and what is live then and at the end, the parameter
shards, and the estimate's per-phase integers exactly and seconds to 1e-12."""

from __future__ import annotations

import math
from typing import Any

from flopscope.plan.roles import RoleRun


def memory(run: RoleRun) -> tuple[Any, ...]:
    """The role's peak, where it is reached, what is live then and at the end."""
    m = run.memory
    return m.peak_bytes, m.peak_module, m.peak_phase, m.peak_op, m.at_peak, m.end_bytes


def assert_same_role(fast: RoleRun, slow: RoleRun) -> None:
    """Assert that ``fast`` (put together) is ``slow`` (simulated whole)."""
    assert fast.report == slow.report
    assert memory(fast) == memory(slow)
    assert fast.parameter_bytes == slow.parameter_bytes
    assert fast.estimate.by_phase.keys() == slow.estimate.by_phase.keys()
    for phase, row in slow.estimate.by_phase.items():
        got = fast.estimate.by_phase[phase]
        assert (got.calls, got.flops, got.bytes) == (row.calls, row.flops, row.bytes)
        # float sums in another order: equal to 1e-12 of their value
        assert math.isclose(got.time_s, row.time_s, rel_tol=1e-12)
