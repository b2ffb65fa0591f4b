"""Rule registration and lookup.

A *rule* is a callable ``OpCall -> Cost``. Default rules are registered once, at import, by the
op-family modules of this package through :func:`rule`, which rejects malformed targets and
duplicates. Users never mutate that table: they make a new :class:`RuleSet` with
:meth:`RuleSet.with_rules`.

Operators are named the way the dispatcher names them: ``"namespace::name"`` covers every overload
of an operator, ``"namespace::name.overload"`` a single overload (which wins over the packet).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Union

import torch

from flopscope.cost import Cost, OpCall
from flopscope.errors import RuleError

__all__ = [
    "DEFAULT_TABLE",
    "OpTarget",
    "Rule",
    "RuleSet",
    "check_operator",
    "op_key",
    "rule",
]

Rule = Callable[[OpCall], Cost]
OpTarget = Union[str, torch._ops.OpOverload, torch._ops.OpOverloadPacket]

_NAME = re.compile(r"^(?P<ns>[A-Za-z_]\w*)(?:::|\.)(?P<op>[A-Za-z_]\w*)(?:\.(?P<ovl>\w+))?$")


def op_key(target: object) -> str:
    """The canonical name of an operator target: ``"ns::op"`` or ``"ns::op.overload"``.

    Args:
        target: an ``OpOverload`` (``torch.ops.aten.mm.default``), an ``OpOverloadPacket``
            (``torch.ops.aten.mm``), a higher-order operator
            (``torch.ops.higher_order.flex_attention``: ``"higher_order::flex_attention"``) or a
            string (``"aten::mm"``, ``"aten.mm.default"``, ``"mylib::fused_attn"``).

    Returns:
        The canonical string key.

    Raises:
        RuleError: the target is not an operator or a well-formed operator name.
    """
    if isinstance(target, torch._ops.OpOverload):
        ovl = target._overloadname
        base = target._schema.name
        return f"{base}.{ovl}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name)
    if isinstance(target, str):
        m = _NAME.match(target.strip())
        if m is None:
            raise RuleError(
                f"malformed operator name {target!r}: expected 'namespace::op' or "
                "'namespace::op.overload', e.g. 'aten::mm' or 'mylib::fused_attn'"
            )
        key = f"{m['ns']}::{m['op']}"
        return f"{key}.{m['ovl']}" if m["ovl"] else key
    raise RuleError(
        f"cannot use {target!r} ({type(target).__name__}) as an operator: pass an OpOverload "
        "(torch.ops.aten.mm.default), an OpOverloadPacket (torch.ops.aten.mm) or a name "
        "('aten::mm')"
    )


def check_operator(name: str) -> None:
    """Refuse an operator name that names nothing (``"aten::mmm"``): a rule for it would never
    apply, and the count would silently go on without it. Names of the default table are
    accepted as they are (some exist only once their library is imported).

    Args:
        name: a canonical name (:func:`op_key`).

    Raises:
        RuleError: no such namespace, operator or overload (close matches named).
    """
    if name in DEFAULT_TABLE:
        return
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    if packet is not None and (not overload or hasattr(packet, overload)):
        return
    if packet is not None:
        known = ", ".join(sorted(packet.overloads()))
        raise RuleError(f"a rule names operator {name!r}, but {namespace}::{op} has no overload "
                        f"{overload!r} (it has: {known}); name an overload it has, or the "
                        f"operator '{namespace}::{op}' for all of them")
    from flopscope._text import did_you_mean

    everything = {n.partition(".")[0] for n in torch._C._dispatch_get_all_op_names()}
    raise RuleError(f"a rule names operator {name!r}, which does not exist"
                    f"{did_you_mean(f'{namespace}::{op}', sorted(everything))}; a custom "
                    "operator must be registered (torch.library) before counting")


def _overload_keys(op: torch._ops.OpOverload) -> tuple[str, str]:
    if isinstance(op, torch._ops.HigherOrderOperator):  # flex_attention, cond, ...: one key
        key = f"higher_order::{op.name()}"  # type: ignore[no-untyped-call]
        return key, key
    base = op._schema.name
    return f"{base}.{op._overloadname}", base


class RuleSet(Mapping[str, Rule]):
    """An immutable mapping from operator names to rules.

    Lookups by ``OpOverload`` (:meth:`find`) try the exact overload first, then the operator as a
    whole, and are cached.
    """

    __slots__ = ("_rules", "_cache")

    def __init__(self, rules: Mapping[Any, Rule] | None = None) -> None:
        table: dict[str, Rule] = {}
        for target, fn in (rules or {}).items():
            key = op_key(target)
            if not callable(fn):
                raise RuleError(f"rule for {key} is not callable: {fn!r}")
            check_operator(key)
            table[key] = fn
        self._rules = table
        self._cache: dict[torch._ops.OpOverload, Rule | None] = {}

    def __getitem__(self, key: str) -> Rule:
        return self._rules[op_key(key)]

    def __contains__(self, key: object) -> bool:
        try:
            return op_key(key) in self._rules
        except RuleError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"RuleSet({len(self._rules)} operator rules)"

    def find(self, op: torch._ops.OpOverload) -> Rule | None:
        """The rule for one operator overload, or ``None`` when no rule covers it."""
        try:
            return self._cache[op]
        except KeyError:
            pass
        exact, packet = _overload_keys(op)
        found = self._rules.get(exact) or self._rules.get(packet)
        self._cache[op] = found
        return found

    def with_rules(self, rules: Mapping[Any, Rule]) -> RuleSet:
        """A new RuleSet: this one with ``rules`` added or replacing existing entries.

        Args:
            rules: operator target -> rule (see :func:`op_key` for the accepted targets).

        Returns:
            The new RuleSet; ``self`` is unchanged.

        Raises:
            RuleError: a target is malformed or names no operator
                (:func:`check_operator`), or a rule is not callable.
        """
        merged: dict[str, Rule] = dict(self._rules)
        merged.update(RuleSet(rules)._rules)
        return RuleSet(merged)


# The default table, filled by @rule at import of the op-family modules.
DEFAULT_TABLE: dict[str, Rule] = {}
# Default rules whose costs the counter adjusts for integer and complex numbers (see
# flopscope.core.numbers): every default rule except those of a family module that counts them itself
# (it sets COUNTS_REAL_NUMBERS = True). A user's rule is taken as it is.
ADJUSTED_RULES: set[Rule] = set()


def rule(*targets: OpTarget) -> Callable[[Rule], Rule]:
    """Register a default rule for one or more operators.

    The decorated function's docstring states the per-element convention and its derivation; it
    is the source of ``docs/conventions.md`` and ``flopscope rules``.

    Args:
        targets: operator names (``"aten::mm"``) or overloads/packets.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        RuleError: no target given, a target is malformed, or already has a default rule.
    """
    if not targets:
        raise RuleError("@rule needs at least one operator target")
    keys = [op_key(t) for t in targets]

    def register(fn: Rule) -> Rule:
        if not callable(fn):
            raise RuleError(f"@rule({', '.join(keys)}) decorates a non-callable {fn!r}")
        for key in keys:
            if key in DEFAULT_TABLE:
                raise RuleError(
                    f"operator {key} already has a default rule "
                    f"({DEFAULT_TABLE[key].__qualname__}); one rule per operator"
                )
            DEFAULT_TABLE[key] = fn
        if not fn.__globals__.get("COUNTS_REAL_NUMBERS"):
            ADJUSTED_RULES.add(fn)
        return fn

    return register


def per_element(flops_per_element: int, *, of: str = "output") -> Rule:
    """Make a rule charging ``flops_per_element`` FLOPs per element of the output or input."""

    if of == "output":

        def fn(call: OpCall) -> Cost:
            return call.cost(flops=flops_per_element * call.out_numel())

    else:

        def fn(call: OpCall) -> Cost:
            return call.cost(flops=flops_per_element * call.args[0].numel())

    return fn


def register_table(table: Iterable[tuple[Iterable[str], int, str]], *, of: str = "output") -> None:
    """Register per-element rules from ``(operators, flops_per_element, derivation)`` rows.

    The rules are attributed to the calling module (their operator family).
    """
    family = sys._getframe(1).f_globals.get("__name__", __name__)
    for ops, k, why in table:
        fn = per_element(k, of=of)
        fn.__doc__ = why
        fn.__module__ = family
        fn.__qualname__ = fn.__name__ = f"per_{of}_element_{k}"
        rule(*ops)(fn)
