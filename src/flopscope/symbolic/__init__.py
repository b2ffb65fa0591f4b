"""Symbolic costs: MACs, FLOPs and bytes as exact sympy formulas of named input sizes
(``count``: :func:`count_symbolic` on PyTorch's ``ShapeEnv`` and fake tensors); what it returns
is :class:`~flopscope.report.symbolic.SymbolicReport`. This ``__init__`` is the public face.
"""

from flopscope.errors import DomainError
from flopscope.render.formulas import pretty
from flopscope.report.symbolic import SymbolicReport
from flopscope.report.symbolic_records import SymCost
from flopscope.symbolic.count import count_symbolic, plot_symbolic

__all__ = ["DomainError", "SymCost", "SymbolicReport", "count_symbolic", "plot_symbolic", "pretty"]
