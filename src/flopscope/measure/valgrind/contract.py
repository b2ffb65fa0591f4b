"""What the valgrind parent and its child process tell each other (plain JSON files).

The parent writes a :class:`ChildRequest` to ``request.json`` in the run directory and starts
``valgrind ... python -m flopscope.measure.valgrind._child DIR``; the child builds the workload
once, measures its region and writes a :class:`ChildResult` to ``result.json``, plus the captured
bytes of run-time generated code.  Callgrind's own dumps are labelled with :data:`SETUP_LABEL`
and :data:`SEGMENT_PREFIX` + module path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flopscope.errors import MeasureError
from flopscope.measure.workload import WorkloadSpec

__all__ = [
    "CAPTURE_FILE",
    "REQUEST_FILE",
    "RESULT_FILE",
    "SEGMENT_PREFIX",
    "SETUP_LABEL",
    "ChildRequest",
    "ChildResult",
]

SETUP_LABEL = "flopscope:setup"
SEGMENT_PREFIX = "flopscope:seg:"
REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
CAPTURE_FILE = "captured_code.bin"


@dataclass(frozen=True)
class ChildRequest:
    """What the child is asked to do.

    Attributes:
        out_dir: the run directory (callgrind files, capture, result).
        workload: how to build the workload.
        threads: torch intra-op threads.
        warmup: unmeasured runs of the region before the measured one.
        segment_depth: module depth of the per-module dumps; 0 = no per-module dumps.
    """

    out_dir: str
    workload: WorkloadSpec
    threads: int = 1
    warmup: int = 1
    segment_depth: int = 1

    def write(self) -> Path:
        """Write ``request.json`` into ``out_dir``.

        Returns:
            The file written.
        """
        path = Path(self.out_dir) / REQUEST_FILE
        data = {**asdict(self), "workload": self.workload.to_json()}
        path.write_text(json.dumps(data))
        return path

    @classmethod
    def read(cls, path: Path) -> ChildRequest:
        """Read a request written by :meth:`write`.

        Args:
            path: the file.

        Returns:
            The request.
        """
        data = json.loads(path.read_text())
        return cls(
            out_dir=str(data["out_dir"]),
            workload=WorkloadSpec.from_json(data["workload"]),
            threads=int(data["threads"]),
            warmup=int(data["warmup"]),
            segment_depth=int(data["segment_depth"]),
        )


@dataclass(frozen=True)
class ChildResult:
    """What the child reports back.

    Attributes:
        pid: the child's process id (names its callgrind files).
        valgrind_layers: how many valgrind layers it ran under (0 = client requests did nothing).
        region_seconds: wall time of the measured region (slowed down by valgrind).
        captured_bytes: bytes of run-time generated code captured.
        torch_version: ``torch.__version__`` in the child.
        threads: torch intra-op threads in the child.
        report: the workload's flopscope count (``Report.to_dict()``), if it made one.
        error: set instead of the above when the workload could not be built or run:
            ``{"type": exception class name, "message": ..., "usage": true for a usage error}``.
    """

    pid: int
    valgrind_layers: int = 0
    region_seconds: float = 0.0
    captured_bytes: int = 0
    torch_version: str = ""
    threads: int = 1
    report: Mapping[str, Any] | None = None
    error: Mapping[str, Any] | None = None

    def write(self, out_dir: Path) -> None:
        """Write ``result.json`` into ``out_dir``.

        Args:
            out_dir: the run directory.
        """
        (out_dir / RESULT_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, out_dir: Path) -> ChildResult:
        """Read the result the child wrote.

        Args:
            out_dir: the run directory.

        Returns:
            The result.

        Raises:
            MeasureError: the file is missing or malformed.
        """
        try:
            data = json.loads((out_dir / RESULT_FILE).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise MeasureError(f"cannot read the child's result in {out_dir}: {exc}") from None
