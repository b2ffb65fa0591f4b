"""A drop-in replacement for thop's ``profile()`` and ``clever_format()`` with flopscope's semantics.

Change ``from thop import profile, clever_format`` to
``from flopscope.compat.thop import profile, clever_format``. thop-style rules
``fn(module, inputs, output)`` that add to ``module.total_ops`` keep working, but:

- every operator is counted (functional matmuls, attention, fused kernels), not only known layers;
- a rule costs its module as a whole, once per call: it is never added on top of its children, and
  the outermost rule wins;
- the model is left exactly as it was (no ``total_ops``/``total_params`` buffers, no hooks).

Every place where the numbers differ from thop's is listed in docs/thop.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from flopscope.cost import Cost
from flopscope.errors import RuleError, UsageError
from flopscope.execution.inputs import Inputs
from flopscope.report.report import Report
from flopscope.rules.user import ModuleRule
from flopscope.run import count

__all__ = ["clever_format", "profile"]

LayerInfo = dict[str, tuple[int, int, "LayerInfo"]]


class _ThopModuleView:
    """What a thop-style rule receives as ``module``: reads go to the real module, writes
    (``total_ops``, ``total_params``, anything else) stay on this stand-in, so nothing is ever set
    on the user's module. ``isinstance`` checks see the real module's class."""

    def __init__(self, module: nn.Module) -> None:
        object.__setattr__(self, "_module", module)
        self.total_ops: Any = torch.zeros(1, dtype=torch.float64)
        self.total_params: Any = torch.zeros(1, dtype=torch.float64)

    def __getattr__(self, name: str) -> Any:  # only called for names not set on the stand-in
        return getattr(object.__getattribute__(self, "_module"), name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(m, nn.Conv2d) inside a rule
        return type(object.__getattribute__(self, "_module"))

    def __repr__(self) -> str:
        return f"thop view of {object.__getattribute__(self, '_module')!r}"


def _as_number(value: Any, rule: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise RuleError(
                f"thop-style rule {rule} left total_ops as a tensor of shape {tuple(value.shape)}; "
                "it must hold one number (add a scalar or a one-element tensor)"
            )
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuleError(
            f"thop-style rule {rule} left total_ops = {value!r} ({type(value).__name__}); add a "
            "number or a one-element tensor to module.total_ops"
        )
    if not math.isfinite(value):
        raise RuleError(f"thop-style rule {rule} left total_ops = {value}; it must be finite")
    return float(value)


def thop_rule(fn: Callable[..., Any]) -> ModuleRule:
    """Turn a thop-style rule into a flopscope module rule.

    The rule is called as ``fn(view, inputs, output)`` where ``view`` stands in for the module:
    attribute reads go to the module, ``view.total_ops`` starts at a float64 zero tensor (as in
    thop), and what the rule adds to it becomes the module's MACs (rounded to an integer).
    ``total_params`` writes are ignored: flopscope counts parameters itself. A rule that *returns*
    a :class:`~flopscope.Cost` or an int (flopscope style) is used as such.

    Args:
        fn: ``fn(module, inputs, output)``, thop style.

    Returns:
        A module rule for ``rules=``; it keeps ``fn``'s name so errors and reports name ``fn``.
    """

    @functools.wraps(fn)
    def rule(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> Cost | int:
        view = _ThopModuleView(module)
        name = getattr(fn, "__qualname__", repr(fn))
        returned = fn(view, inputs, output)
        added = _as_number(view.total_ops, name)
        if returned is not None:
            if added:
                raise RuleError(
                    f"thop-style rule {name} both added {added:g} to total_ops and returned "
                    f"{returned!r}; do one of the two"
                )
            return returned  # type: ignore[no-any-return]
        return round(added)

    return rule


def _rules(model: nn.Module, custom_ops: Mapping[Any, Any] | None) -> dict[Any, Any]:
    if custom_ops is None:
        return {}
    if not isinstance(custom_ops, Mapping):
        raise UsageError(
            f"custom_ops must be a dict {{module class: fn}}, not {type(custom_ops).__name__}"
        )
    rules: dict[Any, Any] = {}
    for key, fn in custom_ops.items():
        if fn is None:  # thop: no hook for this type
            continue
        if not callable(fn):
            raise RuleError(f"custom_ops[{key!r}] is not callable: {fn!r}")
        if isinstance(key, type) and issubclass(key, nn.Module):
            # thop matches the exact type, not subclasses: rule each such module by instance
            for m in model.modules():
                if type(m) is key:
                    rules[m] = thop_rule(fn)
        elif isinstance(key, (nn.Module, str)) and not (isinstance(key, str) and "::" in key):
            rules[key] = thop_rule(fn)
        else:  # an operator: a flopscope op rule, passed through
            rules[key] = fn
    return rules


def _layer_info(report: Report, model: nn.Module, ruled: set[str]) -> LayerInfo:
    stats = report.by_module()

    def walk(module: nn.Module, prefix: str) -> LayerInfo:
        out: LayerInfo = {}
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            s = stats.get(path)
            macs = s.inclusive.macs if s is not None else 0
            params = s.params.inclusive if s is not None else 0
            out[name] = (macs, params, {} if path in ruled else walk(child, path))
        return out

    return walk(model, "")


def profile(
    model: nn.Module,
    inputs: tuple[Any, ...] | list[Any],
    custom_ops: Mapping[Any, Any] | None = None,
    verbose: bool = True,
    ret_layer_info: bool = False,
    report_missing: bool = False,
) -> tuple[int, int] | tuple[int, int, LayerInfo]:
    """Count one forward call like ``thop.profile``, with flopscope's semantics.

    As in thop, the model runs once in eval mode under ``torch.no_grad()`` and its training flag is
    restored. Unlike thop, nothing is added to the model.

    Args:
        model: the model.
        inputs: the model's positional arguments, a tuple (``inputs=(x,)``).
        custom_ops: ``{module class: fn}`` with thop-style ``fn(module, inputs, output)`` adding
            MACs to ``module.total_ops`` (see :func:`thop_rule`). As in thop a class matches modules
            of exactly that type. flopscope keys also work: a module instance or path (thop-style
            rule), or an operator name such as ``"mylib::fused_attn"`` (a flopscope op rule).
        verbose: print which custom rules were used and the operators that had no rule.
        ret_layer_info: also return the per-layer dict (see Returns).
        report_missing: print the operators that had no rule and the possibly opaque modules
            (implies ``verbose``, as in thop).

    Returns:
        ``(macs, params)`` as integers; with ``ret_layer_info``, ``(macs, params, layers)`` where
        ``layers[name] = (macs, params, children)`` for each child module, recursively (thop's
        shape; a module costed by a custom rule has ``{}`` for children, like thop's hooked ones).

    Raises:
        UsageError: ``inputs`` is not a tuple or list, or ``custom_ops`` is not a mapping.
        RuleError: a custom rule raised or left something that is not a number.
        ForwardError: the model's forward raised.
    """
    if report_missing:
        verbose = True
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(
            f"profile(model, inputs): inputs must be a tuple of the model's arguments, e.g. "
            f"inputs=(x,), not {type(inputs).__name__}"
        )
    rules = _rules(model, custom_ops)
    if verbose and custom_ops:
        for key, fn in custom_ops.items():
            if fn is not None:
                print(f"[INFO] Customize rule {getattr(fn, '__qualname__', fn)}() {key}.")
    with torch.no_grad():
        report = count(model, Inputs(*inputs), rules=rules or None, train=False)
    if verbose:
        for op, calls in report.uncounted.items():
            print(f"[WARN] No rule for operator {op} ({calls} calls): counted as 0 MACs.")
        for path in report.opaque:
            print(f"[WARN] Module '{path}' produced its output without arithmetic operators "
                  "(possibly an extension kernel): give it a rule in custom_ops.")
    macs, params = report.macs, report.params
    if ret_layer_info:
        return macs, params, _layer_info(report, model, {r.module for r in report.rules})
    return macs, params


def clever_format(nums: Any, format: str = "%.2f") -> str | tuple[str, ...]:
    """Format numbers with a K/M/G/T suffix, as thop's ``clever_format`` does.

    Args:
        nums: a number or an iterable of numbers.
        format: printf-style format of the scaled number (thop's default ``"%.2f"``).

    Returns:
        One string for one number, a tuple of strings for several. Numbers of 1000 or less get the
        suffix ``"B"`` (thop's choice); the thresholds are strict (``1e9`` gives ``"1000.00M"``).
    """
    items = list(nums) if isinstance(nums, Iterable) and not isinstance(nums, str) else [nums]
    out: list[str] = []
    for num in items:
        for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
            if num > scale:
                out.append(format % (num / scale) + suffix)
                break
        else:
            out.append(format % num + "B")
    return out[0] if len(out) == 1 else tuple(out)
