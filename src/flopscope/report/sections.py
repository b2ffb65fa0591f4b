"""What a feature adds to a report: a :class:`Section`.

A roofline estimate, a memory profile, communication per rank, a pipeline's schedule, an expert
routing assumption, utilization (and, next, measured time) are each a section of the report they
belong to: a JSON key and its data, extra columns of the module and operator tables, and lines of
text under the tables. Every writer (table, markdown, JSON) takes every section the same way, so a
new feature adds a section and no writer changes. A section's cells and lines are text: sections
are made by a feature's display module, at the edge, where units are chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Column", "DataSection", "Section"]


@dataclass(frozen=True)
class Column:
    """An extra column of the module and operator tables, computed elsewhere (the roofline
    estimate adds intensity, time and bound): cells by module path and by operator, and the
    total row's cell. A missing cell shows ``-``.

    Attributes:
        header: the column's title.
        by_module: module path -> cell.
        by_op: operator name -> cell.
        total: the total row's cell.
    """

    header: str
    by_module: Mapping[str, str]
    by_op: Mapping[str, str]
    total: str = ""


@runtime_checkable
class Section(Protocol):
    """What a feature adds to a report.

    Attributes:
        key: its key in the report's JSON (``None``: nothing of its own there).
    """

    @property
    def key(self) -> str | None:
        """The JSON key."""

    def to_dict(self) -> Any:
        """Its JSON-ready data (written under :attr:`key`)."""

    def columns(self) -> Sequence[Column]:
        """Extra columns of the module and operator tables."""

    def lines(self) -> Sequence[str]:
        """Lines of text under the tables."""


@dataclass(frozen=True)
class DataSection:
    """A section that is data and text already: what a feature with no section class of its own
    adds (an expert-routing assumption, utilization), and any section read back from a report's
    JSON (its data only: the feature that wrote it may not be loaded).

    Attributes:
        key: its JSON key.
        data: its JSON-ready data.
        text: its lines under the tables.
        table: its extra table columns.
    """

    key: str
    data: Any
    text: tuple[str, ...] = ()
    table: tuple[Column, ...] = ()

    def to_dict(self) -> Any:
        """The data."""
        return self.data

    def columns(self) -> Sequence[Column]:
        """The columns given."""
        return self.table

    def lines(self) -> Sequence[str]:
        """The lines given."""
        return self.text
