"""docs/conventions.md is generated from the rules and must be up to date."""

from __future__ import annotations

from pathlib import Path

from flopscope.rules import conventions, conventions_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "conventions.md"


def test_committed_conventions_doc_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == conventions_markdown(), (
        "docs/conventions.md is stale: run `python scripts/gen_conventions.py`"
    )


def test_every_rule_is_in_the_doc() -> None:
    text = conventions_markdown()
    for row in conventions():
        assert f"`{row.ops[0]}`" in text
    for heading in ("## Units", "## Relation to other tools", "FlopCounterMode", "2 * MACs",
                    "still move memory", "move\n  0 bytes", "thop and fvcore"):
        assert heading in text
