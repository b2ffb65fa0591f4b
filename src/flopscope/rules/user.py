"""The user's ``rules=`` argument: operator rules on top of the defaults, and module rules.

A module rule costs a module as a whole, per call (see docs/rules.md): it is looked up by module
instance, then by module path, then by class along the MRO; a :class:`~flopscope.Costed` wrapper
carries its own rule.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

import torch
from torch import nn

from flopscope.cost import Cost
from flopscope.errors import RuleError
from flopscope.rules import default_rules
from flopscope.rules.costed import Costed
from flopscope.rules.registry import Rule, RuleSet, op_key

__all__ = ["ModuleRule", "ModuleRules", "RulesArg", "as_cost", "rule_name", "split_rules"]

ModuleRule = Callable[[nn.Module, tuple[Any, ...], Any], Cost | int]
RulesArg = Union[RuleSet, Mapping[Any, Any], None]


def rule_name(fn: Callable[..., Any]) -> str:
    """A rule's name for messages and reports (its qualified name where it has one)."""
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class ModuleRules:
    """Module rules by instance, by path and by class (the lookup order)."""

    __slots__ = ("by_class", "by_instance", "by_path")

    def __init__(self) -> None:
        self.by_class: dict[type, ModuleRule] = {}
        self.by_instance: dict[nn.Module, ModuleRule] = {}
        self.by_path: dict[str, ModuleRule] = {}

    def __bool__(self) -> bool:
        return bool(self.by_class or self.by_instance or self.by_path)

    def find(self, module: nn.Module, path: str) -> ModuleRule | None:
        """The rule that costs ``module`` (running at ``path``) as a whole, or ``None``."""
        if not (self.by_instance or self.by_path or self.by_class or isinstance(module, Costed)):
            return None
        fn = self.by_instance.get(module) or self.by_path.get(path)
        if fn is None:
            for cls in type(module).__mro__:
                fn = self.by_class.get(cls)
                if fn is not None:
                    break
        if fn is None and isinstance(module, Costed):
            fn = module.rule
        return fn

    def check_paths(self, known: Iterable[str], model_name: str) -> None:
        """Raise when a rule names a module path that the model does not have.

        Raises:
            RuleError: with the closest existing paths.
        """
        if not self.by_path:
            return
        paths = set(known)
        for path in self.by_path:
            if path not in paths:
                close = difflib.get_close_matches(path, [p for p in paths if p], n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise RuleError(
                    f"module rule for path {path!r}: {model_name} has no module at that "
                    f"path{hint} Paths are relative to the model, as in model.named_modules() "
                    "(the root is '')."
                )


def split_rules(rules: RulesArg) -> tuple[RuleSet, ModuleRules]:
    """Sort a user ``rules=`` argument into operator rules and module rules.

    Keys: an operator (``torch.ops.aten.mm``, ``"aten::mm"``, ``"mylib::fused_attn"``) makes an op
    rule on top of the defaults; an ``nn.Module`` subclass, an ``nn.Module`` instance or a module
    path (a string without ``"::"``) makes a module rule.

    Raises:
        RuleError: a key is of no known kind, names an operator that does not exist
            (:func:`~flopscope.rules.registry.check_operator`), or a rule is not callable.
    """
    base = default_rules()
    modules = ModuleRules()
    if rules is None:
        return base, modules
    if isinstance(rules, RuleSet):
        return rules, modules
    if not isinstance(rules, Mapping):
        raise RuleError(
            f"rules must be a mapping (operator, module class, module instance or module path -> "
            f"rule) or a RuleSet, not {type(rules).__name__}"
        )
    ops: dict[Any, Rule] = {}
    entries: Mapping[Any, Any] = rules
    for key, fn in entries.items():
        if not callable(fn):
            raise RuleError(f"the rule for {key!r} is not callable: {fn!r}")
        if isinstance(key, type) and issubclass(key, nn.Module):
            modules.by_class[key] = fn
        elif isinstance(key, nn.Module):
            modules.by_instance[key] = fn
        elif isinstance(key, str) and "::" not in key:
            modules.by_path[key] = fn
        else:
            ops[op_key(key)] = fn  # an operator that does not exist: RuleSet refuses it
    return (base.with_rules(ops) if ops else base), modules


def as_cost(result: Any, what: str) -> Cost:
    """A rule's return value as a :class:`Cost` (an integer is a number of MACs).

    Only non-negative integers are costs: a ``bool``, a ``float`` (even a whole one such as
    ``2.0``, and NaN), a string or a negative number is refused, so a rule's mistake surfaces
    where it is made instead of as a wrong or unprintable total.

    Args:
        result: what the rule returned.
        what: the rule and where it ran, for the message.

    Returns:
        The cost.

    Raises:
        RuleError: the value is not a Cost and not a non-negative integer (the message names
            ``what`` and the value).
    """
    if isinstance(result, Cost):
        return result
    value: int | None = None
    if isinstance(result, numbers.Integral) and not isinstance(result, bool):
        value = int(result)
    elif (isinstance(result, torch.Tensor) and result.numel() == 1
          and not result.is_floating_point() and not result.is_complex()
          and result.dtype != torch.bool):
        value = int(result.item())
    if value is None:
        raise RuleError(
            f"{what} returned {result!r} ({type(result).__name__}); a rule returns a flopscope.Cost, "
            "or an integer number of MACs"
        )
    if value < 0:
        raise RuleError(f"{what} returned a negative cost: {value}")
    return Cost.from_macs(value)
