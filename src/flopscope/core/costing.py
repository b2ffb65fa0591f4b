"""Costing: what one operator call costs under a Counter's rules, in one place.

:class:`Costing` keeps, per operator overload, the rule that applies (a user's rule, else the
default) and whether the operator is counted as its decomposition's pieces instead
(:class:`OpEntry`), and costs a call (:meth:`Costing.cost`): the rule called on the
:class:`~flopscope.cost.OpCall`, a rule written for dense tensors summed over a nested tensor's
components, the result validated, a default rule's FLOPs adjusted for integer and complex work
(:mod:`flopscope.core.numbers`), and a default rule's cost of a shape-only call remembered per
(operator, argument metadata, phase) (:mod:`flopscope.core.memo`).
"""

from __future__ import annotations

from typing import Any

from torch.fx.experimental.symbolic_shapes import statically_known_true

from flopscope.core.cost_memo import REAL_KEY, REAL_LIMIT, is_real_key
from flopscope.core.facts import OpFacts, facts
from flopscope.core.fake_memo import is_shared
from flopscope.core.numbers import in_real_numbers
from flopscope.cost import VALUE_READS, Cost, OpCall, Phase, nested_parts
from flopscope.errors import FlopscopeError, RuleError
from flopscope.rules import default_rules
from flopscope.rules.registry import ADJUSTED_RULES, Rule, RuleSet
from flopscope.rules.user import as_cost, rule_name

__all__ = ["Costing", "OpEntry", "may_be_nonzero"]

# id(phase) -> memo key -> (rule, cost) of a call on plain meta tensors whose rule is a default
# rule: shared by every Counter, as a default rule's cost depends on the call's metadata and phase
# alone; a hit counts only where the Counter's rule for the operator is that same rule
_SHARED_MEMO: dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]] = {id(p): {} for p in Phase}
_MEMO_LIMIT = 200_000  # entries per phase before a memo starts over
# id(phase) -> cost_key -> (rule, cost) of a call on real tensors whose rule is a default rule and
# read no tensor's values (flopscope.core.cost_memo): shared by every Counter likewise
_REAL_MEMO: dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]] = {id(p): {} for p in Phase}


def may_be_nonzero(n: Any) -> bool:
    """Whether a cost field may be nonzero, without a guard on a symbolic size: on a
    data-dependent size (``u0`` from ``nonzero``) no guard can be made, and on input sizes a
    guard such as ``Ne(72*batch, 0)`` would only narrow the formula's domain. Not known to be 0:
    not zero."""
    return (n != 0) if type(n) is int else not statically_known_true(n == 0)


def _summed(fn: Rule, parts: list[OpCall]) -> Cost | None:
    """The sum of a rule's costs of the parts of a nested call; ``None`` if it fails on a part."""
    total = Cost()
    try:
        for part in parts:
            cost = fn(part)
            total = total + (cost if type(cost) is Cost else as_cost(cost, rule_name(fn)))
    except Exception:  # reported by the caller as the rule's failure on the whole call
        return None
    return total


class OpEntry:
    """What a Counter does with one operator: its facts, the rule that costs it (``None``: no
    rule), the decomposition to count instead (``None``: the operator itself is counted), and
    whether its rule's costs may be remembered per argument metadata (a default rule's). The
    facts the dispatch mode reads on every call (``ignored``, ``guarded``, ``kernel``) are copied
    here too, one attribute read fewer each."""

    __slots__ = ("decomposition", "facts", "guarded", "ignored", "kernel", "memoizable", "rule")

    def __init__(self, facts: OpFacts, rule: Rule | None, decomposition: Any,
                 memoizable: bool) -> None:
        self.facts = facts
        self.ignored = facts.ignored
        self.guarded = facts.guarded
        self.kernel = facts.kernel
        self.rule = rule
        self.decomposition = decomposition
        self.memoizable = memoizable


