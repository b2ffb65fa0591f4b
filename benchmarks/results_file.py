"""A results file that keeps every run: ``{"runs": [...]}``, each new run appended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["append_run"]


def append_run(path: Path, run: dict[str, Any]) -> None:
    """Append ``run`` to the runs kept in ``path`` (a new file holds only it)."""
    previous = json.loads(path.read_text()) if path.exists() else {"runs": []}
    previous["runs"].append(run)
    path.write_text(json.dumps(previous, indent=1) + "\n")
