"""The ledger: running sums of calls and cost per (module path, operator, phase), what module
rules said, and the report records made from them.

A key's operator is the operator's :class:`~flopscope.core.facts.OpFacts` (its calls counted by
its rule, or listed as uncounted), a :class:`Decomposed` (an operator counted as the sum of its
decomposition's pieces) or a string (a module rule's cost of a whole module). ``listen()`` lets a
caller see every addition while a block runs (whole-module replay records what a layer adds);
``redirect()`` sends additions to another table while a block runs (the rank's work inside a
DTensor operator, kept apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Union

from flopscope.core.facts import OpFacts
from flopscope.cost import Cost, Phase
from flopscope.report.records import OpRecord, RuleRecord, op_record

__all__ = ["Acc", "Decomposed", "Key", "Ledger", "RuleSums", "Sums", "decomposed_key", "sums_of"]


class Sums:
    """Running totals of calls and cost (mutable; the hot path adds to it in place)."""

    __slots__ = ("bytes_read", "bytes_written", "calls", "first", "flops", "macs")

    def __init__(self) -> None:
        self.calls = 0
        self.macs = 0
        self.flops = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.first: Any = None  # the first cost added, reused as the total while they are equal

    def add(self, cost: Any) -> None:
        """Add a cost's MACs, FLOPs and bytes (not a call: callers count calls themselves)."""
        self.macs += cost.macs
        self.flops += cost.flops
        self.bytes_read += cost.bytes_read
        self.bytes_written += cost.bytes_written

    def cost(self) -> Cost:
        """The total as a :class:`Cost`: the first cost itself while nothing else was added (most
        entries of a forward are one call; plain integers only, as comparing symbolic sizes
        would add guards)."""
        first = self.first
        if first is not None and self.calls == 1:  # one call added: its cost is the total
            return first  # type: ignore[no-any-return]
        macs, flops, read, written = self.macs, self.flops, self.bytes_read, self.bytes_written
        if (first is not None and type(macs) is int and type(flops) is int and type(read) is int
                and type(written) is int and first.macs == macs and first.flops == flops
                and first.bytes_read == read and first.bytes_written == written):
            return first  # type: ignore[no-any-return]
        return Cost(macs, flops, read, written)


class Decomposed:
    """The ledger's name for an operator counted as its decomposition's pieces."""

    __slots__ = ("facts",)

    def __init__(self, facts: OpFacts) -> None:
        self.facts = facts


_DECOMPOSED: dict[OpFacts, Decomposed] = {}


def decomposed_key(facts: OpFacts) -> Decomposed:
    """The one :class:`Decomposed` of an operator."""
    found = _DECOMPOSED.get(facts)
    if found is None:
        found = _DECOMPOSED[facts] = Decomposed(facts)
    return found


OpKey = Union[OpFacts, Decomposed, str]
Key = tuple[str, OpKey, Phase]
# a key's entry: its one call's Cost while it has one (most keys of a forward: no Sums made on the
# hot path), its Sums from the second call on (read with sums_of(); merged() and records() take both)
Acc = dict[Key, Union[Sums, Cost]]


def _summed(first: Cost, cost: Cost | None) -> Sums:
    """The Sums of an entry whose first call cost ``first``, with ``cost`` added as a second call
    (``None``: none)."""
    sums = Sums()
    sums.first = first
    sums.calls = 1
    sums.macs = first.macs
    sums.flops = first.flops
    sums.bytes_read = first.bytes_read
    sums.bytes_written = first.bytes_written
    if cost is not None:
        sums.calls = 2
        sums.macs += cost.macs
        sums.flops += cost.flops
        sums.bytes_read += cost.bytes_read
        sums.bytes_written += cost.bytes_written
    return sums


def sums_of(entry: Sums | Cost) -> Sums:
    """An entry of an :data:`Acc` as :class:`Sums` (a lone cost: one call)."""
    return entry if type(entry) is Sums else _summed(entry, None)  # type: ignore[arg-type]


class RuleSums:
    """A ruled module's calls, what its rule said, and what its operators measured."""

    __slots__ = ("macs_only", "name", "rule", "shadow")

    def __init__(self, name: str, macs_only: bool) -> None:
        self.name = name
        self.macs_only = macs_only
        self.rule = Sums()
        self.shadow = Sums()


