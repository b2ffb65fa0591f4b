"""End to end under valgrind: a float64 128x128x128 matmul executes 2*M*N*K FLOPs (within 1 %).

Takes about 40 s, most of it python start-up and ``import torch`` under valgrind (not measured).
"""

from __future__ import annotations

import pytest
import torch

from flopscope.measure import measure
from flopscope.measure.valgrind import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"valgrind backend unavailable: {unavailable_reason()}"
)


def test_matmul_float64_measures_2mnk() -> None:
    m, n, k = 128, 128, 128
    a = torch.randn(m, k, dtype=torch.float64)
    b = torch.randn(k, n, dtype=torch.float64)
    stages: list[str] = []
    result = measure(torch.mm, (a, b), backend="valgrind", progress=stages.append)
    expected = 2 * m * n * k
    assert abs(result.flops / expected - 1) < 0.01, (result.flops, expected, result.notes)
    # Everything executed is double precision: no float32 work hides in a float64 matmul.
    assert result.flops_by_precision.get("double", 0) >= 0.99 * result.flops
    assert result.backend == "valgrind"
    assert result.notes[0].startswith("backend valgrind")
    assert any("measured region" in s for s in stages)
