"""How a report is rendered: one options object, enums for the choices (torchinfo's formatting
options are the model: one object instead of strings passed down through every call)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["By", "Format", "RenderOptions"]


class By(str, Enum):
    """What the main table lists."""

    MODULE = "module"
    OP = "op"


class Format(str, Enum):
    """Output formats of :func:`render`."""

    TABLE = "table"
    MARKDOWN = "markdown"
    JSON = "json"
    CSV = "csv"
    HTML = "html"


@dataclass(frozen=True)
class RenderOptions:
    """What a rendering shows and how.

    Attributes:
        format: table, markdown, json, csv or html.
        depth: levels of the module tree below the root (table, markdown).
        by: the module tree or every operator (table, markdown, csv).
        unit: a fixed SI prefix for MACs and FLOPs (``"G"``), or ``None`` for automatic.
        width: the console width of a table; ``None``: 120, wider by 14 per extra column.
        top_ops: operators listed under the module tree.
    """

    format: Format = Format.TABLE
    depth: int = 2
    by: By = By.MODULE
    unit: str | None = None
    width: int | None = None
    top_ops: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", Format(self.format))
        object.__setattr__(self, "by", By(self.by))