class Ledger:
    """Sums per (module path, operator, phase) and per ruled module."""

    def __init__(self) -> None:
        self.sums: Acc = {}
        self.rules: dict[str, RuleSums] = {}

    def add(self, key: Key, cost: Cost) -> None:
        """Add one call costing ``cost`` under ``key``."""
        sums = self.sums
        found = sums.get(key)
        if found is None:  # the first call: its cost itself stands for the entry (see Acc)
            sums[key] = cost
            return
        if type(found) is Sums:
            found.calls += 1
            found.macs += cost.macs
            found.flops += cost.flops
            found.bytes_read += cost.bytes_read
            found.bytes_written += cost.bytes_written
            return
        sums[key] = _summed(found, cost)  # type: ignore[arg-type]  # a Cost: the second call

    def add_calls(self, key: Key, calls: int, cost: Cost) -> None:
        """Add ``calls`` calls costing ``cost`` in all under ``key`` (a replayed module)."""
        found = self.sums.get(key)
        if found is None:
            self.add(key, cost)  # (through a listen()er, if any: as one call)
            found = self.sums[key] = sums_of(self.sums[key])
            found.calls = calls
            return
        found = self.sums[key] = sums_of(found)
        found.calls += calls
        found.add(cost)

    def add_rule(self, path: str, name: str, macs_only: bool, cost: Cost,
                 shadow: Sums | None) -> None:
        """One call of a ruled module: what its rule said and what its operators measured."""
        sums = self.rules.get(path)
        if sums is None:
            sums = self.rules[path] = RuleSums(name, macs_only)
        sums.rule.calls += 1
        sums.rule.add(cost)
        if shadow is not None:
            sums.shadow.add(shadow)

    @contextmanager
    def listen(self, listener: Callable[[Key, Cost], None]) -> Iterator[None]:
        """Call ``listener(key, cost)`` after each :meth:`add` made while the block runs.

        Args:
            listener: called with the key and the cost of every addition.

        Yields:
            Nothing.
        """
        outer = self.__dict__.get("add")  # an enclosing listen()'s, or none
        previous = self.add

        def listened(key: Key, cost: Cost) -> None:
            previous(key, cost)
            listener(key, cost)

        self.add = listened  # type: ignore[method-assign]
        try:
            yield
        finally:
            if outer is None:
                del self.add
            else:
                self.add = outer  # type: ignore[method-assign]

    @contextmanager
    def redirect(self, acc: Acc) -> Iterator[None]:
        """Send additions to ``acc`` instead while the block runs."""
        outer = self.sums
        self.sums = acc
        try:
            yield
        finally:
            self.sums = outer

    @staticmethod
    def merged(*accs: Acc) -> Acc:
        """Tables added together (the first one itself when the others are empty)."""
        if not any(accs[1:]):
            return accs[0]
        out: dict[Key, Sums] = {}
        for acc in accs:
            for key, sums in acc.items():
                total = out.get(key)
                if total is None:
                    total = out[key] = Sums()
                total.calls += sums.calls if type(sums) is Sums else 1
                total.add(sums)
        return out  # type: ignore[return-value]

    @staticmethod
    def records(acc: Acc, counted: Callable[[OpFacts], bool]) -> tuple[OpRecord, ...]:
        """Report records of a table; ``counted`` says whether an operator had a rule."""
        records: list[OpRecord] = []
        append = records.append
        # an operator key's (name, counted, decomposed), worked out once per operator
        known: dict[OpKey, tuple[str, bool, bool]] = {}
        for (path, op, phase), sums in acc.items():
            found = known.get(op)
            if found is None:
                if type(op) is str:  # a module rule's entry
                    found = (op, True, False)
                elif type(op) is Decomposed:
                    found = (op.facts.name, True, True)
                else:
                    assert isinstance(op, OpFacts)
                    found = (op.name, counted(op), False)
                known[op] = found
            name, is_counted, decomposed = found
            calls, cost = ((sums.calls, sums.cost()) if type(sums) is Sums
                           else (1, sums))  # one call: its cost
            append(op_record(path, name, phase, calls, cost, is_counted,  # type: ignore[arg-type]
                             decomposed))
        return tuple(records)

    def rule_records(self) -> tuple[RuleRecord, ...]:
        """What each ruled module's rule said, and what its operators measured."""
        return tuple(RuleRecord(path, r.name, r.rule.calls, r.rule.cost(), r.shadow.cost(),
                                r.macs_only)
                     for path, r in self.rules.items())
