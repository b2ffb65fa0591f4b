"""Counting: a dispatch mode that sees every operator call, a module tracker that knows which module
made it (and, in backward, which module's forward built the autograd node that is running), and
module rules that cost a module as a whole.

Nothing is patched and nothing is stored on the user's model: the module hooks are PyTorch's global
forward hooks, registered on entry and removed on exit.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import warnings
from bisect import bisect_right
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter, tree_map_only

from flopscope._meta import needs_fake_cpu, sdpa_as_cpu
from flopscope.cost import Cost, OpCall, Phase
from flopscope.costed import Costed
from flopscope.errors import (
    FlopscopeError,
    FlopscopeWarning,
    ForwardError,
    RuleError,
    StrictModeError,
    UsageError,
)
from flopscope.params import ParamStats, param_table
from flopscope.report import OpRecord, Report, RuleRecord
from flopscope.rules import RuleSet, default_rules
from flopscope.rules.registry import Rule, op_key

__all__ = ["Counter", "Inputs", "ModuleRule", "count"]

ModuleRule = Callable[[nn.Module, tuple[Any, ...], Any], Cost | int]
RulesArg = Union[RuleSet, Mapping[Any, Any], None]

_FORWARD = Phase.FORWARD
_BACKWARD = Phase.BACKWARD
_current_autograd_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr
_ACCUMULATE_GRAD_SEQ = 2**64 - 1  # sequence number of AccumulateGrad nodes
# id(operator overload) -> (report name, is a view, is an allocation, is ignored, the overload):
# facts that do not depend on the rules, shared by every Counter (the overload is kept alive, so
# its id is not reused)
_FACTS: dict[int, tuple[str, bool, bool, bool, Any]] = {}
_ALLOCATIONS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::zeros", "aten::zeros_like", "aten::new_zeros",
})


@dataclass(slots=True)
class _Frame:
    module: nn.Module
    path: str
    rule: ModuleRule | None = None
    args: tuple[Any, ...] = ()
    arithmetic: int = 0
    allocations: int = 0
    shadow: list[int] | None = None  # a ruled module's inner costs: macs, flops, read, written


def _rule_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def split_rules(
    rules: RulesArg,
) -> tuple[RuleSet, dict[type, ModuleRule], dict[nn.Module, ModuleRule], dict[str, ModuleRule]]:
    """Sort a user ``rules=`` argument into operator rules and module rules.

    Keys: an operator (``torch.ops.aten.mm``, ``"aten::mm"``, ``"mylib::fused_attn"``) makes an op
    rule on top of the defaults; an ``nn.Module`` subclass, an ``nn.Module`` instance or a module
    path (a string without ``"::"``) makes a module rule.

    Raises:
        RuleError: a key is of no known kind or a rule is not callable.
    """
    base = default_rules()
    if rules is None:
        return base, {}, {}, {}
    if isinstance(rules, RuleSet):
        return rules, {}, {}, {}
    if not isinstance(rules, Mapping):
        raise RuleError(
            f"rules must be a mapping (operator, module class, module instance or module path -> "
            f"rule) or a RuleSet, not {type(rules).__name__}"
        )
    ops: dict[Any, Rule] = {}
    by_class: dict[type, ModuleRule] = {}
    by_instance: dict[nn.Module, ModuleRule] = {}
    by_path: dict[str, ModuleRule] = {}
    entries: Mapping[Any, Any] = rules
    for key, fn in entries.items():
        if not callable(fn):
            raise RuleError(f"the rule for {key!r} is not callable: {fn!r}")
        if isinstance(key, type) and issubclass(key, nn.Module):
            by_class[key] = fn
        elif isinstance(key, nn.Module):
            by_instance[key] = fn
        elif isinstance(key, str) and "::" not in key:
            by_path[key] = fn
        else:
            ops[op_key(key)] = fn
    return base.with_rules(ops) if ops else base, by_class, by_instance, by_path


class _Mode(TorchDispatchMode):
    def __init__(self, counter: Counter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.record = counter._record

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.record(func, args, kwargs, out)
        return out


class Counter:
    """Count every operator that runs inside a ``with`` block.

    Example::

        with flopscope.Counter(model) as counter:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        print(counter.report)

    Operators are attributed to the innermost module running (paths relative to ``model``; the
    root is ``""``, and work outside the model, such as a functional loss or an optimizer step, is
    the root's own cost). Operators run by ``backward()`` are attributed to the module whose
    forward built them, in the backward phase. Entering the same Counter again adds to its counts.

    Args:
        model: the model whose module paths and parameters the report uses. Modules that are not
            part of it get paths named after their class. ``None`` counts without a model.
        rules: extra rules (see :func:`split_rules`): operator rules on top of the defaults, and
            module rules that cost a module as a whole.
        strict: raise :class:`~flopscope.errors.StrictModeError` at the first operator with no rule.
        warn: emit one :class:`FlopscopeWarning` on exit when operators went uncounted or modules
            look opaque.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        rules: RulesArg = None,
        strict: bool = False,
        warn: bool = True,
    ) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise UsageError(
                f"Counter(model=...) takes an nn.Module, not {type(model).__name__}; pass the model "
                "whose modules should be named in the report, or nothing"
            )
        self.model = model
        self.strict = strict
        self.warn = warn
        self._rules, self._by_class, self._by_instance, self._by_path = split_rules(rules)
        self._paths: dict[nn.Module, str] = {}
        self._types: dict[str, str] = {}
        self._calls: dict[str, int] = {}
        self._params: dict[str, ParamStats] = {}
        self._param_paths: dict[int, str] = {}
        self._named: list[tuple[str, nn.Module]] = []
        if model is not None:
            self._named = self._adopt(model, "")
            self._check_rule_paths(model)
        self._in_rule = False
        # (module path, id of the operator overload or a module-rule name, backward?) -> calls and
        # cost sums
        self._acc: dict[tuple[str, int | str, bool], list[int]] = {}
        self._rule_acc: dict[str, tuple[str, bool, list[int]]] = {}
        self._opaque: dict[str, None] = {}
        self._stack: list[_Frame] = []
        self._shadowing: _Frame | None = None
        self._seqs: list[int] = []
        self._seq_paths: list[str] = []
        # id(operator overload) -> _op_info (ids: an OpOverload's __hash__ is Python code)
        self._ops: dict[int, tuple[Rule | None, str, bool, bool, bool, Any]] = {}
        self._mode: _Mode | None = None
        self._handles: list[Any] = []

    # -- module bookkeeping -------------------------------------------------------------------
    def _adopt(self, module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
        """Learn the paths, types and parameters of ``module``'s subtree, named under ``prefix``;
        returns ``module.named_modules()`` (unprefixed) for callers that need it too."""
        named = list(module.named_modules())
        stats, owners = param_table(module, named)
        if prefix:
            def full(name: str) -> str:
                return f"{prefix}.{name}" if name else prefix
        else:
            def full(name: str) -> str:
                return name
        for name, sub in named:
            if sub not in self._paths:
                path = full(name)
                self._paths[sub] = path
                self._types.setdefault(path, type(sub).__name__)
                self._calls.setdefault(path, 0)
        for name, st in stats.items():
            self._params.setdefault(full(name), st)
        for pid, name in owners.items():
            self._param_paths.setdefault(pid, full(name))
        return named

    def _check_rule_paths(self, model: nn.Module) -> None:
        if not self._by_path:
            return
        known = set(self._paths.values())
        for path in self._by_path:
            if path not in known:
                close = difflib.get_close_matches(path, [p for p in known if p], n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise RuleError(
                    f"module rule for path {path!r}: {type(model).__name__} has no module at that "
                    f"path{hint} Paths are relative to the model, as in model.named_modules() "
                    "(the root is '')."
                )

    def _path_of(self, module: nn.Module) -> str:
        path = self._paths.get(module)
        if path is not None:
            return path
        parent = self._stack[-1].path if self._stack else ""
        base = module.name if isinstance(module, Costed) else type(module).__name__
        path = f"{parent}.{base}" if parent else base
        n = 1
        while path in self._types:
            n += 1
            path = f"{parent}.{base}#{n}" if parent else f"{base}#{n}"
        self._adopt(module, path)
        return path

    def _module_rule(self, module: nn.Module, path: str) -> ModuleRule | None:
        if not (self._by_instance or self._by_path or self._by_class or isinstance(module, Costed)):
            return None
        fn = self._by_instance.get(module) or self._by_path.get(path)
        if fn is None:
            for cls in type(module).__mro__:
                fn = self._by_class.get(cls)
                if fn is not None:
                    break
        if fn is None and isinstance(module, Costed):
            fn = module.rule
        return fn

    # -- hooks --------------------------------------------------------------------------------
    def _pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        path = self._path_of(module)
        self._calls[path] = self._calls.get(path, 0) + 1
        frame = _Frame(module, path)
        if self._shadowing is None:
            fn = self._module_rule(module, path)
            if fn is not None:
                frame.rule = fn
                frame.args = args
                frame.shadow = [0, 0, 0, 0]
                self._shadowing = frame
        self._stack.append(frame)
        self._seqs.append(_sequence_nr())
        self._seq_paths.append(path)

    def _post_hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self._stack or self._stack[-1].module is not module:
            return  # a module entered before the Counter: nothing of ours to close
        frame = self._stack.pop()
        parent = self._stack[-1] if self._stack else None
        flagged = False
        if frame.rule is not None:
            self._shadowing = None
            self._apply_module_rule(frame, output)
        elif (
            self._shadowing is None  # inside a ruled module the rule covers everything
            and frame.arithmetic == 0
            and frame.allocations > 0
            and any(isinstance(t, torch.Tensor) for t in tree_iter(output))
        ):
            self._opaque[frame.path] = None
            flagged = True
        if parent is not None:
            parent.arithmetic += frame.arithmetic
            if frame.rule is not None:
                parent.arithmetic += 1  # the rule accounts for the module's work
            elif not flagged:  # flag the innermost module, not every ancestor of it
                parent.allocations += frame.allocations
        self._seqs.append(_sequence_nr())
        self._seq_paths.append(parent.path if parent is not None else "")

    def _apply_module_rule(self, frame: _Frame, output: Any) -> None:
        fn = frame.rule
        assert fn is not None
        where = f"module '{frame.path}' ({type(frame.module).__name__})"
        rule_name = _rule_name(fn)
        self._in_rule = True  # tensor arithmetic inside the rule is the rule's, not the model's
        try:
            try:
                result = fn(frame.module, frame.args, output)
            except FlopscopeError:
                raise
            except Exception as e:
                raise RuleError(
                    f"module rule {rule_name} raised for {where}: {type(e).__name__}: {e}; fix "
                    "the rule (it is called as rule(module, inputs, output), inputs being the "
                    "positional arguments)"
                ) from e
            cost = _as_cost(result, f"module rule {rule_name} for {where}")
        finally:
            self._in_rule = False
        if min(cost.macs, cost.flops, cost.bytes_read, cost.bytes_written) < 0:
            raise RuleError(f"module rule {rule_name} for {where} returned a negative cost: {cost}")
        name = f"module_rule:{type(frame.module).__name__}"
        calls_cost = self._rule_acc.get(frame.path)
        if calls_cost is None:
            calls_cost = (rule_name, not isinstance(result, Cost), [0] * 9)
            self._rule_acc[frame.path] = calls_cost
        acc = calls_cost[2]
        acc[0] += 1
        for i, v in enumerate((cost.macs, cost.flops, cost.bytes_read, cost.bytes_written)):
            acc[1 + i] += v
        for i, v in enumerate(frame.shadow or ()):
            acc[5 + i] += v
        self._add((frame.path, name, False), cost)

    # -- the per-operator hot path ------------------------------------------------------------
    def _add(self, key: tuple[str, int | str, bool], cost: Cost) -> None:
        """Add one call costing ``cost`` under ``key`` (module path, operator id or module-rule
        name, backward?)."""
        acc = self._acc.get(key)
        if acc is None:
            self._acc[key] = [1, cost.macs, cost.flops, cost.bytes_read, cost.bytes_written]
        else:
            acc[0] += 1
            acc[1] += cost.macs
            acc[2] += cost.flops
            acc[3] += cost.bytes_read
            acc[4] += cost.bytes_written

    def _backward_path(self, node: Any) -> str:
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_GRAD_SEQ:
            var = getattr(node, "variable", None)
            return self._param_paths.get(id(var), "") if var is not None else ""
        i = bisect_right(self._seqs, seq) - 1
        return self._seq_paths[i] if i >= 0 else ""

    def _op_info(self, func: Any) -> tuple[Rule | None, str, bool, bool, bool, Any]:
        """What the hot path needs to know about an operator, worked out once per operator:
        its rule, its report name, whether it is a view, whether it is an allocation, and whether
        to ignore it (``prim::`` metadata queries such as ``prim::device``, made by fake tensors)."""
        facts = _FACTS.get(id(func))
        if facts is None or facts[-1] is not func:
            is_view = any(r.alias_info is not None and not r.alias_info.is_write
                          for r in func._schema.returns)
            facts = (str(func), is_view, func._schema.name in _ALLOCATIONS,
                     func.namespace == "prim", func)
            _FACTS[id(func)] = facts
        info = (self._rules.find(func), *facts)
        self._ops[id(func)] = info
        return info

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if self._in_rule:
            return
        info = self._ops.get(id(func))
        fn, _, is_view, is_alloc, ignored, _ = info if info is not None else self._op_info(func)
        if ignored:
            return
        node = _current_autograd_node()
        if node is None:
            backward = False
            phase = _FORWARD
            frame = self._stack[-1] if self._stack else None
            path = frame.path if frame is not None else ""
            shadowing = self._shadowing
        else:
            backward = True
            phase = _BACKWARD
            frame = None
            path = self._backward_path(node)
            shadowing = None
        call = OpCall(func, args, kwargs, out, phase, is_view)
        if fn is None:
            counted = False
            if self.strict and shadowing is None:
                raise StrictModeError(
                    f"no rule for operator {func} (called in module '{path}', {phase.value}, "
                    f"inputs {[tuple(t.shape) for t in call.inputs]}); add one with "
                    f"rules={{'{func._schema.name}': fn}}, or count with strict=False to list it in "
                    "Report.uncounted"
                )
            read, written = call.io_bytes()
            cost = Cost(0, 0, read, written)
        else:
            counted = True
            try:
                cost = fn(call)
            except FlopscopeError:
                raise
            except Exception as e:
                raise RuleError(
                    f"rule {_rule_name(fn)} for operator {func} failed in module '{path}' "
                    f"(inputs {[tuple(t.shape) for t in call.inputs]}): {type(e).__name__}: {e}"
                ) from e
            if type(cost) is not Cost:
                cost = _as_cost(cost, f"rule {_rule_name(fn)} for operator {func} in module '{path}'")
        if frame is not None:
            if cost.flops or not counted:
                frame.arithmetic += 1
            elif is_alloc:
                frame.allocations += 1
        if shadowing is not None:
            sh = shadowing.shadow
            assert sh is not None
            sh[0] += cost.macs
            sh[1] += cost.flops
            sh[2] += cost.bytes_read
            sh[3] += cost.bytes_written
            return
        self._add((path, id(func), backward), cost)

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> Counter:
        if self._mode is not None:
            raise UsageError("this Counter is already active; nest a new Counter instead")
        self._handles = [
            register_module_forward_pre_hook(self._pre_hook),
            register_module_forward_hook(self._post_hook),
        ]
        self._mode = _Mode(self)
        try:
            self._mode.__enter__()  # type: ignore[no-untyped-call]
        except BaseException:
            self._remove_hooks()
            self._mode = None
            raise
        return self

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
        finally:
            self._mode = None
            self._remove_hooks()
            failed_in = self._stack[-1].path if self._stack else None
            self._stack.clear()
            self._shadowing = None
            self._in_rule = False
        if exc is not None:
            if failed_in is not None and not isinstance(exc, FlopscopeError):
                exc.__dict__.setdefault("flopscope_module_path", failed_in)
                if hasattr(exc, "add_note"):
                    exc.add_note(f"flopscope: raised in module '{failed_in}'")
            return
        if self.warn:
            self._warn()

    def _warn(self) -> None:
        report = self.report
        if report.uncounted:
            listed = ", ".join(f"{op} ({n} calls)" for op, n in report.uncounted.items())
            warnings.warn(
                f"flopscope: {len(report.uncounted)} operator(s) had no rule and were counted as 0 "
                f"FLOPs: {listed}. See Report.uncounted; add rules or count with strict=True.",
                FlopscopeWarning,
                stacklevel=3,
            )
        if report.opaque:
            warnings.warn(
                "flopscope: these modules produced outputs with no arithmetic operator (only "
                f"allocations), so their work may bypass the dispatcher: {', '.join(report.opaque)}. "
                "Give them a module rule.",
                FlopscopeWarning,
                stacklevel=3,
            )

    # -- results ------------------------------------------------------------------------------
    @property
    def report(self) -> Report:
        """A :class:`Report` of everything counted so far."""
        paths = set(self._types)
        for path, _, _ in self._acc:
            paths.add(path)
        modules = {p: (self._types.get(p, ""), self._calls.get(p, 0)) for p in self._types}
        for p in sorted(paths - set(modules)):
            modules[p] = ("", 0)
        records = []
        for (path, op, backward), a in self._acc.items():
            if isinstance(op, str):  # a module rule's entry
                name, counted = op, True
            else:
                fn, name = self._ops[op][:2]  # op is the id of an operator overload
                counted = fn is not None
            records.append(OpRecord(path, name, _BACKWARD if backward else _FORWARD, a[0],
                                    Cost(a[1], a[2], a[3], a[4]), counted))
        rules = tuple(
            RuleRecord(path, name, a[0], Cost(a[1], a[2], a[3], a[4]), Cost(a[5], a[6], a[7], a[8]),
                       macs_only)
            for path, (name, macs_only, a) in self._rule_acc.items()
        )
        return Report(
            model=type(self.model).__name__ if self.model is not None else "",
            modules=modules,
            module_params=dict(self._params),
            records=tuple(records),
            rules=rules,
            opaque=tuple(self._opaque),
        )


def _as_cost(result: Any, what: str) -> Cost:
    if isinstance(result, Cost):
        return result
    if isinstance(result, numbers.Integral) and not isinstance(result, bool):
        return Cost.from_macs(int(result))
    if isinstance(result, float) and result.is_integer():
        return Cost.from_macs(int(result))
    if isinstance(result, torch.Tensor) and result.numel() == 1 and not result.is_floating_point():
        return Cost.from_macs(int(result.item()))
    raise RuleError(
        f"{what} returned {result!r} ({type(result).__name__}); a rule returns a flopscope.Cost, or "
        "an integer number of MACs"
    )


class Inputs:
    """The model's own arguments, passed verbatim to the model by :func:`count`.

    Use it when a model keyword has the same name as one of :func:`count`'s options::

        flopscope.count(model, flopscope.Inputs(x, strict=True), strict=False)
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


_OPTIONS = ("rules", "strict", "shape_only", "backward", "train", "warn")


def _check_collisions(model: nn.Module, given: dict[str, Any]) -> None:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return
    clash = [name for name in _OPTIONS if name in params and name in given]
    if clash:
        raise UsageError(
            f"{type(model).__name__}.forward also takes {', '.join(map(repr, clash))}, which is a "
            "flopscope.count option too; pass the model's arguments as "
            "flopscope.count(model, flopscope.Inputs(*args, **kwargs), ...)"
        )


def _all_meta(modules: list[nn.Module]) -> bool:
    """Whether every parameter and buffer of these modules is on ``meta`` (and there is one)."""
    found = False
    for m in modules:
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                if not t.is_meta:
                    return False
                found = True
    return found


def count(
    model: nn.Module,
    /,
    *args: Any,
    rules: RulesArg = None,
    strict: bool = False,
    shape_only: bool = False,
    backward: bool = False,
    train: bool | None = None,
    warn: bool = True,
    **kwargs: Any,
) -> Report:
    """Count one forward call of ``model`` (and optionally its backward).

    ``model(*args, **kwargs)`` is run once under a :class:`Counter`. The model's arguments pass
    through unchanged; flopscope's own options are the keyword-only names below. If the model
    itself takes a keyword with one of those names, wrap the model's arguments in
    :class:`Inputs` (flopscope refuses to guess and says so).

    The model is left as it was: training flags (and ``train=`` changes) are restored, buffers
    updated by the forward (batch-norm running statistics) are put back, gradients are computed
    with ``torch.autograd.grad`` so no ``.grad`` is touched, and no hook or attribute remains.

    Args:
        model: the model.
        *args: positional arguments of ``model`` (or one :class:`Inputs`).
        rules: extra operator and module rules (see :class:`Counter`).
        strict: raise at the first operator without a rule.
        shape_only: run on fake tensors: no arithmetic, no activation memory; same counts.
            Models on the ``meta`` device are counted this way too (inputs are moved to ``meta``).
        backward: also run backward from every floating-point output that requires grad.
        train: run in training (True) or eval (False) mode; ``None`` keeps the model's mode.
        warn: warn once about uncounted operators and opaque modules.
        **kwargs: keyword arguments of ``model``.

    Returns:
        The :class:`Report`.

    Raises:
        UsageError: bad arguments (not a module, option/keyword clash, nothing to backward).
        ForwardError: the model's forward raised; ``module_path`` says where.
        StrictModeError: ``strict`` and an operator without a rule ran.
        RuleError: a rule raised or returned something that is not a cost.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"count() takes an nn.Module as its first argument, not {type(model).__name__}"
        )
    if len(args) == 1 and isinstance(args[0], Inputs):
        if kwargs:
            raise UsageError(
                "pass every model argument inside flopscope.Inputs(...) when you use it; got extra "
                f"keywords {sorted(kwargs)}"
            )
        args, kwargs = args[0].args, dict(args[0].kwargs)
    else:
        given = {"rules": rules, "strict": strict, "shape_only": shape_only, "backward": backward,
                 "train": train, "warn": warn}
        explicit = {k for k, v in given.items() if v not in (None, False) or (k == "warn" and v is not True)}
        _check_collisions(model, {k: given[k] for k in explicit})
    counter = Counter(model, rules=rules, strict=strict, warn=warn)
    modules = [m for _, m in counter._named]
    on_meta = _all_meta(modules)
    modes = [(m, m.training) for m in modules]
    saved: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = []
    if not on_meta:  # fake mode too: BatchNorm bumps num_batches_tracked from Python
        with torch.no_grad():
            for m in modules:
                for name, b in m._buffers.items():
                    if b is not None:
                        saved.append((m._buffers, name, b, b.detach().clone()))
    # How to run: real tensors; or fake CPU tensors (shape_only, or a meta model with a module
    # whose fast path is chosen by device); or, for other meta models, meta kernels (fastest),
    # falling back to fake CPU tensors if the forward cannot run on meta (e.g. it reads a value,
    # which fake tensors allow for constants and meta tensors never do).
    if on_meta and not needs_fake_cpu(modules):
        ways = ["meta", "fake"]
    else:
        ways = ["fake"] if shape_only or on_meta else ["real"]
    try:
        if train is not None:
            model.train(train)
        for i, way in enumerate(ways):
            if i:
                counter = Counter(model, rules=rules, strict=strict, warn=warn)
            try:
                _run(way, counter, model, on_meta, args, kwargs, backward)
                break
            except ForwardError:
                if i + 1 == len(ways):
                    raise
    finally:
        for m, mode in modes:
            if m.training != mode:
                m.training = mode
        with torch.no_grad():
            for table, name, tensor, value in saved:
                table[name] = tensor
                if tensor.shape == value.shape:
                    tensor.copy_(value)
    report = counter.report
    if shape_only or on_meta:
        report = dataclasses.replace(report, shape_only=True)
    return report


def _run(way: str, counter: Counter, model: nn.Module, on_meta: bool, args: tuple[Any, ...],
         kwargs: dict[str, Any], backward: bool) -> None:
    """One forward (and backward) of ``model`` under ``counter``, on ``way``'s tensors."""
    fake_params: dict[str, torch.Tensor] | None = None
    with ExitStack() as cleanup:
        if way == "meta":  # SDPA is made to pick the CPU's kernel
            args, kwargs = tree_map_only(torch.Tensor, _to_meta, (args, kwargs))
            cleanup.enter_context(sdpa_as_cpu())
        elif way == "fake":
            fake_mode, fake_params = _fake_mode(model if on_meta else None)
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: _to_fake(fake_mode, t), (args, kwargs)
            )
            cleanup.enter_context(fake_mode)
        with counter:
            try:
                if fake_params is None:
                    out = model(*args, **kwargs)
                    if backward:
                        _backward(model, out)
                else:
                    out = torch.func.functional_call(model, fake_params, args, kwargs)
                    if backward:
                        _backward(model, out, fake_params)
            except FlopscopeError:
                raise
            except Exception as e:
                path = counter._stack[-1].path if counter._stack else None
                where = f" in module '{path}' ({counter._types.get(path, '?')})" if path is not None else ""
                raise ForwardError(
                    f"the model's forward raised{where}: {type(e).__name__}: {e}", module_path=path
                ) from e


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    """An input for a model on ``meta``: the same metadata on ``meta`` (a leaf, like the input)."""
    if t.is_meta:
        return t
    return t.detach().to("meta").requires_grad_(t.requires_grad)


