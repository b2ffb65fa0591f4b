"""PAPI backend: preset weighting and availability message."""

from __future__ import annotations

import importlib.util

import pytest

from flopscope.measure.papi import papi_flops, unavailable_reason


def test_presets_are_flops() -> None:
    # PAPI_DP_OPS / PAPI_SP_OPS are already lane-weighted FLOP counts.
    recorded = {"PAPI_DP_OPS": 33_562_624, "PAPI_SP_OPS": 17, "PAPI_TOT_INS": 5}
    assert papi_flops(recorded) == {"double": 33_562_624, "single": 17}


@pytest.mark.skipif(importlib.util.find_spec("pypapi") is not None, reason="pypapi installed")
def test_reason_without_binding() -> None:
    reason = unavailable_reason()
    assert reason is not None and "PAPI Python binding is not installed" in reason
