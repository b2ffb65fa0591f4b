"""What a count returns: the immutable :class:`Report`, its records, where the model came from,
its versioned dict/JSON form, flat rows, the comparison of two reports and the symbolic report.

This package's ``__init__`` is the public face (``from flopscope.report import Report,
OpRecord``); code inside flopscope imports each name from the module that defines it.
"""

from flopscope.report.records import (
    CommRecord,
    CommStats,
    ModuleStats,
    OpRecord,
    OpStats,
    RuleRecord,
)
from flopscope.report.report import Report
from flopscope.report.schema import SCHEMA
from flopscope.report.source import SourceInfo

__all__ = [
    "SCHEMA", "CommRecord", "CommStats", "ModuleStats", "OpRecord", "OpStats", "Report", "RuleRecord",
    "SourceInfo",
]
