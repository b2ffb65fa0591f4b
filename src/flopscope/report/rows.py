"""A report as flat rows of plain integers and strings, for CSV and pandas
(:meth:`flopscope.report.report.Report.table_rows` and :meth:`~flopscope.report.report.Report.to_pandas`):
one row per module, or one per operator, the same keys in every row."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from flopscope.report.records import ModuleStats, OpStats

__all__ = ["data_frame", "module_rows", "op_rows"]


def module_rows(by_module: Mapping[str, ModuleStats]) -> list[dict[str, Any]]:
    """One row per module path, in the order given: its ``depth`` (0 for the root), inclusive
    ``macs``/``flops``/bytes and the module's own ``self_macs``/``self_flops``."""
    return [
        {
            "module": path,
            "type": s.type,
            "depth": 0 if path == "" else path.count(".") + 1,
            "calls": s.calls,
            "params": s.params.inclusive,
            "params_own": s.params.own,
            "macs": s.inclusive.macs,
            "flops": s.inclusive.flops,
            "bytes_read": s.inclusive.bytes_read,
            "bytes_written": s.inclusive.bytes_written,
            "self_macs": s.self_cost.macs,
            "self_flops": s.self_cost.flops,
        }
        for path, s in by_module.items()
    ]


def op_rows(by_op: Mapping[str, OpStats], uncounted: Container[str]) -> list[dict[str, Any]]:
    """One row per operator, in the order given; ``counted`` is False for operators in
    ``uncounted`` (no rule)."""
    return [
        {
            "op": op,
            "calls": s.calls,
            "macs": s.cost.macs,
            "flops": s.cost.flops,
            "bytes_read": s.cost.bytes_read,
            "bytes_written": s.cost.bytes_written,
            "counted": op not in uncounted,
        }
        for op, s in by_op.items()
    ]


def data_frame(rows: list[dict[str, Any]]) -> Any:
    """``rows`` as a ``pandas.DataFrame`` (columns in the rows' key order).

    Raises:
        ImportError: pandas is not installed.
    """
    try:
        import pandas as pd  # type: ignore[import-untyped]
    except ImportError:
        raise ImportError(
            "Report.to_pandas() needs pandas, which is not installed: pip install pandas"
        ) from None
    return pd.DataFrame(rows, columns=list(rows[0]) if rows else None)