class Costing:
    """A Counter's rules, applied to operator calls.

    Args:
        rules: the operator rules (defaults and the user's).
    """

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self.entries: dict[int, OpEntry] = {}  # id(operator overload) -> entry
        # this Counter's own memo, for keys that are not shared (see fake_memo.is_shared)
        self._memo: dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]] = {
            id(p): {} for p in Phase}

    def entry(self, func: Any) -> OpEntry:
        """The entry of an operator overload, made on first sight: a rule wins over the
        decomposition, except a default rule on a composite operator whose decomposition is what
        runs (``aten.linear``: its pieces are counted)."""
        found = self.entries.get(id(func))
        if found is not None:
            return found
        f = facts(func)
        fn = self.rules.find(func)
        default = default_rules().find(func)
        decomposition = None
        if not f.ignored:
            decomposition = f.decomposition
            if fn is not None and not (f.runs_decomposed and fn is default):
                decomposition = None
        found = self.entries[id(func)] = OpEntry(f, fn, decomposition,
                                                 fn is not None and fn is default)
        return found

    def counted(self, f: OpFacts) -> bool:
        """Whether the operator of these facts has a rule here."""
        return self.entry(f.op).rule is not None

    def remembered(self, entry: OpEntry, memo: tuple[Any, ...], phase: Phase) -> Cost | None:
        """The remembered cost of a call with this memo key, or ``None``."""
        # (the tables of _table, inline: this runs on every remembered call; every memo key has
        # two elements or more: an operator's id, then REAL_KEY or the shape-only memo's)
        tables = _REAL_MEMO if memo[1] is REAL_KEY else (
            _SHARED_MEMO if is_shared(memo) else self._memo)
        hit = tables[id(phase)].get(memo)
        return hit[1] if hit is not None and hit[0] is entry.rule else None

    def _table(self, memo: tuple[Any, ...]) -> dict[int, dict[tuple[Any, ...], tuple[Rule, Cost]]]:
        if is_real_key(memo):
            return _REAL_MEMO
        return _SHARED_MEMO if is_shared(memo) else self._memo

    def cost(self, entry: OpEntry, call: OpCall, path: str, memo: tuple[Any, ...] | None = None,
             *, logical: bool = False) -> Cost:
        """What ``call`` costs by ``entry``'s rule (which must exist).

        Args:
            entry: the operator's entry.
            call: the call.
            path: the module the call is attributed to (for error messages).
            memo: the call's memo key, when its cost depends on argument metadata alone: the
                cost of a default rule is remembered under it.
            logical: the call is on DTensors of global shapes (for error messages).

        Returns:
            The cost.

        Raises:
            RuleError: the rule raised or returned something that is not a cost.
        """
        fn = entry.rule
        assert fn is not None
        reads = VALUE_READS[0]
        try:
            cost = fn(call)
        except FlopscopeError:
            raise
        except Exception as e:
            parts = nested_parts(call)  # a rule written for dense tensors, on a nested tensor
            summed = _summed(fn, parts) if parts is not None else None
            if summed is None:
                where = (f"on DTensors (global shapes {call.input_shapes()}) in module '{path}'"
                         if logical else f"in module '{path}' (inputs {call.input_shapes()})")
                raise RuleError(f"rule {rule_name(fn)} for operator {call.op} failed {where}: "
                                f"{type(e).__name__}: {e}") from e
            cost = summed
        if type(cost) is not Cost:
            cost = as_cost(cost, f"rule {rule_name(fn)} for operator {call.op} in module '{path}'")
        if fn in ADJUSTED_RULES and may_be_nonzero(cost.flops):
            # a default rule: integer work is not FLOPs, complex work is counted in real
            # operations (flopscope.core.numbers)
            cost = in_real_numbers(call, cost, entry.facts.name)
        if memo is not None and entry.memoizable and VALUE_READS[0] == reads:  # (not if the rule
            # read a tensor's values: its cost depends on more than the key)
            tables = self._table(memo)
            table = tables[id(call.phase)]
            if len(table) >= (REAL_LIMIT if tables is _REAL_MEMO else _MEMO_LIMIT):
                table.clear()
            table[memo] = (fn, cost)
        return cost
