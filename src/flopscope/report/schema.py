"""A report's dict/JSON form, schema ``flopscope.report.report/1``: how each kind of record is written,
and how a whole report's fields are read back. :meth:`flopscope.report.data.ReportData.to_dict`
puts the pieces together (its totals and summaries are the report's own queries);
:meth:`~flopscope.report.data.ReportData.from_dict` builds a report from :func:`report_fields`.

Keys are written in one fixed order and only where the report has something to say (a record's
``decomposed`` key only when true, the distributed keys only under ``torch.distributed``), so the
same count always gives the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flopscope.core.params import ParamStats
from flopscope.cost import Cost, Phase
from flopscope.errors import UsageError
from flopscope.report.records import CommRecord, CommStats, OpRecord, RuleRecord
from flopscope.report.sections import DataSection
from flopscope.report.source import SourceInfo

__all__ = [
    "SCHEMA", "communication_dict", "logical_dict", "modules_list", "op_record_dict", "report_fields",
    "rule_record_dict",
]

SCHEMA = "flopscope.report/1"


def modules_list(
    modules: Mapping[str, tuple[str, int]], module_params: Mapping[str, ParamStats]
) -> list[dict[str, Any]]:
    """One entry per module path, in model order: path, class name, calls, parameter counts."""
    return [
        {"path": p, "type": t, "calls": c, "params": module_params.get(p, ParamStats()).to_dict()}
        for p, (t, c) in modules.items()
    ]


def op_record_dict(r: OpRecord, *, decomposed: bool = True) -> dict[str, Any]:
    """One operator record; ``decomposed`` says whether the key is written at all (the logical
    records of a sharded model never carry it)."""
    return {"module": r.module, "op": r.op, "phase": r.phase.value, "calls": r.calls,
            "counted": r.counted, **({"decomposed": True} if decomposed and r.decomposed else {}),
            **r.cost.to_dict()}


def rule_record_dict(r: RuleRecord) -> dict[str, Any]:
    """One module costed by a module rule, with the operator-level cost it shadowed."""
    return {"module": r.module, "rule": r.rule, "calls": r.calls, "cost": r.cost.to_dict(),
            "shadowed": r.shadowed.to_dict(), "macs_only": r.macs_only}


def communication_dict(
    records: Iterable[CommRecord], by_kind: Mapping[str, CommStats], total: CommStats
) -> dict[str, Any]:
    """The ``communication`` object: per kind, all kinds together, and every record."""
    return {
        "kinds": {k: s.to_dict() for k, s in by_kind.items()},
        "total": total.to_dict(),
        "records": [
            {"module": r.module, "phase": r.phase.value, "kind": r.kind,
             "group_size": r.group_size, "group": r.group, "calls": r.calls,
             "payload_bytes": r.payload_bytes, "bus_bytes": r.bus_bytes}
            for r in records
        ],
    }


def logical_dict(
    logical: Iterable[OpRecord], replicated: Iterable[OpRecord], logical_total: Cost,
    replicated_total: Cost,
) -> dict[str, Any]:
    """The ``logical`` object of a report made under DTensor: totals and both record lists."""
    return {
        "totals": logical_total.to_dict(),
        "replicated": replicated_total.to_dict(),
        "records": [op_record_dict(r, decomposed=False) for r in logical],
        "replicated_records": [op_record_dict(r, decomposed=False) for r in replicated],
    }


def _cost(d: Mapping[str, Any]) -> Cost:
    return Cost(int(d["macs"]), int(d["flops"]), int(d["bytes_read"]), int(d["bytes_written"]))


def _op_record(r: Mapping[str, Any], *, decomposed: bool = True) -> OpRecord:
    return OpRecord(r["module"], r["op"], Phase(r["phase"]), int(r["calls"]), _cost(r),
                    bool(r["counted"]), decomposed and bool(r.get("decomposed", False)))


# the keys a report's own fields are written under (every other key is a section's)
_FIELDS = frozenset({"schema", "model", "shape_only", "meta", "totals", "modules", "records",
                     "rules", "opaque", "uncounted", "rank", "world_size", "communication",
                     "logical"})


def report_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a :class:`~flopscope.report.data.ReportData`, by name, read from its dict form.

    Args:
        data: what ``Report.to_dict()`` wrote (or the parsed JSON of ``Report.to_json()``).

    Returns:
        Keyword arguments for the ``Report`` constructor.

    Raises:
        UsageError: the data is not a flopscope report of a known schema version, or is
            malformed (a key missing, a value of the wrong type).
    """
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
        raise UsageError(f"not a flopscope report: expected schema {SCHEMA!r}, found {found!r}")
    try:
        logical = data.get("logical", {})
        return {
            "model": str(data["model"]),
            "modules": {m["path"]: (m["type"], int(m["calls"])) for m in data["modules"]},
            "module_params": {m["path"]: ParamStats(**m["params"]) for m in data["modules"]},
            "records": tuple(_op_record(r) for r in data["records"]),
            "rules": tuple(
                RuleRecord(r["module"], r["rule"], int(r["calls"]), _cost(r["cost"]),
                           _cost(r["shadowed"]), bool(r.get("macs_only", False)))
                for r in data["rules"]
            ),
            "opaque": tuple(data["opaque"]),
            "shape_only": bool(data["shape_only"]),
            "meta": SourceInfo.from_dict(data.get("meta", {})),
            "communication": tuple(
                CommRecord(r["module"], Phase(r["phase"]), r["kind"], int(r["group_size"]),
                           int(r["calls"]), int(r["payload_bytes"]), int(r["bus_bytes"]),
                           str(r.get("group", "")))
                for r in data.get("communication", {}).get("records", ())
            ),
            "logical": tuple(_op_record(r, decomposed=False) for r in logical.get("records", ())),
            "replicated": tuple(
                _op_record(r, decomposed=False) for r in logical.get("replicated_records", ())
            ),
            "rank": int(data["rank"]) if data.get("rank") is not None else None,
            "world_size": int(data["world_size"]) if data.get("world_size") is not None else None,
            # what features added (estimate, memory, ...): kept as data, in the order written
            "sections": tuple(DataSection(k, v) for k, v in data.items() if k not in _FIELDS),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"malformed flopscope report ({type(e).__name__}: {e})") from None
