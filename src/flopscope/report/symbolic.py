"""The result of a symbolic count: :class:`SymbolicReport` (totals, tables, the domain, evaluation
at a point, what its HTML page plots) of :mod:`~flopscope.report.symbolic_records`; formulas for
people are
:func:`flopscope.render.formulas.pretty`. Made by
:func:`flopscope.symbolic.count.count_symbolic`, which is where the symbols come from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]

from flopscope.cost import Phase
from flopscope.errors import DomainError, UsageError
from flopscope.render.formulas import pretty
from flopscope.report.records import OpRecord, RuleRecord, is_within
from flopscope.report.report import Report
from flopscope.report.symbolic_records import FIELDS, SymCost, SymRecord, sum_sym_costs

__all__ = ["CURVE_FIELDS", "SymbolicReport", "symbolic_curves", "symbolic_derived"]

class SymbolicReport:
    """What a model costs, as formulas of named sizes. Made by :func:`count_symbolic`.

    Attributes:
        symbols: name -> sympy symbol (integer, positive).
        hints: name -> the size the model was traced at.
        domain: the guards (sympy relations in the named symbols) under which the formulas hold.
        unknowns: symbols that are not input sizes (data-dependent sizes: ``nonzero``, routing),
            with what made them; :meth:`evaluate` takes values for them too (``u0=12``).
        records: every (module, operator, phase) with its symbolic cost.
        report: the underlying report's structure (modules, parameters); its costs are not used.
    """

    def __init__(self, symbols: Mapping[str, sympy.Symbol], hints: Mapping[str, int],
                 domain: Sequence[sympy.Basic], unknowns: Mapping[str, str],
                 records: Sequence[SymRecord], rules: Sequence[tuple[RuleRecord, SymCost, SymCost]],
                 report: Report) -> None:
        self.symbols = dict(symbols)
        self.hints = dict(hints)
        self.domain = tuple(domain)
        self.unknowns = dict(unknowns)
        self._unknown_symbols: dict[str, sympy.Symbol] | None = None  # see _unknown
        self.records = tuple(records)
        self._rules = tuple(rules)
        self.report = report

    # -- queries ----------------------------------------------------------------------------
    def total(self, phase: Phase | str | None = None, *, module: str | None = None) -> SymCost:
        """The symbolic cost of one phase (all phases with ``None``), of a module's subtree."""
        ph = Phase(phase) if phase is not None else None
        return sum_sym_costs(r.cost for r in self.records
                    if (ph is None or r.phase is ph) and (module is None or is_within(r.module, module)))

    @property
    def macs(self) -> sympy.Expr:
        """Total MACs, all phases."""
        return self.total().macs

    @property
    def flops(self) -> sympy.Expr:
        """Total FLOPs, all phases."""
        return self.total().flops

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases that ran, in :class:`~flopscope.cost.Phase` order."""
        seen = {r.phase for r in self.records}
        return tuple(p for p in Phase if p in seen)

    def by_module(self, phase: Phase | str | None = None) -> dict[str, SymCost]:
        """Inclusive symbolic cost per module path (model order; the root is ``""``)."""
        ph = Phase(phase) if phase is not None else None
        acc: dict[str, list[SymCost]] = {p: [] for p in self.report.modules}
        for r in self.records:  # one pass: each record to its module and every ancestor
            if ph is None or r.phase is ph:
                parts = r.module.split(".") if r.module else []
                for i in range(len(parts) + 1):
                    found = acc.get(".".join(parts[:i]))
                    if found is not None:
                        found.append(r.cost)
        return {p: sum_sym_costs(cs) for p, cs in acc.items()}

    def by_op(self, phase: Phase | str | None = None, *, module: str | None = None) -> dict[str, SymCost]:
        """Symbolic cost per operator (name order), of a module's subtree."""
        ph = Phase(phase) if phase is not None else None
        acc: dict[str, list[SymCost]] = {}
        for r in self.records:
            if (ph is None or r.phase is ph) and (module is None or is_within(r.module, module)):
                acc.setdefault(r.op, []).append(r.cost)
        return {op: sum_sym_costs(cs) for op, cs in sorted(acc.items())}

    # -- domain and evaluation ---------------------------------------------------------------
    @property
    def _unknown(self) -> dict[str, sympy.Symbol]:
        """Name -> the sympy symbol PyTorch made for each data-dependent size (``u0``), found in
        the records the first time it is needed (never, for most reports: no unknowns)."""
        if self._unknown_symbols is None:
            self._unknown_symbols = {} if not self.unknowns else {
                str(x): x for r in self.records for f in FIELDS
                for x in getattr(r.cost, f).free_symbols if str(x) in self.unknowns}
        return self._unknown_symbols

    def _values(self, values: Mapping[str, int]) -> dict[sympy.Symbol, int]:
        unknown = set(values) - set(self.symbols) - set(self._unknown)
        if unknown:
            raise UsageError(f"unknown symbol(s) {sorted(unknown)}; this report's symbols are "
                             f"{sorted(self.symbols)}"
                             + (f" and data-dependent sizes {sorted(self._unknown)}" if self._unknown
                                else ""))
        missing = set(self.symbols) - set(values)
        if missing:
            raise UsageError(f"give a value for every symbol: missing {sorted(missing)}")
        return {self.symbols.get(k) or self._unknown[k]: int(v) for k, v in values.items()}

    def violated(self, **values: int) -> list[str]:
        """The domain guards that do not hold at ``values`` (empty: the formulas are valid there)."""
        subs = {k: sympy.Integer(v) for k, v in self._values(values).items()}
        return [_relation(g) for g in self.domain if not _holds(g, subs)]

    def evaluate(self, check: bool = True, **values: int) -> Report:
        """A concrete :class:`~flopscope.report.report.Report` at the given sizes: the same modules,
        operators and phases with integer costs, equal to a concrete count at those shapes.

        Args:
            check: refuse a point outside :attr:`domain`.
            **values: a value for every symbol, e.g. ``batch=2, seq_len=128``, and for each
                data-dependent size that a cost holds (:attr:`unknowns`, e.g. ``u0=12``).

        Returns:
            The concrete report.

        Raises:
            DomainError: ``check`` and a guard does not hold at ``values``.
            UsageError: a symbol is unknown or has no value, or a cost holds a data-dependent
                size that has none.
        """
        subs = self._values(values)
        if check:
            bad = self.violated(**values)
            if bad:
                raise DomainError(
                    f"{_point(values)} is outside the domain these formulas were derived on "
                    f"(traced at {_point(self.hints)}): {'; '.join(bad)} does not hold. Count "
                    "again with hints inside that region, or pass check=False to extrapolate."
                )
        records = tuple(OpRecord(r.module, r.op, r.phase, r.calls, r.cost.at(subs), r.counted,
                                 r.decomposed) for r in self.records)
        rules = tuple(dataclasses.replace(r, cost=c.at(subs), shadowed=s.at(subs))
                      for r, c, s in self._rules)
        return dataclasses.replace(self.report, records=records, rules=rules)

    def domain_text(self) -> str:
        """The domain in words, e.g. ``valid for 2 <= seq_len, 2 <= batch``."""
        if not self.domain:
            return "valid for all sizes"
        return "valid for " + ", ".join(_relation(g) for g in self.domain)

    # -- derived figures ----------------------------------------------------------------------
    def flops_per_token(self, symbol: str = "seq_len", phase: Phase | str | None = None) -> sympy.Expr:
        """The marginal FLOPs of one more token: d(FLOPs)/d(symbol), divided by the batch symbol
        when there is one named ``batch`` (so it is per sequence position per sample)."""
        f = self.total(phase).flops
        d = sympy.diff(f, self.symbols[symbol])
        if "batch" in self.symbols and symbol != "batch":
            d = sympy.expand(d / self.symbols["batch"])
        return sympy.simplify(d)

    def average_per_token(self, symbol: str = "seq_len", phase: Phase | str | None = None,
                          **values: int) -> float:
        """FLOPs per token averaged over a sequence: total FLOPs / (batch * tokens) at ``values``."""
        subs = self._values(values)
        tokens = values[symbol] * values.get("batch", 1)
        total = self.total(phase).flops.xreplace({k: sympy.Integer(v) for k, v in subs.items()})
        return float(total) / tokens

    def split(self, symbol: str = "seq_len", field: str = "flops",
              phase: Phase | str | None = None) -> tuple[sympy.Expr, sympy.Expr]:
        """The formula split into (terms of degree >= 2 in ``symbol`` — attention's scores and
        weighted sums —, the rest)."""
        s = self.symbols[symbol]
        expr = sympy.expand(getattr(self.total(phase), field))
        high: list[sympy.Expr] = []
        rest: list[sympy.Expr] = []
        for term in sympy.Add.make_args(expr):
            quadratic = term.is_polynomial(s) and sympy.degree(term, s) >= 2
            (high if quadratic else rest).append(term)
        return sympy.Add(*high), sympy.Add(*rest)

    def crossover(self, symbol: str = "seq_len", field: str = "flops",
                  phase: Phase | str | None = None, **values: int) -> int | None:
        """The smallest value of ``symbol`` at which the super-linear part (attention) costs at
        least as much as the rest, other symbols at ``values`` (default 1); ``None`` if never."""
        high, rest = self.split(symbol, field, phase)
        s = self.symbols[symbol]
        others = {self.symbols[k]: sympy.Integer(values.get(k, 1)) for k in self.symbols if k != symbol}
        gap = sympy.expand((high - rest).xreplace(others))
        if sympy.expand(high.xreplace(others)) == 0:
            return None

        def ahead(n: int) -> bool:
            return bool(gap.xreplace({s: sympy.Integer(n)}) >= 0)

        hi = 1
        while not ahead(hi):  # the super-linear part wins eventually: double, then bisect
            hi *= 2
            if hi > 2**62:
                return None
        lo = hi // 2
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if ahead(mid):
                hi = mid
            else:
                lo = mid
        return hi if hi > 1 or ahead(1) else 1

    # -- output -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``["symbolic"]["total"]["macs"]`` (and ``flops``, ``bytes_read``,
        ``bytes_written``) as strings ``sympy.sympify`` parses, per phase and per module."""
        return {
            "schema": "flopscope.symbolic/1",
            "model": self.report.model,
            "params": self.report.params,
            "symbols": {k: str(v) for k, v in self.symbols.items()},
            "hints": dict(self.hints),
            "domain": [_relation(g) for g in self.domain],
            "unknowns": dict(self.unknowns),
            "symbolic": {
                "total": self.total().to_dict(),
                "phases": {p.value: self.total(p).to_dict() for p in self.phases},
                "modules": {p: c.to_dict() for p, c in self.by_module().items()},
                "ops": {op: c.to_dict() for op, c in self.by_op().items()},
            },
            "uncounted": self.report.uncounted,
        }

    def table(self, depth: int = 2, digits: int = 3) -> str:
        """A plain-text table of formulas per module (to ``depth``), then the total and domain."""
        rows = [("module", "MACs", "FLOPs", "bytes")]
        for path, c in self.by_module().items():
            level = path.count(".") + 1 if path else 0
            if level > depth or (path and c.flops == 0 and c.bytes == 0):
                continue
            name = "  " * level + (path.rsplit(".", 1)[-1] if path else f"{self.report.model or 'total'}")
            rows.append((name, pretty(c.macs, digits), pretty(c.flops, digits), pretty(c.bytes, digits)))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append("")
        lines.append(f"symbols: {', '.join(f'{k} (traced at {self.hints[k]})' for k in self.symbols)}")
        lines.append(self.domain_text())
        if self.unknowns:
            lines.append("unknown sizes: " + ", ".join(f"{k}: {v}" for k, v in self.unknowns.items()))
        return "\n".join(lines)

    def markdown(self, depth: int = 2, digits: int = 3) -> str:
        """The table as markdown (formulas in code spans), with the exact totals below."""
        out = ["| module | MACs | FLOPs | bytes |", "| :--- | :--- | :--- | :--- |"]
        for path, c in self.by_module().items():
            level = path.count(".") + 1 if path else 0
            if level > depth or (path and c.flops == 0 and c.bytes == 0):
                continue
            out.append(f"| `{path or '(total)'}` | `{pretty(c.macs, digits)}` | "
                       f"`{pretty(c.flops, digits)}` | `{pretty(c.bytes, digits)}` |")
        t = self.total()
        out += ["", "Exact totals:", ""]
        out += [f"- {f}: `{sympy.sstr(getattr(t, f))}`" for f in FIELDS]
        out += ["", self.domain_text()]
        return "\n".join(out)

    def page_data(self) -> dict[str, Any]:
        """What the HTML page draws: :meth:`to_dict` with ``"curves"`` (:func:`symbolic_curves`)
        and ``"derived"`` (:func:`symbolic_derived`)."""
        return {**self.to_dict(), "curves": symbolic_curves(self),
                "derived": symbolic_derived(self)}

    def to_html(self) -> str:
        """One self-contained HTML page: the formulas per module and operator, and the total
        FLOPs against each symbol (see :func:`flopscope.render.html.render_symbolic_html`)."""
        from flopscope.render.html import render_symbolic_html

        return render_symbolic_html(self.page_data())

    def _repr_html_(self) -> str:  # Jupyter: the page in a frame of its own
        from flopscope.render.html import notebook_frame, render_symbolic_html

        return notebook_frame(render_symbolic_html(self.page_data()))

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"SymbolicReport({self.report.model}, macs={sympy.sstr(self.macs)})"


# -- what a symbolic page plots (SymbolicReport.page_data) ----------------------------------
# right under the root (at most this many, the costliest first)
CURVE_FIELDS = ("flops", "macs", "bytes")
_CURVE_MODULES = 8


def _curve_range(report: SymbolicReport, name: str, fixed: Mapping[str, int],
                 points: int) -> list[int]:
    """The sizes of ``name`` to plot: from the smallest the domain allows (seq_len >= 2, ...)
    to 32 times the traced one, ``points`` of them, those outside the domain left out."""
    hi = 32 * report.hints.get(name, 1)
    lo = next((x for x in range(1, hi) if not report.violated(**{**fixed, name: x})), hi)
    xs = sorted({round(lo + (hi - lo) * i / (points - 1)) for i in range(points)})
    return [x for x in xs if not report.violated(**{**fixed, name: x})]


def _points(report: SymbolicReport, expr: Any, name: str, fixed: Mapping[str, int],
            xs: Sequence[int]) -> list[list[int]] | None:
    """``[[x, expr at x], ...]`` (exact integers), or ``None`` when the formula holds a
    data-dependent size."""
    out = []
    for x in xs:
        at = {**fixed, name: x}
        value = expr.xreplace({report.symbols[k]: sympy.Integer(v) for k, v in at.items()})
        if not value.is_number:
            return None
        out.append([x, int(value)])
    return out


def symbolic_curves(report: SymbolicReport, *, points: int = 33,
                    fields: Sequence[str] = CURVE_FIELDS) -> list[dict[str, Any]]:
    """Each field of the total and of the modules right under the root against each symbol,
    the other symbols at the sizes traced: ``points`` sizes from the smallest the formulas'
    domain allows to 32 times the traced size (the range of ``plot_symbolic``; sizes outside the
    domain left out). For ``seq_len``, the total's terms of degree two and above (attention) and
    the rest apart (``"split"``) and where the first overtakes the second (``"crossover"``,
    :meth:`SymbolicReport.crossover` at the same sizes of the others). A formula holding a
    data-dependent size has no curve.

    Args:
        report: the symbolic report.
        points: sizes per symbol.
        fields: of ``macs``, ``flops``, ``bytes`` (read + written), ``bytes_read``,
            ``bytes_written``.

    Returns:
        ``[{"symbol", "field", "module", "fixed": {name: size}, "points": [[x, value], ...]}]``
        (``module`` ``""``: the total), with ``"split": {"high": points, "rest": points}`` and
        ``"crossover"`` (a size or ``None``) on the total's ``seq_len`` curves.
    """
    by_module = report.by_module()
    # the modules right under the root with any cost, the costliest at the traced sizes first
    children = sorted((p for p in by_module if p and "." not in p
                       and (by_module[p].flops != 0 or by_module[p].bytes != 0)),
                      key=lambda p: -_at_hints(report, by_module[p].flops))
    out = []
    for name in report.symbols:
        fixed = {k: v for k, v in report.hints.items() if k != name and k in report.symbols}
        xs = _curve_range(report, name, fixed, points)
        if not xs:
            continue
        for field in fields:
            for module in ["", *children[:_CURVE_MODULES]]:
                cost = report.total() if module == "" else by_module[module]
                got = _points(report, getattr(cost, field), name, fixed, xs)
                if not got:
                    continue
                curve: dict[str, Any] = {"symbol": name, "field": field, "module": module,
                                         "fixed": fixed, "points": got}
                if module == "" and name == "seq_len":
                    high, rest = report.split(name, field)
                    if high != 0:
                        split = (_points(report, high, name, fixed, xs),
                                 _points(report, rest, name, fixed, xs))
                        if split[0] is not None and split[1] is not None:
                            curve["split"] = {"high": split[0], "rest": split[1]}
                            curve["crossover"] = report.crossover(name, field, None, **fixed)
                out.append(curve)
    return out


def _at_hints(report: SymbolicReport, expr: Any) -> int:
    """A formula at the traced sizes (0 when it holds a data-dependent size)."""
    value = expr.xreplace({report.symbols[k]: sympy.Integer(v) for k, v in report.hints.items()
                           if k in report.symbols})
    return int(value) if value.is_number else 0


def symbolic_derived(report: SymbolicReport) -> dict[str, Any]:
    """What the command line prints under a symbolic table, as data: with a ``seq_len`` symbol,
    the FLOPs of one more token (``per_token``: d(FLOPs)/d(seq_len) per sample, its formula
    and its value at the traced sizes) and the ``seq_len`` where the terms of degree
    two and above overtake the rest (``crossover``, the other symbols at 1, as the command line
    says it).

    Args:
        report: the symbolic report.

    Returns:
        ``{}`` without ``seq_len``; else ``{"per_token": {...}, "crossover": {...}}``.
    """
    if "seq_len" not in report.symbols:
        return {}
    per_token = report.flops_per_token("seq_len")
    at = per_token.xreplace({report.symbols[k]: sympy.Integer(v)
                             for k, v in report.hints.items() if k in report.symbols})
    ones = {k: 1 for k in report.symbols if k != "seq_len"}
    return {"per_token": {"symbol": "seq_len", "formula": str(per_token),
                          # a whole number, or a fraction (a term divided by the batch)
                          "at_hints": (int(at) if at.is_integer else float(at)) if at.is_number
                          else None, "hints": dict(report.hints)},
            "crossover": {"symbol": "seq_len", "field": "flops", "fixed": ones,
                          "at": report.crossover("seq_len")}}


def _relation(g: sympy.Basic) -> str:
    """A guard in words: ``2 <= seq_len``, ``seq_len != 1``."""
    if isinstance(g, sympy.Ne):
        return f"{sympy.sstr(g.lhs)} != {sympy.sstr(g.rhs)}"
    if isinstance(g, sympy.Eq):
        return f"{sympy.sstr(g.lhs)} == {sympy.sstr(g.rhs)}"
    if isinstance(g, sympy.GreaterThan) and g.rhs.is_Integer:
        return f"{int(g.rhs)} <= {sympy.sstr(g.lhs)}"
    if isinstance(g, sympy.StrictLessThan) and g.lhs.is_Integer:  # 1 < s  ->  2 <= s
        return f"{int(g.lhs) + 1} <= {sympy.sstr(g.rhs)}"
    if isinstance(g, sympy.StrictGreaterThan) and g.rhs.is_Integer:
        return f"{int(g.rhs) + 1} <= {sympy.sstr(g.lhs)}"
    return str(sympy.sstr(g))


def _holds(guard: sympy.Basic, subs: Mapping[sympy.Symbol, sympy.Integer]) -> bool:
    """Whether a guard is true at a point; one that cannot be evaluated there (a ``Mod`` or
    floor division by a size that is 0 at that point) does not hold."""
    try:
        return guard.xreplace(subs) is sympy.true
    except ZeroDivisionError:
        return False


def _point(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())
