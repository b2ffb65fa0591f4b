"""PyTorch's module database under flopscope: every ``nn`` module counts with nothing uncounted.

``torch.testing._internal.common_modules.module_db`` lists the ``torch.nn`` modules with
constructor and forward inputs. Each module is built from its first two inputs (float32, CPU) and
run inside a ``flopscope.Counter``: in eval mode forward + backward (of the sum of its floating
outputs), in training mode forward + backward, and in eval mode under ``torch.inference_mode()``.
A sample whose plain run fails too is skipped. Default tier: a sample of module kinds; slow tier
(``FLOPSCOPE_SLOW=1``): the whole database.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves

import flopscope

pytest.importorskip("expecttest")  # torch.testing._internal imports it

_RUN_SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))

# module -> why it may leave an operator uncounted (whole database, slow tier)
KNOWN_GAPS: dict[str, str] = {}  # module name -> why an operator stays uncounted (none now)
# module -> why counting it raises (whole database, slow tier)
KNOWN_ERRORS: dict[str, str] = {}  # module name -> why flopscope raises on it (none now)
SAMPLE = ["nn.LSTM", "nn.GRU", "nn.RNN", "nn.LSTMCell", "nn.MultiheadAttention",
          "nn.TransformerEncoderLayer", "nn.Conv2d", "nn.ConvTranspose2d", "nn.BatchNorm2d",
          "nn.GroupNorm", "nn.Embedding", "nn.ReplicationPad2d",
          "nn.CTCLoss", "nn.FractionalMaxPool2d", "nn.LazyConv2d", "nn.MultiMarginLoss",
          "nn.MultiLabelMarginLoss"]
MODES = ["eval", "train", "inference_mode"]


@cache
def modules() -> dict[str, Any]:
    from torch.testing._internal.common_modules import module_db

    return {info.name: info for info in module_db}


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def check_module(info: Any, mode: str, *, samples: int = 2) -> tuple[int, dict[str, int], list[str]]:
    """Run ``info``'s first ``samples`` module inputs under flopscope in ``mode``.

    Returns:
        (samples that ran, uncounted operators with call counts, errors raised by flopscope).
    """
    training = mode == "train"
    try:
        inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                         requires_grad=mode != "inference_mode",
                                         training=training)
    except Exception:  # noqa: BLE001 - a broken input generator is torch's, not ours
        return 0, {}, []
    ran, uncounted, errors = 0, {}, []
    for module_input in inputs[:samples]:
        if module_input.forward_input is None:
            continue
        ctor, fwd = module_input.constructor_input, module_input.forward_input
        try:
            module = info.module_cls(*ctor.args, **ctor.kwargs).train(training)
        except Exception:  # noqa: BLE001 - not constructible here: torch's problem
            continue

        def run(module: torch.nn.Module = module, fwd: Any = fwd) -> None:
            if mode == "inference_mode":
                with torch.inference_mode():
                    module(*fwd.args, **fwd.kwargs)
                return
            outs = [t for t in _tensors(module(*fwd.args, **fwd.kwargs))
                    if t.requires_grad and t.is_floating_point()]
            if outs:
                sum(t.sum() for t in outs).backward()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with flopscope.Counter(warn=False) as counter:
                    run()
            except Exception as exc:  # noqa: BLE001 - classified below
                try:
                    run()
                except Exception:  # noqa: BLE001 - fails without flopscope as well
                    continue
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
        ran += 1
        for op, calls in counter.report.uncounted.items():
            uncounted[op] = uncounted.get(op, 0) + calls
    return ran, uncounted, errors


def _slow(fn: Callable[..., Any]) -> Any:
    skip = pytest.mark.skipif(not _RUN_SLOW, reason="slow tier: set FLOPSCOPE_SLOW=1")
    return pytest.mark.slow(skip(fn))


@pytest.mark.parametrize("mode", MODES)
def test_sampled_modules_are_fully_counted(mode: str) -> None:
    problems = []
    total = 0
    for name in SAMPLE:
        ran, uncounted, errors = check_module(modules()[name], mode)
        total += ran
        if uncounted or errors:
            problems.append(f"{name} [{mode}]: uncounted {uncounted} errors {errors}")
    assert total > 0
    assert problems == []


@_slow
@pytest.mark.parametrize("mode", MODES)
def test_whole_module_db_is_counted(mode: str) -> None:
    problems = []
    for name, info in modules().items():
        ran, uncounted, errors = check_module(info, mode)
        if uncounted and name not in KNOWN_GAPS:
            problems.append(f"{name} [{mode}]: uncounted {uncounted}")
        if errors and name not in KNOWN_ERRORS:
            problems.append(f"{name} [{mode}]: {errors[0]}")
    assert problems == []
