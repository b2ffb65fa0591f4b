"""Operator-family findings of docs/validation.md, re-measured under valgrind (slow tier:
``FLOPSCOPE_SLOW=1``; each test starts python under valgrind, 2-4 minutes here).

- The CPU flash kernel under ``is_causal`` at 1,024 tokens computes 3/4 of the dense score blocks:
  measured causal / measured dense equals flopscope's executed / counted attention figure.
- The element-wise and GEMM rows that hold exactly: ``relu`` and ``mul`` 1.0000, ``mm`` within 2 %.
"""

from __future__ import annotations

import os

import pytest

from flopscope.measure import MeasureRequest, measure_request
from flopscope.measure.valgrind import unavailable_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"), reason="slow tier: FLOPSCOPE_SLOW=1"),
    pytest.mark.skipif(unavailable_reason() is not None,
                       reason=f"valgrind backend unavailable: {unavailable_reason()}"),
]

OPS = "benchmarks/validation_ops.py"


def _per_module(source: str) -> dict[str, tuple[int, int]]:
    result = measure_request(MeasureRequest(source, dtype="float64"), backend="valgrind")
    return {s.path: (s.counted_flops, s.measured_flops) for s in result.comparison.segments}


def test_causal_flash_attention_executes_the_computed_blocks() -> None:
    from flopscope.llm.pairs import cpu_flash_executed_pairs

    rows = _per_module(f"{OPS}:causal_pair")
    dense_counted, dense = rows["attention__sdpa_dense__L1024"]
    causal_counted, causal = rows["attention__sdpa_causal__L1024"]
    assert dense_counted == causal_counted  # the count is dense by convention
    expected = cpu_flash_executed_pairs(1024, 1024, causal=True) / (1024 * 1024)
    assert expected == 0.75
    assert abs(causal / dense - expected) < 0.005, (causal, dense)


@pytest.mark.parametrize(("name", "low", "high"), [
    ("activation__relu__r64", 1.0, 1.0),
    ("elementwise__mul__r64", 1.0, 1.0),
    ("matmul__mm__n64", 1.0, 1.02),
    ("elementwise__add__r64", 2.0, 2.0),  # self + alpha * other: the multiply by alpha runs
])
def test_exact_rows(name: str, low: float, high: float) -> None:
    result = measure_request(MeasureRequest(f"{OPS}:{name}", dtype="float64"), backend="valgrind")
    counted, measured = result.comparison.counted_flops, result.comparison.measured_flops
    assert low <= measured / counted <= high, (counted, measured)
