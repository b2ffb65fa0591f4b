"""flopscope: parameters, MACs, FLOPs and bytes of PyTorch models, per module and per operator.

    >>> report = flopscope.count(model, x)
    >>> report.macs, report.flops, report.params
"""

from flopscope import render as _render  # noqa: F401  (registers how a Report shows itself)
from flopscope.cost import Cost, OpCall, Phase
from flopscope.costed import Costed, costed
from flopscope.counter import Counter
from flopscope.errors import (
    FlopscopeError,
    FlopscopeWarning,
    ForwardError,
    RuleError,
    StrictModeError,
    UsageError,
)
from flopscope.params import ParamStats
from flopscope.report import ModuleStats, OpStats, Report
from flopscope.rules import RuleSet, default_rules
from flopscope.rules.user import ModuleRule
from flopscope.run import Inputs, count

__version__ = "0.1.0"  # the one place the version is written (pyproject reads it)

__all__ = [
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
    "UsageError",
    "costed",
    "count",
    "default_rules",
]
