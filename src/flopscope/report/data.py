"""What a count found: :class:`ReportData`, the immutable fields of a report (integers) and its
queries (totals, module-scoped breakdowns, the sharded-model views), its dict/JSON form and flat
rows; :class:`~flopscope.report.report.Report`, what a count returns, adds how it shows itself.

Its pieces live beside it in :mod:`flopscope.report`, one concern each: ``records`` (what a
report holds and what its queries return), ``source`` (where the model came from), ``schema``
(the versioned dict/JSON form), ``rows`` (flat rows for CSV and pandas).

What a feature adds to a report (an estimate, a memory profile, ...) is a
:class:`~flopscope.report.sections.Section` of it. The renderers (:mod:`flopscope.render`) read
a report through this class and know nothing of :mod:`flopscope.report.report`, which imports
them: imports flow one way, records -> data -> render -> report.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flopscope.core.params import ParamStats
from flopscope.cost import Cost, Phase
from flopscope.errors import UsageError
from flopscope.report import rows as _report_table
from flopscope.report import schema as _report_schema
from flopscope.report.records import (
    CommRecord,
    CommStats,
    Located,
    ModuleStats,
    OpRecord,
    OpStats,
    RuleRecord,
    as_phase,
    is_within,
    sum_costs,
)
from flopscope.report.sections import Section
from flopscope.report.source import SourceInfo

__all__ = ["ReportData"]

_R = TypeVar("_R", bound="ReportData")


@dataclass(frozen=True)
class ReportData:
    """What a model (or any code run under a :class:`~flopscope.Counter`) cost, and its queries;
    a count returns it as a :class:`~flopscope.report.report.Report`, which adds how it shows
    itself. All numbers are integers.

    Attributes:
        model: class name of the counted model (``""`` when none was given).
        modules: module path -> (class name, forward calls), in model order.
        module_params: module path -> :class:`ParamStats`.
        records: every (module, operator, phase) with its calls and cost.
        rules: modules costed by a module rule, with the shadowed operator-level cost.
        opaque: paths of modules whose outputs came from allocations only (possibly a kernel
            that bypasses the dispatcher: give it a module rule).
        shape_only: whether the count ran on fake tensors.
        communication: collectives issued, per module, phase, kind and group size (empty when
            none ran); see :meth:`communication_by_kind`.
        logical: under DTensor, the records of the logical (global, unsharded) computation: each
            operator on DTensors costed once at its global shapes, in place of the work on the
            local shards it ran as; operators on plain tensors as in ``records``. Empty when no
            DTensor operator ran (the logical work is then ``records``); see
            :meth:`logical_total`.
        replicated: under DTensor, the records of this rank's work on DTensors replicated on
            every mesh dimension (every rank does the same work); part of ``records``.
        rank: the rank that made the report (``None`` outside ``torch.distributed``).
        world_size: ranks in the job (``None`` outside ``torch.distributed``).
        sections: what features added (estimates, memory, communication, ...), in the order
            they are shown; not compared by ``==`` (two reports of equal counts are equal).
    """

    model: str
    modules: Mapping[str, tuple[str, int]]
    module_params: Mapping[str, ParamStats]
    records: tuple[OpRecord, ...]
    rules: tuple[RuleRecord, ...] = ()
    opaque: tuple[str, ...] = ()
    shape_only: bool = False
    meta: SourceInfo = field(default_factory=SourceInfo)
    communication: tuple[CommRecord, ...] = ()
    logical: tuple[OpRecord, ...] = ()
    replicated: tuple[OpRecord, ...] = ()
    rank: int | None = None
    world_size: int | None = None
    sections: tuple[Section, ...] = field(default=(), compare=False)

    # -- totals -------------------------------------------------------------------------------
    def _scope(self, phase: Phase | str | None, module: str | None) -> Callable[[Located], bool]:
        """Check ``phase`` and ``module`` now; the test that a record ran in that phase (or any,
        ``None``) within that module's subtree (or anywhere, ``None``).

        Raises:
            UsageError: unknown phase or module path.
        """
        ph = as_phase(phase)
        if module is not None and module not in self.modules:
            close = difflib.get_close_matches(module, [p for p in self.modules if p], n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise UsageError(f"the report has no module {module!r}{hint} (the root is '')")

        def inside(r: Located) -> bool:
            return (ph is None or r.phase == ph) and (module is None or is_within(r.module, module))

        return inside

    def _records(self, phase: Phase | str | None, module: str | None) -> Iterator[OpRecord]:
        """The records of one phase (or all) within one module's subtree (or the whole model).

        Raises:
            UsageError: unknown phase or module path (at the call, not on first use).
        """
        inside = self._scope(phase, module)
        return (r for r in self.records if inside(r))

    def total(self, phase: Phase | str | None = None, *, module: str | None = None) -> Cost:
        """Total cost, of one phase or of all (``None``), of the whole report or of one module
        (inclusive: the module and everything below it).

        Raises:
            UsageError: unknown phase or module path.
        """
        return sum_costs(r.cost for r in self._records(phase, module))

    @property
    def macs(self) -> int:
        """Total multiply-accumulates (all phases)."""
        return self.total().macs

    @property
    def flops(self) -> int:
        """Total floating-point operations, including ``2 * macs`` (all phases)."""
        return self.total().flops

    @property
    def model_flops(self) -> int:
        """FLOPs the model needs: every phase except recomputation by activation checkpointing
        (the numerator of MFU)."""
        return self.flops - self.total(Phase.RECOMPUTE).flops

    @property
    def hardware_flops(self) -> int:
        """FLOPs executed, recomputation included (the numerator of HFU); equals :attr:`flops`."""
        return self.flops

    @property
    def bytes_read(self) -> int:
        """Total bytes read by operators (all phases)."""
        return self.total().bytes_read

    @property
    def bytes_written(self) -> int:
        """Total bytes written by operators (all phases)."""
        return self.total().bytes_written

    # -- parameters and phases -------------------------------------------------------------
    @property
    def params(self) -> int:
        """Distinct parameter elements of the model (tied weights once)."""
        root = self.module_params.get("")
        return root.inclusive if root else 0

    @property
    def trainable_params(self) -> int:
        """Distinct parameter elements with ``requires_grad=True``."""
        root = self.module_params.get("")
        return root.trainable if root else 0

    @property
    def frozen_params(self) -> int:
        """Distinct parameter elements with ``requires_grad=False``."""
        root = self.module_params.get("")
        return root.frozen if root else 0

    @property
    def buffers(self) -> int:
        """Distinct buffer elements of the model."""
        root = self.module_params.get("")
        return root.buffers if root else 0

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases that ran, in order."""
        seen = {r.phase for r in self.records}
        return tuple(p for p in Phase if p in seen)

    # -- sharded models: logical work and communication ---------------------------------------
    def logical_total(self, phase: Phase | str | None = None, *, module: str | None = None) -> Cost:
        """The logical (global, unsharded) cost of the computation this rank took part in: every
        operator on DTensors at its global shapes, plain operators as they ran. Equal to
        :meth:`total` when no DTensor operator ran.

        Raises:
            UsageError: unknown phase or module path.
        """
        if not self.logical:
            return self.total(phase, module=module)
        inside = self._scope(phase, module)
        return sum_costs(r.cost for r in self.logical if inside(r))

    def replicated_total(self, phase: Phase | str | None = None) -> Cost:
        """This rank's work on fully replicated DTensors (see ``replicated``): redundant work that
        every rank of the mesh does in full.

        Raises:
            UsageError: unknown phase.
        """
        inside = self._scope(phase, None)
        return sum_costs(r.cost for r in self.replicated if inside(r))

    def communication_by_kind(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[str, CommStats]:
        """Calls, payload bytes and bus bytes per collective kind (sorted by name), of one phase
        or all, of one module's subtree or the whole report.

        Raises:
            UsageError: unknown phase or module path.
        """
        inside = self._scope(phase, module)
        out: dict[str, CommStats] = {}
        for r in self.communication:
            if inside(r):
                out[r.kind] = out.get(r.kind, CommStats()) + CommStats(
                    r.calls, r.payload_bytes, r.bus_bytes)
        return dict(sorted(out.items()))

    def communication_total(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> CommStats:
        """Every collective's calls, payload bytes and bus bytes together (see
        :meth:`communication_by_kind`).

        Raises:
            UsageError: unknown phase or module path.
        """
        total = CommStats()
        for stats in self.communication_by_kind(phase, module=module).values():
            total = total + stats
        return total

    # -- breakdowns ---------------------------------------------------------------------------
    @property
    def uncounted(self) -> dict[str, int]:
        """Operators that ran with no rule (counted as 0 FLOPs), with their call counts."""
        return self.uncounted_in()

    def uncounted_in(self, module: str | None = None) -> dict[str, int]:
        """Operators with no rule that ran in ``module`` or below it (``None``: anywhere).

        Raises:
            UsageError: unknown module path.
        """
        out: dict[str, int] = {}
        for r in self._records(None, module):
            if not r.counted:
                out[r.op] = out.get(r.op, 0) + r.calls
        return dict(sorted(out.items()))

    @property
    def decomposed(self) -> dict[str, int]:
        """Operators with no rule of their own, counted as the sum of their decomposition's pieces
        (see :mod:`flopscope.core.decompose`), with their call counts."""
        out: dict[str, int] = {}
        for r in self.records:
            if r.decomposed:
                out[r.op] = out.get(r.op, 0) + r.calls
        return dict(sorted(out.items()))

    @property
    def shadowed(self) -> dict[str, Cost]:
        """Per ruled module: the operator-level cost its rule replaced."""
        return {r.module: r.shadowed for r in self.rules}

    def rule_mismatches(self) -> tuple[RuleRecord, ...]:
        """Ruled modules whose rule disagrees with the shadowed operator-level count."""
        return tuple(r for r in self.rules if r.differs)

    def by_op(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[str, OpStats]:
        """Calls and cost per operator, most FLOPs first; of one module's subtree if given.

        Raises:
            UsageError: unknown phase or module path.
        """
        acc: dict[str, tuple[int, Cost]] = {}
        for r in self._records(phase, module):
            calls, cost = acc.get(r.op, (0, Cost()))
            acc[r.op] = (calls + r.calls, cost + r.cost)
        items = sorted(acc.items(), key=lambda kv: (-kv[1][1].flops, kv[0]))
        return {op: OpStats(calls, cost) for op, (calls, cost) in items}

    def by_module_and_op(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[tuple[str, str], OpStats]:
        """Calls and cost per (module path, operator), in model order; of one module's subtree
        if given.

        Raises:
            UsageError: unknown phase or module path.
        """
        acc: dict[tuple[str, str], tuple[int, Cost]] = {}
        for r in self._records(phase, module):
            calls, cost = acc.get((r.module, r.op), (0, Cost()))
            acc[(r.module, r.op)] = (calls + r.calls, cost + r.cost)
        order = {p: i for i, p in enumerate(self.modules)}
        keys = sorted(acc, key=lambda k: (order.get(k[0], len(order)), k[0], -acc[k][1].flops, k[1]))
        return {k: OpStats(*acc[k]) for k in keys}

    def by_module(
        self, phase: Phase | str | None = None, *, module: str | None = None
    ) -> dict[str, ModuleStats]:
        """Per module path: calls, parameters, self and inclusive cost, in model order; only
        ``module`` and the modules below it if given.

        Inclusive cost is the module's own cost plus that of every module below it, so the root's
        inclusive cost is the report's total.

        Raises:
            UsageError: unknown phase or module path.
        """
        self._scope(phase, module)  # an unknown phase or module is refused now
        own: dict[str, Cost] = {}
        for r in self._records(phase, None):
            own[r.module] = own.get(r.module, Cost()) + r.cost
        inclusive: dict[str, Cost] = {p: Cost() for p in self.modules}
        for path, cost in own.items():
            parts = path.split(".") if path else []
            for i in range(len(parts) + 1):
                anc = ".".join(parts[:i])
                inclusive[anc] = inclusive.get(anc, Cost()) + cost
        out: dict[str, ModuleStats] = {}
        for path in list(self.modules) + [p for p in inclusive if p not in self.modules]:
            if module is not None and not is_within(path, module):
                continue
            type_name, calls = self.modules.get(path, ("", 0))
            out[path] = ModuleStats(
                path=path,
                type=type_name,
                calls=calls,
                params=self.module_params.get(path, ParamStats()),
                self_cost=own.get(path, Cost()),
                inclusive=inclusive.get(path, Cost()),
            )
        return out

    # -- serialization (the schema: flopscope.report.schema) ---------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a ``schema`` version (see :mod:`flopscope.report.schema`): the
        fields, the sharded views where they exist, and every section's data under its key;
        :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {
            "schema": _report_schema.SCHEMA,
            "model": self.model,
            "shape_only": self.shape_only,
            "meta": self.meta.to_dict(),
            "totals": {
                "params": self.params,
                **self.total().to_dict(),
                **{f"{p.value}": self.total(p).to_dict() for p in self.phases},
            },
            "modules": _report_schema.modules_list(self.modules, self.module_params),
            "records": [_report_schema.op_record_dict(r) for r in self.records],
            "rules": [_report_schema.rule_record_dict(r) for r in self.rules],
            "opaque": list(self.opaque),
            "uncounted": self.uncounted,
        }
        # The keys of a report made under torch.distributed (absent otherwise).
        if self.rank is not None:
            out["rank"] = self.rank
            out["world_size"] = self.world_size
        if self.communication:
            out["communication"] = _report_schema.communication_dict(
                self.communication, self.communication_by_kind(), self.communication_total())
        if self.logical:
            out["logical"] = _report_schema.logical_dict(
                self.logical, self.replicated, self.logical_total(), self.replicated_total())
        for section in self.sections:
            if section.key is not None:
                out[section.key] = section.to_dict()
        return out

    def with_sections(self: _R, *sections: Section) -> _R:
        """This report with more sections (after its own).

        Args:
            sections: what features add (see :mod:`flopscope.report.sections`).

        Returns:
            A new report.
        """
        return dataclasses.replace(self, sections=(*self.sections, *sections))

    def section(self, key: str) -> Section | None:
        """The section with this JSON key, or ``None``."""
        return next((s for s in self.sections if s.key == key), None)

    @classmethod
    def from_dict(cls: type[_R], data: Mapping[str, Any]) -> _R:
        """Rebuild a report from :meth:`to_dict` output.

        Raises:
            UsageError: the data is not a flopscope report of a known schema version.
        """
        return cls(**_report_schema.report_fields(data))

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls: type[_R], text: str) -> _R:
        """Rebuild a report from :meth:`to_json` output.

        Raises:
            UsageError: the text is not JSON or not a flopscope report.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"not a flopscope report: invalid JSON ({e})") from None
        return cls.from_dict(data)

    # -- tabular export (flopscope.report.rows) ---------------------------------------------
    def table_rows(self, by: str = "module") -> list[dict[str, Any]]:
        """The report as flat rows of plain integers and strings (for CSV and pandas).

        Args:
            by: ``"module"`` -- one row per module path (every module, with its ``depth``;
                inclusive ``macs``/``flops``/bytes and the module's own ``self_macs``/``self_flops``);
                or ``"op"`` -- one row per operator (``counted`` is False for operators with no rule).

        Returns:
            A list of dicts with the same keys in every row.

        Raises:
            UsageError: ``by`` is neither ``"module"`` nor ``"op"``.
        """
        if by == "module":
            return _report_table.module_rows(self.by_module())
        if by == "op":
            return _report_table.op_rows(self.by_op(), self.uncounted)
        raise UsageError(f"unknown breakdown {by!r}: use 'module' or 'op'")

    def to_pandas(self, by: str = "module") -> Any:
        """The report as a ``pandas.DataFrame`` (see :meth:`table_rows` for the columns).

        Args:
            by: ``"module"`` or ``"op"``.

        Returns:
            A DataFrame, one row per module or operator, integer columns.

        Raises:
            UsageError: ``by`` is neither ``"module"`` nor ``"op"``.
            ImportError: pandas is not installed.
        """
        return _report_table.data_frame(self.table_rows(by))

    def __repr__(self) -> str:
        return (
            f"Report(model={self.model!r}, params={self.params}, macs={self.macs}, "
            f"flops={self.flops}, uncounted={len(self.uncounted)})"
        )
