"""No merge-conflict markers left in the repository's text: a conflict in a Python file fails to
import, but one in the docs or the changelog does not (a merged CHANGELOG.md once kept both
sides between markers)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^(<{7}|>{7}) ", re.M)
SUFFIXES = (".md", ".py", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".sh", ".js", ".css", ".html")


def _text_files() -> list[Path]:
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "build",
                                                                         "dist", "__pycache__")
                   and not d.endswith(".egg-info")]
        found += [Path(top, f) for f in files if f.endswith(SUFFIXES)]
    return found


def test_no_merge_markers() -> None:
    found = [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
             for p in _text_files()
             for text in [p.read_text(errors="replace")]
             for m in MARKER.finditer(text)]
    assert not found, f"merge-conflict markers left in: {', '.join(found)}"


def test_the_check_finds_a_conflict() -> None:
    conflict = "text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n"
    assert [m.group(1) for m in MARKER.finditer(conflict)] == ["<" * 7, ">" * 7]
    assert MARKER.search("a > b\n>>> a doctest prompt\n") is None
