"""Write docs/conventions.md from the rules' docstrings: ``python scripts/gen_conventions.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from flopscope.rules import conventions_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "conventions.md"


def main() -> int:
    DOC.write_text(conventions_markdown(), encoding="utf-8")
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
