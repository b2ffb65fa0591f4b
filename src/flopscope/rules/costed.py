"""Give a function whose work flopscope cannot see (a raw C++/CUDA kernel called through pybind11)
a cost of its own, without touching the function or the model.

    >>> raw_mm = flopscope.costed(ext.raw_matmul, lambda m, inputs, out: out.numel() * inputs[0].shape[1])
    >>> y = raw_mm(a, b)          # same result as ext.raw_matmul(a, b); costed when counted
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

from torch import nn

from flopscope.cost import Cost

__all__ = ["Costed", "costed"]

_ModuleRule = Callable[[nn.Module, tuple[Any, ...], Any], Union[Cost, int]]


class Costed(nn.Module):
    """A function wrapped in a module that carries its own module rule (see :func:`costed`).

    Calling it calls the function. Under a :class:`~flopscope.Counter` it is costed by its rule
    like any module with a module rule: the operators it runs are shadowed, and a rule given in
    ``rules=`` for the same module (by instance or path) or an enclosing module takes precedence.

    Attributes:
        fn: the wrapped function.
        rule: ``rule(module, args, output) -> Cost | int`` (MACs); ``args`` are the positional
            arguments of the call (keyword arguments are passed to ``fn`` but not to the rule).
        name: the name the report uses for it (its module path is ``<caller path>.<name>``).
    """

    def __init__(self, fn: Callable[..., Any], rule: _ModuleRule, name: str | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.rule = rule
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def costed(fn: Callable[..., Any], rule: _ModuleRule, *, name: str | None = None) -> Costed:
    """Wrap ``fn`` so that flopscope costs each call with ``rule``.

    Use it for work that bypasses PyTorch's dispatcher (a pybind11 extension function that loops
    over ``data_ptr()``), which no operator rule can see. Outside a Counter the wrapper just calls
    ``fn``.

    Args:
        fn: the function to wrap; it is not modified.
        rule: ``rule(module, args, output) -> Cost | int`` (an int is a number of MACs); called
            once per call of the wrapper, with the wrapper as ``module``.
        name: name used in module paths (default: ``fn.__name__``).

    Returns:
        A :class:`Costed` module; call it like ``fn``.

    Raises:
        RuleError: ``fn`` or ``rule`` is not callable.
    """
    from flopscope.errors import RuleError

    if not callable(fn):
        raise RuleError(f"costed(fn, rule): fn must be callable, got {fn!r}")
    if not callable(rule):
        raise RuleError(
            f"costed(fn, rule): rule must be callable as rule(module, args, output), got {rule!r}"
        )
    return Costed(fn, rule, name)
