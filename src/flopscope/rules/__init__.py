"""Rules: what each operator costs.

The default rules live in one module per operator family; importing this package registers them
all. Use :func:`default_rules` for the shared, immutable default :class:`RuleSet`.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import NamedTuple

from flopscope.rules import (  # noqa: F401  (imported for their @rule registrations)
    attention,
    conv,
    elementwise,
    matmul,
    misc,
    normalization,
    pooling,
    reduction,
    zero_cost,
)
from flopscope.rules.registry import DEFAULT_TABLE, Rule, RuleSet, op_key, rule

__all__ = ["Convention", "Rule", "RuleSet", "conventions", "default_rules", "op_key", "rule"]

_FAMILIES = ["matmul", "conv", "attention", "elementwise", "reduction", "normalization", "pooling",
             "misc", "zero_cost"]


@cache
def default_rules() -> RuleSet:
    """The default rules of every operator family, as one immutable :class:`RuleSet`."""
    return RuleSet(DEFAULT_TABLE)


class Convention(NamedTuple):
    """One row of the conventions table: an operator family's rule and the operators it covers."""

    family: str
    rule: str
    ops: tuple[str, ...]
    text: str


def conventions(rules: RuleSet | None = None) -> list[Convention]:
    """Every rule with the operators it covers and its documented convention (from the docstring).

    This is the single source of ``docs/conventions.md`` and of ``flopscope rules``.
    """
    table = rules if rules is not None else default_rules()
    grouped: dict[int, list[str]] = {}
    fns: dict[int, Rule] = {}
    for key in table:
        fn = table[key]
        grouped.setdefault(id(fn), []).append(key)
        fns[id(fn)] = fn
    rows = []
    for ident, ops in grouped.items():
        fn = fns[ident]
        module = getattr(fn, "__module__", "") or ""
        family = module.rsplit(".", 1)[-1] if module.startswith("flopscope.rules.") else "user"
        text = " ".join(inspect.cleandoc(fn.__doc__ or "(undocumented)").split())
        rows.append(Convention(family, getattr(fn, "__name__", repr(fn)), tuple(sorted(ops)), text))
    order = {name: i for i, name in enumerate(_FAMILIES)}
    rows.sort(key=lambda r: (order.get(r.family, len(order)), r.ops[0]))
    return rows
