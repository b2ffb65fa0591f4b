"""PyTorch's OpInfo database under flopscope: every operator an OpInfo runs is counted.

Default tier: a representative sample of OpInfos (every operator family: element-wise, reductions,
matmul, convolution, pooling, normalization, attention, FFT, linear algebra, special functions,
histograms and searching, distances, losses, indexing) under ``no_grad`` and ``inference_mode``.
Slow tier (``FLOPSCOPE_SLOW=1 .venv/bin/python -m pytest -m slow tests/coverage``): the whole
``op_db``. Both use the first two float32 CPU sample inputs of each OpInfo, as
``scripts/opinfo_coverage.py`` does (run it for the full list with call counts).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal imports it

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "opinfo_coverage.py"
_RUN_SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))


def slow(fn: Callable[..., Any]) -> Any:
    """Mark ``fn`` slow and skip it unless FLOPSCOPE_SLOW is set."""
    skip = pytest.mark.skipif(not _RUN_SLOW, reason="slow tier: set FLOPSCOPE_SLOW=1")
    return pytest.mark.slow(skip(fn))


@cache
def harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("opinfo_coverage", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["opinfo_coverage"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@cache
def opinfos() -> dict[str, Any]:
    h = harness()
    return {h.opinfo_name(info): info for info in h.op_db()}


# Operators that may stay in Report.uncounted, each with the reason. Deliberately zero-FLOP
# operators are not listed here: they have rules (the zero_cost family) and are counted as 0 with
# their bytes. Empty today.
ALLOWED_UNCOUNTED: dict[str, str] = {}

# Known gaps of the whole database (slow tier), with the reason. Empty today: sparse tensors have
# rules and byte counting (rules/sparse.py), F.linear_cross_entropy's chunked custom operators
# have a formula (rules/loss.py).
KNOWN_GAPS: dict[str, str] = {}
KNOWN_ERRORS: dict[str, str] = {}

# One or more OpInfos per operator family (80 OpInfos, about 10 s for both grad modes).
SAMPLE = [
    # element-wise
    "add", "mul", "div.no_rounding_mode", "exp", "sigmoid", "nn.functional.gelu",
    "nn.functional.silu", "clamp", "where", "pow", "atan2", "logaddexp", "heaviside",
    # sparse tensors and fused linear + cross-entropy (formerly known gaps)
    "to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce", "nn.functional.linear_cross_entropy.chunked",
    "nn.functional.linear_cross_entropy.chunked_none",
    # reductions, softmax, losses
    "sum", "mean", "var", "amax", "softmax", "log_softmax", "logsumexp", "cumsum", "norm",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.ctc_loss",
    # matrix products
    "mm", "bmm", "addmm", "matmul", "einsum", "nn.functional.linear", "addr",
    "nn.functional.bilinear",
    # convolution, pooling, interpolation, sampling
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.interpolate.bilinear", "nn.functional.grid_sample",
    "nn.functional.max_unpool2d", "nn.functional.fractional_max_pool2d",
    # normalization, attention
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.rms_norm", "nn.functional.scaled_dot_product_attention",
    # FFT, linear algebra
    "fft.fft", "fft.rfft", "fft.irfft", "fft.fft2", "linalg.solve", "linalg.cholesky",
    "linalg.qr", "linalg.svd", "linalg.eigh", "linalg.inv", "linalg.lstsq",
    # special functions
    "polygamma.polygamma_n_1", "igamma", "special.bessel_j0", "special.zeta",
    # histograms, searching, distances, segments
    "histc", "isin", "median", "sort", "topk", "cdist", "nn.functional.pdist",
    "_segment_reduce.lengths",
    # zero-cost: indexing, concatenation, padding, dropout
    "cat", "index_select", "nn.functional.embedding", "nn.functional.pad.constant",
    "nn.functional.dropout",
]


def _problems(result: Any, allowed: dict[str, str]) -> list[str]:
    unexpected = sorted(op for op in result.uncounted if op not in allowed)
    found = [f"{result.name} [{result.mode}]: uncounted {unexpected}"] if unexpected else []
    return found + [f"{result.name} [{result.mode}]: {e}" for e in result.errors]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", SAMPLE)
def test_sampled_opinfo_is_fully_counted(name: str, mode: str) -> None:
    info = opinfos().get(name)
    assert info is not None, f"OpInfo {name} is not in this torch's op_db; pick another"
    result = harness().check_opinfo(info, mode)
    assert result.samples > 0, f"{name}: no sample ran"
    assert _problems(result, ALLOWED_UNCOUNTED) == []


@slow
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_whole_op_db_is_counted(mode: str) -> None:
    problems: list[str] = []
    for name, info in opinfos().items():
        result = harness().check_opinfo(info, mode)
        if name in KNOWN_ERRORS:
            result.errors = []
        problems += _problems(result, {**ALLOWED_UNCOUNTED, **KNOWN_GAPS})
    assert problems == []
