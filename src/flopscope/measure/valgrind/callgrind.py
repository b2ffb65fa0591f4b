"""The one reader of callgrind output files.

The files are written with ``--dump-instr=yes --dump-line=no --compress-pos=no
--compress-strings=no`` and the single event ``Ir``: each cost line is ``ADDRESS COUNT`` under the
``ob=`` (object file) it belongs to.  The parent reads every dump; the child reads only the
addresses of code without a file (``ob=???``) to capture their bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

from flopscope.errors import MeasureError

__all__ = ["NO_FILE", "CallgrindDump", "dump_files", "parse_callgrind"]

NO_FILE = "???"
"""Callgrind's object name for code that has no file behind it (generated at run time)."""

_TRIGGER = "desc: Trigger: Client Request: "


@dataclass
class CallgrindDump:
    """One callgrind output file.

    Attributes:
        label: the client-request label that triggered the dump (``""`` for the final dump).
        part: the dump's part number (order within the run).
        counts: executions per ``(object, address)``; ``"???"`` is code without a file.
    """

    label: str
    part: int
    counts: dict[tuple[str, int], int]


def parse_callgrind(path: Path, objects: Container[str] | None = None) -> CallgrindDump:
    """Parse one callgrind file.

    A ``calls=`` line is followed by a line carrying the *inclusive* cost of that call, which is
    skipped: self costs alone add up to the executed instructions.

    Args:
        path: the file.
        objects: if given, keep only the counts of these object names (e.g. ``{"???"}``).

    Returns:
        The parsed dump.

    Raises:
        MeasureError: if the file is not in the expected format.
    """
    label = ""
    part = 0
    counts: dict[tuple[str, int], int] = defaultdict(int)
    ob = ""
    keep = objects is None
    skip = False
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if skip:
                skip = False
                continue
            c = line[:1]
            if c == "0":
                if keep:
                    fields = line.split()
                    if len(fields) >= 2:
                        counts[(ob, int(fields[0], 16))] += int(fields[1])
            elif line.startswith("ob="):
                ob = line[3:].strip()
                keep = objects is None or ob in objects
            elif line.startswith("calls="):
                skip = True
            elif line.startswith(_TRIGGER):
                label = line[len(_TRIGGER) :].rstrip("\n")
            elif line.startswith("part:"):
                part = int(line.split(":", 1)[1])
            elif line.startswith("positions:") and line.split(":", 1)[1].split() != ["instr"]:
                raise MeasureError(f"{path}: unexpected callgrind positions line {line.strip()!r}")
            elif c in "+-*":
                raise MeasureError(f"{path}: compressed positions are not supported")
    return CallgrindDump(label, part, dict(counts))


def dump_files(out_dir: Path, pid: int) -> list[Path]:
    """The callgrind files one process wrote, in order.

    Args:
        out_dir: the directory given to ``--callgrind-out-file``.
        pid: the process id.

    Returns:
        The files, sorted by part number.
    """

    def part(p: Path) -> int:
        tail = p.name.rsplit(".", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    return sorted(out_dir.glob(f"callgrind.out.{pid}.*"), key=part)
