"""Rules: what each operator costs.

The default rules live in one module per operator family; importing this package registers them
all. Use :func:`default_rules` for the shared, immutable default :class:`RuleSet`.
"""

from __future__ import annotations

from functools import cache

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

__all__ = ["Rule", "RuleSet", "default_rules", "op_key", "rule"]


@cache
def default_rules() -> RuleSet:
    """The default rules of every operator family, as one immutable :class:`RuleSet`."""
    return RuleSet(DEFAULT_TABLE)