def _to_fake(fake_mode: Any, t: torch.Tensor) -> torch.Tensor:
    if t.is_meta:
        return fake_mode.fake_tensor_converter.from_meta_and_device(  # type: ignore[no-any-return]
            fake_mode, t, torch.device("cpu")
        )
    return fake_mode.from_tensor(t)  # type: ignore[no-any-return]


def _fake_mode(meta_model: nn.Module | None) -> tuple[Any, dict[str, torch.Tensor] | None]:
    """A FakeTensorMode for shape-only counting, and for a model on ``meta`` its fake parameters.

    A ``meta`` model that holds a module with a device-chosen fast path (see ``flopscope._meta``)
    is run as if it were on the CPU: it is called through ``torch.func.functional_call`` with fake
    CPU tensors in place of its meta parameters and buffers (put back on return; the model is not
    modified). Other ``meta`` models run on ``meta`` itself, which is faster.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    if meta_model is None:
        return fake_mode, None
    fake_params: dict[str, torch.Tensor] = {}
    for name, t in [*meta_model.named_parameters(remove_duplicate=False),
                    *meta_model.named_buffers(remove_duplicate=False)]:
        fake = _to_fake(fake_mode, t)  # memoized: a tied weight stays one tensor
        if isinstance(t, nn.Parameter) and t.requires_grad and fake.is_leaf:
            fake.requires_grad_(True)
        fake_params[name] = fake
    return fake_mode, fake_params


def _backward(
    model: nn.Module, out: Any, fake_params: dict[str, torch.Tensor] | None = None
) -> None:
    roots = [
        t for t in tree_iter(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    if not roots:
        raise UsageError(
            "backward=True, but no floating-point output of the model requires grad: run in a "
            "context where autograd is enabled and with parameters that require grad"
        )
    params: list[torch.Tensor]
    if fake_params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    else:  # a meta model run on fake parameters: differentiate with respect to those
        params = [fake_params[name] for name, p in model.named_parameters() if p.requires_grad]
    inputs = params if params else roots
    torch.autograd.grad(
        roots, inputs, grad_outputs=[torch.ones_like(t) for t in roots], allow_unused=True
    )
