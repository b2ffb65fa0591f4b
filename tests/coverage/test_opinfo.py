"""PyTorch's OpInfo database under flopscope: every operator an OpInfo runs is counted.

Default tier: a representative sample of OpInfos (every operator family: element-wise, reductions,
matmul, convolution, pooling, normalization, attention, FFT, linear algebra, special functions,
histograms and searching, distances, losses, indexing) under ``no_grad`` and ``inference_mode``.
Slow tier (``FLOPSCOPE_SLOW=1 .venv/bin/python -m pytest -m slow tests/coverage``): the whole
``op_db``. Both use the first two float32 CPU sample inputs of each OpInfo, as
``scripts/opinfo_coverage.py`` does (run it for the full list with call counts).

Beyond the forward in float32, the same OpInfos run forward + backward (samples with
``requires_grad``, the backward of the sum of every floating output; OpInfos that support
autograd) and forward in float64, complex64, int64 and float8_e4m3fn (where the OpInfo supports
the dtype on the CPU): the sample in the default tier (no float8 there), the whole database in the
slow tier.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves

import flopscope

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

# Known gaps of the whole database in the backward sweep (slow tier), with the reason.
KNOWN_BACKWARD_GAPS: dict[str, str] = {}  # none now (the margin losses' gradients have rules)

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


_KINDS = {"backward": torch.float32, "float64": torch.float64, "complex64": torch.complex64,
          "int64": torch.int64, "float8_e4m3fn": torch.float8_e4m3fn}
# the OpInfo sample has no float8 operator (the fp8 products run in the slow tier)
_SAMPLED_KINDS = ["backward", "float64", "complex64", "int64"]


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _forward_backward(info: Any, sample: Any) -> None:
    """The OpInfo's forward on ``sample`` and the backward of the sum of its floating outputs
    (complex outputs through their absolute value)."""
    out = info(sample.input, *sample.args, **sample.kwargs)
    outs = [t for t in _tensors(out)
            if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if outs:
        sum((t.abs() if t.is_complex() else t).sum() for t in outs).backward()


def check_kind(info: Any, kind: str, *, samples: int = 2) -> Any:
    """Run the first ``samples`` samples of ``info`` under flopscope as ``kind``: ``"backward"``
    (float32, forward + backward), or a dtype's name (``"float64"``, ``"complex64"``,
    ``"int64"``, ``"float8_e4m3fn"``: forward under no_grad).

    Returns:
        An ``OpInfoResult`` (mode = ``kind``), or ``None`` where the OpInfo does not support the
        dtype (or autograd, for ``"backward"``) on the CPU. A sample that also fails without
        flopscope is skipped, not blamed on flopscope.
    """
    dtype = _KINDS[kind]
    grad = kind == "backward"
    if dtype not in info.supported_dtypes("cpu") or (grad and not info.supports_autograd):
        return None
    result = harness().OpInfoResult(harness().opinfo_name(info), kind)
    try:
        it = iter(info.sample_inputs("cpu", dtype, requires_grad=grad))
        inputs = [s for s, _ in zip(it, range(samples), strict=False)]
    except Exception:  # noqa: BLE001 - a broken sample generator is torch's, not ours
        return result

    def call(sample: Any) -> None:
        if grad:
            _forward_backward(info, sample)
        else:
            with torch.no_grad():
                info(sample.input, *sample.args, **sample.kwargs)

    for sample in inputs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with flopscope.Counter(warn=False) as counter:
                    call(sample)
            except Exception as exc:  # noqa: BLE001 - classified below
                try:
                    call(sample)
                except Exception:  # noqa: BLE001 - fails without flopscope as well
                    result.skipped += 1
                    continue
                result.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
        result.samples += 1
        for op, calls in counter.report.uncounted.items():
            result.uncounted[op] = result.uncounted.get(op, 0) + calls
    return result


@pytest.mark.parametrize("kind", _SAMPLED_KINDS)
def test_sampled_opinfo_backward_float64_complex(kind: str) -> None:
    problems: list[str] = []
    ran = 0
    # backward over the whole sample; the other dtypes over every third OpInfo of it (the same
    # rules as float32, in another dtype: the slow tier runs them all)
    for name in SAMPLE if kind == "backward" else SAMPLE[::3]:
        result = check_kind(opinfos()[name], kind)
        if result is None:
            continue
        ran += result.samples
        problems += _problems(result, ALLOWED_UNCOUNTED)
    assert ran > 0
    assert problems == []


@slow
@pytest.mark.parametrize("kind", list(_KINDS))
def test_whole_op_db_backward_float64_complex(kind: str) -> None:
    problems: list[str] = []
    for info in opinfos().values():
        result = check_kind(info, kind)
        if result is not None:
            problems += _problems(result, {**ALLOWED_UNCOUNTED, **KNOWN_BACKWARD_GAPS})
    assert problems == []
