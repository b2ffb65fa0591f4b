"""flopscope: parameters, MACs, FLOPs and bytes of PyTorch models, per module and per operator.

    >>> report = flopscope.count(model, x)
    >>> report.macs, report.flops, report.params

The public names are loaded on first use (PEP 562), so ``import flopscope`` and the command line's
start do not import torch until something needs it (Ctrl-C while torch loads exits cleanly).
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

__version__ = "0.1.0"  # the one place the version is written (pyproject reads it)

# public name -> the module that defines it
_EXPORTS = {
    "CallObserver": "flopscope.core.observers",
    "Cost": "flopscope.cost",
    "Costed": "flopscope.rules.costed",
    "Counter": "flopscope.core.counter",
    "FlopscopeError": "flopscope.errors",
    "FlopscopeWarning": "flopscope.errors",
    "ForwardError": "flopscope.errors",
    "Inputs": "flopscope.execution.inputs",
    "ModuleRule": "flopscope.rules.user",
    "ModuleStats": "flopscope.report.records",
    "OpCall": "flopscope.cost",
    "OpStats": "flopscope.report.records",
    "ParamStats": "flopscope.core.params",
    "Phase": "flopscope.cost",
    "Report": "flopscope.report.report",
    "RuleError": "flopscope.errors",
    "RuleSet": "flopscope.rules",
    "StrictModeError": "flopscope.errors",
    "SymbolicReport": "flopscope.report.symbolic",
    "UsageError": "flopscope.errors",
    "costed": "flopscope.rules.costed",
    "count": "flopscope.run",
    "count_symbolic": "flopscope.symbolic.count",
    "profile": "flopscope.timing.api",
    "profiling": "flopscope.timing.block",
    "plan": "flopscope.plan",
    "default_rules": "flopscope.rules",
}

__all__ = [
    "CallObserver",
    "Cost",
    "Costed",
    "Counter",
    "FlopscopeError",
    "FlopscopeWarning",
    "ForwardError",
    "Inputs",
    "ModuleRule",
    "ModuleStats",
    "OpCall",
    "OpStats",
    "ParamStats",
    "Phase",
    "Report",
    "RuleError",
    "RuleSet",
    "StrictModeError",
    "SymbolicReport",
    "UsageError",
    "costed",
    "count",
    "count_symbolic",
    "default_rules",
    "plan",
    "profile",
    "profiling",
]


# the feature packages, reachable as attributes (``flopscope.estimate.roofline(...)``) and loaded
# on first use like the names above
_SUBPACKAGES = frozenset({"compat", "distributed", "estimate", "llm", "measure", "render",
                          "report", "rules", "sources", "symbolic", "timing"})


def __getattr__(name: str) -> _Any:
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"flopscope.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flopscope' has no attribute {name!r}")
    # only the module that defines ``name``: ``flopscope.count`` does not load the planner, the
    # timing or the estimate packages (their import time and memory are a count's otherwise)
    found = _importlib.import_module(module)
    # a package exported under its own name (``plan``) is itself callable: the package, so that
    # ``flopscope.plan(...)`` and ``flopscope.plan.planner`` both work in any order
    value = found if module == f"flopscope.{name}" else getattr(found, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBPACKAGES})


if _TYPE_CHECKING:  # the same names, for type checkers
    from flopscope.core.counter import Counter
    from flopscope.core.observers import CallObserver
    from flopscope.core.params import ParamStats
    from flopscope.cost import Cost, OpCall, Phase
    from flopscope.errors import (
        FlopscopeError,
        FlopscopeWarning,
        ForwardError,
        RuleError,
        StrictModeError,
        UsageError,
    )
    from flopscope.execution.inputs import Inputs
    from flopscope.plan import plan
    from flopscope.report.records import ModuleStats, OpStats
    from flopscope.report.report import Report
    from flopscope.report.symbolic import SymbolicReport
    from flopscope.rules import RuleSet, default_rules
    from flopscope.rules.costed import Costed, costed
    from flopscope.rules.user import ModuleRule
    from flopscope.run import count
    from flopscope.symbolic.count import count_symbolic
    from flopscope.timing.api import profile
    from flopscope.timing.block import profiling
