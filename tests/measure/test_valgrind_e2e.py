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


def test_float32_conv_counts_jit_code() -> None:
    """oneDNN generates its float32 convolution kernel at run time; the instructions have no file
    behind them and are read from the child's memory.  Without that capture this measures ~0.

    oneDNN's direct convolution skips the taps that fall on zero padding: with a 3x3 kernel,
    padding 1 and a 56x56 image, (56 * 3 - 2)**2 of (56 * 3)**2 taps per channel pair run.
    """
    import torch.nn as nn

    from flopscope.measure import measure_model

    torch.manual_seed(0)
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).eval()
    x = torch.randn(1, 64, 56, 56)
    counted = 2 * 64 * 64 * 9 * 56 * 56
    in_bounds = ((56 * 3 - 2) / (56 * 3)) ** 2
    result = measure_model(conv, x, backend="valgrind")
    single = result.flops_by_precision.get("single", 0)
    assert abs(single / (counted * in_bounds) - 1) < 0.005, (single, counted, result.notes)
