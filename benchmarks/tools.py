"""Adapters: one function per FLOP counter, all returning multiply-accumulates (MACs).

Every adapter takes ``(model, inputs, backward)`` and returns a :class:`ToolResult`. How each tool's
number becomes MACs is written in :data:`CONVERSIONS` (the benchmark document prints it).
"""

from __future__ import annotations

import copy
import importlib.metadata
import io
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_iter

import flopscope


@dataclass
class ToolResult:
    """One tool's count of one model: MACs (``None`` when it failed or cannot do it) and why."""

    macs: float | None
    missing: dict[str, int] = field(default_factory=dict)  # ops the tool says it did not count
    error: str = ""


class Unsupported(Exception):
    """The tool cannot do what was asked (e.g. count a backward pass)."""


Adapter = Callable[[nn.Module, tuple[Any, ...], bool], ToolResult]

CONVERSIONS = {
    "flopscope": "`Report.macs` (sums of products only; FLOPs are reported separately).",
    "FlopCounterMode": "`get_total_flops() / 2`: torch counts 2 FLOPs per multiply-accumulate and "
                       "counts only matmul, convolution and attention operators.",
    "thop": "`profile()[0]` as is: thop's number is MACs for conv/linear, but it also adds "
            "element counts for batch norm, activations, pooling and upsampling from its module hooks.",
    "fvcore": "`FlopCountAnalysis.total()` as is: fvcore calls it FLOPs, but counts one per "
              "multiply-accumulate for matmul/conv/einsum, plus element counts for norms, pooling "
              "and upsampling.",
    "ptflops": "`get_model_complexity_info(..., backend='pytorch')[0]` as is (MACs; also counts "
               "element-wise module work, and patched functionals such as `F.relu`, `torch.matmul`).",
    "ptflops-aten": "`get_model_complexity_info(..., backend='aten')[0]` as is (MACs of "
                    "`aten.mm`, `aten.matmul`, `aten.addmm`, `aten.bmm`, `aten.convolution`).",
    "calflops": "`calculate_flops()[1]` (its MACs output). With `include_backPropagation=True` it "
                "multiplies the forward by 3 (a fixed factor, not a count of the backward).",
}


def _roots(out: Any) -> list[torch.Tensor]:
    return [t for t in tree_iter(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _backward(model: nn.Module, out: Any) -> None:
    """The same backward flopscope's ``count(backward=True)`` runs: d(outputs)/d(params)."""
    roots = _roots(out)
    params = [p for p in model.parameters() if p.requires_grad]
    torch.autograd.grad(roots, params, grad_outputs=[torch.ones_like(t) for t in roots],
                        allow_unused=True)


def run_flopscope(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    report = flopscope.count(model, *inputs, backward=backward, warn=False)
    return ToolResult(report.macs, dict(report.uncounted))


def run_flop_counter_mode(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        out = model(*inputs)
        if backward:
            _backward(model, out)
    return ToolResult(mode.get_total_flops() / 2)


def _quiet() -> Any:
    class Quiet:
        def __enter__(self) -> None:
            self.out, self.err = redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO())
            self.warn = warnings.catch_warnings()
            self.warn.__enter__()
            warnings.simplefilter("ignore")
            self.out.__enter__()
            self.err.__enter__()

        def __exit__(self, *exc: Any) -> None:
            self.err.__exit__(*exc)
            self.out.__exit__(*exc)
            self.warn.__exit__(*exc)

    return Quiet()


def run_thop(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    if backward:
        raise Unsupported("thop counts forward module hooks only")
    from thop import profile

    # thop registers total_ops/total_params buffers on every module: count a copy, as its users must
    with _quiet():
        macs, _ = profile(copy.deepcopy(model), inputs=inputs, verbose=False)
    return ToolResult(float(macs))


def run_fvcore(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    if backward:
        raise Unsupported("fvcore traces the forward only")
    from fvcore.nn import FlopCountAnalysis

    with _quiet():
        analysis = FlopCountAnalysis(model, inputs)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        analysis.tracer_warnings("none")
        total = analysis.total()
        missing = dict(analysis.unsupported_ops())
    return ToolResult(float(total), missing)


def _ptflops(backend: str) -> Adapter:
    def run(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
        if backward:
            raise Unsupported("ptflops counts the forward only")
        from ptflops import get_model_complexity_info

        if len(inputs) != 1:
            raise Unsupported("the adapter passes one positional input")
        x = inputs[0]
        with _quiet():
            macs, _ = get_model_complexity_info(
                model, tuple(x.shape[1:]), input_constructor=lambda _: x, as_strings=False,
                print_per_layer_stat=False, backend=backend,
            )
        if macs is None:
            raise RuntimeError("ptflops returned None (it swallowed an exception)")
        return ToolResult(float(macs))

    return run


def run_calflops(model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    from calflops import calculate_flops

    with _quiet():
        _, macs, _ = calculate_flops(model, args=list(inputs), include_backPropagation=backward,
                                     print_results=False, print_detailed=False,
                                     output_as_string=False)
    return ToolResult(float(macs))


TOOLS: dict[str, tuple[str, Adapter]] = {
    # name: (distribution to check for, adapter)
    "flopscope": ("flopscope", run_flopscope),
    "FlopCounterMode": ("torch", run_flop_counter_mode),
    "thop": ("thop", run_thop),
    "fvcore": ("fvcore", run_fvcore),
    "ptflops": ("ptflops", _ptflops("pytorch")),
    "ptflops-aten": ("ptflops", _ptflops("aten")),
    "calflops": ("calflops", run_calflops),
}
# The distribution names of the tools as ``pip`` knows them (thop's is "thop", also "ultralytics-thop").
DISTRIBUTIONS = {"flopscope": "flopscope", "torch": "torch", "thop": "thop", "fvcore": "fvcore",
                 "ptflops": "ptflops", "calflops": "calflops"}


def version(dist: str) -> str | None:
    """The installed version of a distribution, or ``None``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def available() -> dict[str, str | None]:
    """Tool name -> version, ``None`` where the tool is not installed or does not import."""
    found: dict[str, str | None] = {}
    for name, (dist, _) in TOOLS.items():
        v = version(dist)
        if v is not None:
            module = {"ptflops": "ptflops", "calflops": "calflops", "fvcore": "fvcore.nn",
                      "thop": "thop"}.get(dist)
            if module is not None:
                try:
                    with _quiet():
                        __import__(module)
                except Exception:  # a tool that installs but does not import is "missing"
                    v = None
        found[name] = v
    return found


def measure(name: str, model: nn.Module, inputs: tuple[Any, ...], backward: bool) -> ToolResult:
    """Run one tool, turning its failures into a result with ``error`` set."""
    _, adapter = TOOLS[name]
    try:
        return adapter(model, inputs, backward)
    except Unsupported as e:
        return ToolResult(None, error=f"n/a: {e}")
    except Exception as e:  # a tool failing on a model is a result, reported in the table
        text = " ".join(str(e).split())
        return ToolResult(None, error=f"{type(e).__name__}: {text[:160]}")
