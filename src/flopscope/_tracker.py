"""Module tracking: which module is running, under which path, and, in backward, which module's
forward built the autograd node that is running.

Forward: PyTorch's *global* module forward hooks (registered while a Counter is active, removed on
exit; nothing is stored on the user's model) keep a stack of :class:`Frame` s. Each hook also
records the autograd sequence number at that moment, so the timeline of sequence numbers maps any
autograd node created in a forward back to the module that was running then (``backward_path``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils._pytree import tree_iter

from flopscope.costed import Costed
from flopscope.params import ParamStats, param_table
from flopscope.rules.user import ModuleRule, ModuleRules

__all__ = ["Frame", "ModuleTracker", "Sums"]

_sequence_nr = torch._C._autograd._get_sequence_nr
_ACCUMULATE_GRAD_SEQ = 2**64 - 1  # sequence number of AccumulateGrad nodes


class Sums:
    """Running totals of calls and cost (mutable; the hot path adds to it in place)."""

    __slots__ = ("bytes_read", "bytes_written", "calls", "flops", "macs")

    def __init__(self) -> None:
        self.calls = 0
        self.macs = 0
        self.flops = 0
        self.bytes_read = 0
        self.bytes_written = 0


@dataclass(slots=True)
class Frame:
    """One running module call.

    Attributes:
        module: the module.
        path: its path in the model.
        rule: the module rule costing this call as a whole, if any.
        args: the positional arguments (given to the module rule).
        arithmetic: operator calls with arithmetic seen inside (itself and below).
        allocations: allocation-only operator calls seen inside (to flag opaque modules).
        shadow: a ruled module's operator-level cost, kept for comparison.
    """

    module: nn.Module
    path: str
    rule: ModuleRule | None = None
    args: tuple[Any, ...] = ()
    arithmetic: int = 0
    allocations: int = 0
    shadow: Sums | None = None


class ModuleTracker:
    """Module paths, types, calls and parameters, the stack of running modules, and the
    forward-timeline of autograd sequence numbers used to attribute backward operators.

    Args:
        model: the model whose paths are used (``None``: modules are named after their class).
        module_rules: rules that cost a module as a whole.
        on_rule_exit: called with the frame and the module's output when a ruled module returns.
    """

    def __init__(
        self,
        model: nn.Module | None,
        module_rules: ModuleRules,
        on_rule_exit: Callable[[Frame, Any], None],
    ) -> None:
        self.module_rules = module_rules
        self.on_rule_exit = on_rule_exit
        self.paths: dict[nn.Module, str] = {}
        self.types: dict[str, str] = {}
        self.calls: dict[str, int] = {}
        self.params: dict[str, ParamStats] = {}
        self.param_paths: dict[int, str] = {}
        self.modules: list[nn.Module] = []  # the model's modules, in named_modules() order
        self.stack: list[Frame] = []
        self.shadowing: Frame | None = None  # the outermost running ruled module
        self.opaque: dict[str, None] = {}
        self._seqs: list[int] = []
        self._seq_paths: list[str] = []
        self._handles: list[Any] = []
        if model is not None:
            self.modules = [m for _, m in self._adopt(model, "")]
            module_rules.check_paths(self.paths.values(), type(model).__name__)

    # -- paths --------------------------------------------------------------------------------
    def _adopt(self, module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
        """Learn the paths, types and parameters of ``module``'s subtree, named under ``prefix``;
        returns ``module.named_modules()`` (unprefixed)."""
        named = list(module.named_modules())
        stats, owners = param_table(module, named)
        if prefix:
            def full(name: str) -> str:
                return f"{prefix}.{name}" if name else prefix
        else:
            def full(name: str) -> str:
                return name
        for name, sub in named:
            if sub not in self.paths:
                path = full(name)
                self.paths[sub] = path
                self.types.setdefault(path, type(sub).__name__)
                self.calls.setdefault(path, 0)
        for name, st in stats.items():
            self.params.setdefault(full(name), st)
        for pid, name in owners.items():
            self.param_paths.setdefault(pid, full(name))
        return named

    def path_of(self, module: nn.Module) -> str:
        """The path of ``module``; a module outside the model is named after its class, below the
        module running now (``Parent.Linear``, then ``Parent.Linear#2`` for a second one)."""
        path = self.paths.get(module)
        if path is not None:
            return path
        parent = self.stack[-1].path if self.stack else ""
        base = module.name if isinstance(module, Costed) else type(module).__name__
        path = f"{parent}.{base}" if parent else base
        n = 1
        while path in self.types:
            n += 1
            path = f"{parent}.{base}#{n}" if parent else f"{base}#{n}"
        self._adopt(module, path)
        return path

    @property
    def innermost(self) -> str | None:
        """The path of the innermost running module, ``None`` when none is running."""
        return self.stack[-1].path if self.stack else None

    # -- backward attribution -----------------------------------------------------------------
    def backward_path(self, node: Any) -> str:
        """The module whose forward created autograd ``node`` (a parameter's owner for an
        AccumulateGrad node; the root ``""`` when no module was running)."""
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_GRAD_SEQ:
            var = getattr(node, "variable", None)
            return self.param_paths.get(id(var), "") if var is not None else ""
        i = bisect_right(self._seqs, seq) - 1
        return self._seq_paths[i] if i >= 0 else ""

    # -- hooks --------------------------------------------------------------------------------
    def _pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        path = self.path_of(module)
        self.calls[path] = self.calls.get(path, 0) + 1
        frame = Frame(module, path)
        if self.shadowing is None:
            fn = self.module_rules.find(module, path)
            if fn is not None:
                frame.rule = fn
                frame.args = args
                frame.shadow = Sums()
                self.shadowing = frame
        self.stack.append(frame)
        self._seqs.append(_sequence_nr())
        self._seq_paths.append(path)

    def _post_hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.stack or self.stack[-1].module is not module:
            return  # a module entered before the Counter: nothing of ours to close
        frame = self.stack.pop()
        parent = self.stack[-1] if self.stack else None
        flagged = False
        if frame.rule is not None:
            self.shadowing = None
            self.on_rule_exit(frame, output)
        elif (
            self.shadowing is None  # inside a ruled module the rule covers everything
            and frame.arithmetic == 0
            and frame.allocations > 0
            and any(isinstance(t, torch.Tensor) for t in tree_iter(output))
        ):
            self.opaque[frame.path] = None
            flagged = True
        if parent is not None:
            parent.arithmetic += frame.arithmetic
            if frame.rule is not None:
                parent.arithmetic += 1  # the rule accounts for the module's work
            elif not flagged:  # flag the innermost module, not every ancestor of it
                parent.allocations += frame.allocations
        self._seqs.append(_sequence_nr())
        self._seq_paths.append(parent.path if parent is not None else "")

    def install(self) -> None:
        """Register the global module hooks."""
        self._handles = [
            register_module_forward_pre_hook(self._pre_hook),
            register_module_forward_hook(self._post_hook),
        ]

    def remove(self) -> str | None:
        """Remove the hooks and forget running modules; returns the innermost module that was
        still running (where an exception left the forward), or ``None``."""
        for h in self._handles:
            h.remove()
        self._handles = []
        left_in = self.innermost
        self.stack.clear()
        self.shadowing = None
        return left_in
