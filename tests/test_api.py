"""The public surface is small, sorted and complete."""

from __future__ import annotations

import inspect

import flopscope


def test_all_is_sorted_and_complete() -> None:
    for name in flopscope.__all__:  # the public names load on first use, each on its own
        getattr(flopscope, name)        # (see flopscope/__init__.py)
    assert flopscope.__all__ == sorted(flopscope.__all__)
    public = {
        name for name, obj in vars(flopscope).items()
        # a package is public only when it is exported callable (flopscope.plan: the package,
        # callable as its function)
        if not name.startswith("_") and (not inspect.ismodule(obj) or callable(obj))
    }
    assert public == set(flopscope.__all__)


def test_error_classes_subclass_builtins() -> None:
    assert issubclass(flopscope.RuleError, ValueError)
    assert issubclass(flopscope.UsageError, ValueError)
    assert issubclass(flopscope.ForwardError, RuntimeError)
    assert issubclass(flopscope.StrictModeError, RuntimeError)
    for cls in (flopscope.RuleError, flopscope.UsageError, flopscope.ForwardError,
                flopscope.StrictModeError):
        assert issubclass(cls, flopscope.FlopscopeError)


def test_importing_the_package_and_the_cli_does_not_import_torch() -> None:
    """``flopscope --help`` starts fast, and Ctrl-C while torch loads is caught by the entry point."""
    import subprocess
    import sys

    code = ("import sys, flopscope, flopscope.cli; flopscope.cli.build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"



def test_feature_packages_are_attributes() -> None:
    """``flopscope.estimate.roofline(...)`` after ``import flopscope`` alone (a fresh interpreter:
    nothing else imported it first)."""
    import subprocess
    import sys

    code = ("import flopscope; print(flopscope.estimate.roofline.__name__, "
            "flopscope.llm.count_generation.__name__, flopscope.CallObserver.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["roofline", "count_generation", "CallObserver"]


def test_a_public_name_loads_only_its_own_module() -> None:
    """``flopscope.count`` in a fresh interpreter loads what a count needs, not the planner, the
    measured-time or the estimate packages (their import time and memory were a first count's:
    about 1 s and 5.5 MiB of the 70B benchmark's peak); each name is still there when asked."""
    import subprocess
    import sys

    code = ("import sys, flopscope; flopscope.count; "
            "print(*(p in sys.modules for p in ('flopscope.plan', 'flopscope.timing', "
            "'flopscope.estimate', 'flopscope.symbolic.count'))); "
            "print(flopscope.plan.__name__, flopscope.profile.__name__, flopscope.Counter.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["False False False False", "flopscope.plan profile Counter"]


def test_module_queries_take_module() -> None:
    """Every per-module query takes ``module=`` (fvcore's uniform shape): the subtree only."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2))
    r = flopscope.count(model, torch.randn(1, 4))
    assert list(r.by_module(module="0")) == ["0", "0.0", "0.1"]
    # Linear(4, 3): 4 * 3 = 12 MACs; the 3 x 2 Linear is outside "0"
    assert r.by_module(module="0")["0"].inclusive.macs == 12
    assert {m for m, _ in r.by_module_and_op(module="0")} == {"0.0", "0.1"}
    assert sum(s.cost.macs for s in r.by_module_and_op(module="1").values()) == 6  # 3 * 2
    import pytest

    with pytest.raises(flopscope.UsageError, match="no module '2'"):
        r.by_module(module="2")


def test_a_source_string_is_counted_as_the_command_line_loads_it() -> None:
    """``flopscope.count("torchvision:resnet50")`` as ``flopscope count torchvision:resnet50``:
    the model from flopscope.sources with its default input, or the inputs given (the label
    then says those); a bad name is the loader's one-line error."""
    import pytest
    import torch

    report = flopscope.count("torchvision:resnet50", shape_only=True)
    # torchvision's published 4.089 GMACs at 224 x 224 (its default weights' crop)
    assert report.macs == 4_089_184_256
    assert (report.meta.source, report.meta.inputs) == ("torchvision:resnet50",
                                                        ("1x3x224x224",))
    small = flopscope.count("torchvision:resnet50", torch.randn(1, 3, 112, 112), shape_only=True)
    assert small.meta.inputs == ("1x3x112x112",) and small.macs < report.macs
    # inputs wrapped in flopscope.Inputs are labelled by what the model gets, not "Inputs"
    wrapped = flopscope.count("torchvision:resnet50", flopscope.Inputs(torch.randn(1, 3, 112, 112)),
                              shape_only=True)
    assert wrapped.meta.inputs == ("1x3x112x112",) and wrapped.macs == small.macs
    memory = flopscope.estimate.peak_memory("torchvision:resnet50", shape_only=True)
    assert memory.report.macs == report.macs
    with pytest.raises(flopscope.UsageError, match="unknown torchvision model 'resnet5'"):
        flopscope.count("torchvision:resnet5")
    with pytest.raises(flopscope.UsageError, match="or a SOURCE string"):
        flopscope.count(3)


def test_a_model_that_needs_inputs_and_got_none_is_told_before_it_runs() -> None:
    """``count(model)`` for a forward that takes ``x``: a usage error naming ``x`` (it was the
    forward's own TypeError, wrapped as raised in the root module); a forward of no
    arguments is counted."""
    import pytest
    import torch
    from torch import nn

    class Needs(nn.Module):
        def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
            return x * scale

    class Free(nn.Module):
        def forward(self) -> torch.Tensor:
            return torch.ones(3) * 2.0

    with pytest.raises(flopscope.UsageError, match="Needs.forward needs 'x', and count"):
        flopscope.count(Needs())
    assert flopscope.count(Free()).flops == 3  # one multiply per element
    assert flopscope.count(Needs(), torch.ones(4)).flops == 4
