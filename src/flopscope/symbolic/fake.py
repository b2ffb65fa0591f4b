"""The fake mode of a symbolic count: outputs whose sizes a recorded guard pins are written with
the pinned numbers, and operators whose C++ kernels refuse symbolic size lists run by their
Python decompositions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map_only

from flopscope.execution.meta import ShapeOnlyFakeMode

__all__ = ["CONCRETE_SIZES_ONLY", "PinningFakeMode"]


CONCRETE_SIZES_ONLY = "expected to contain only concrete integers"
# operators whose C++ kernel refused symbolic sizes (PyTorch's "SymIntArrayRef expected to contain
# only concrete integers"): run by their Python decomposition when a size list is symbolic
_CONCRETE_ONLY: set[Any] = {torch.ops.aten.constant_pad_nd.default}


def _decompositions() -> Mapping[Any, Any]:
    from torch._decomp import decomposition_table

    return decomposition_table


def _has_symbolic_list(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether an argument is a list or tuple holding a ``SymInt`` (a padding, a size)."""
    return any(isinstance(a, (list, tuple)) and any(type(x) is torch.SymInt for x in a)
               for a in (*args, *kwargs.values()))


class PinningFakeMode(ShapeOnlyFakeMode):
    """The fake mode of a symbolic count: an operator's output sizes that a recorded guard pins
    to a number are written as that number (its strides likewise, where they become numbers).

    PyTorch's reshape splits a symbolic dimension ``n`` into ``(k, n // k)`` and then checks
    ``n // k == m`` (a guard) without writing ``m`` into the output's sizes. A model that
    reshapes windows back to sizes fixed when it was built (torchvision's ``maxvit_t``:
    ``WindowDepartition`` to the ``grid_size`` of its construction) then carries nested floor
    divisions that grow with every block, and torch's simplification of each new one with them:
    each block doubled the time, and ``maxvit_t`` gave no result in 14 minutes. Under the
    guards, which are the formulas' domain, those expressions *are* the numbers, so no cost
    changes inside the domain. In-place operators keep their tensor (its identity matters).

    An operator whose C++ kernel takes its sizes as concrete integers only (``constant_pad_nd``)
    runs by PyTorch's Python decomposition when a size it is given is symbolic (:meth:`_decomposed`).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pins: dict[sympy.Expr, sympy.Integer] = {}  # expression -> the number a guard says
        self._pinned_expr: dict[sympy.Expr, sympy.Expr] = {}  # memo of expression.xreplace(pins)
        self._guards_seen = 0

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _CONCRETE_ONLY and _has_symbolic_list(args, kwargs):
            out = self._decomposed(func, args, kwargs)
        else:
            try:
                out = super().dispatch(func, types, args, kwargs)
            except RuntimeError as e:
                if CONCRETE_SIZES_ONLY not in str(e) or func not in _decompositions():
                    raise
                _CONCRETE_ONLY.add(func)
                out = self._decomposed(func, args, kwargs)
        env = self.shape_env
        if env is not None and len(env.guards) != self._guards_seen:
            self._learn(env.guards)
        if not self._pins or getattr(getattr(func, "_schema", None), "is_mutable", True):
            return out
        return tree_map_only(FakeTensor, self._pinned, out)

    def _decomposed(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``func`` by PyTorch's Python decomposition of it, on this mode's fake tensors: for a
        C++ kernel that takes its sizes as concrete integers only (``constant_pad_nd``, with
        swin's padding to its window size). The decomposition's own operators run below the
        counter (the count sees ``func``); its branches on sizes become guards."""
        with self:
            return _decompositions()[func](*args, **kwargs)

    def _learn(self, guards: Sequence[Any]) -> None:
        """Read the guards recorded since the last call: ``Eq(k*e, c)`` pins ``e`` to ``c / k``
        (``e`` not a plain symbol: PyTorch replaces those itself)."""
        for g in guards[self._guards_seen:]:
            e = g.expr
            if not isinstance(e, sympy.Eq):
                continue
            lhs, rhs = (e.rhs, e.lhs) if e.lhs.is_Integer else (e.lhs, e.rhs)
            if not rhs.is_Integer or lhs.is_Integer:
                continue
            coeff, rest = lhs.as_coeff_Mul()
            if rest.is_Symbol or not coeff.is_Integer or coeff == 0 or rhs % coeff != 0:
                continue
            if rest not in self._pins:
                self._pins[rest] = sympy.Integer(rhs // coeff)
                self._pinned_expr.clear()
        self._guards_seen = len(guards)

    def _pin(self, n: Any) -> Any:
        if type(n) is not torch.SymInt:
            return n
        e = n.node.expr
        if e.is_Symbol or e.is_Integer:
            return n
        v = self._pinned_expr.get(e)
        if v is None:
            v = self._pinned_expr[e] = e.xreplace(self._pins)
        return int(v) if v.is_Integer else n

    def _pinned(self, t: FakeTensor) -> FakeTensor:
        sizes = t.shape
        new = [self._pin(n) for n in sizes]
        if all(a is b for a, b in zip(new, sizes, strict=True)):
            return t
        strides = [self._pin(n) for n in t.stride()]
        return torch.ops.aten.as_strided.default(t, new, strides, t.storage_offset())  # type: ignore[no-any-return]
