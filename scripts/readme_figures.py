"""Write README.md's figures from the code that prints them: ``python scripts/readme_figures.py``
(``--check``: exit 1, writing nothing, when README.md disagrees; tests/test_readme_figures.py runs
that check).

Two regions of README.md are generated, each between ``<!-- readme_figures: NAME -->`` and
``<!-- /readme_figures -->``:

- ``tour``: the short tour's code block. Its code is README's own: the script runs it line by
  line, and every line of the form ``EXPRESSION  # FIGURE  (note)`` gets ``FIGURE`` replaced by
  the value of ``EXPRESSION`` (the rest of each line, and every other line, stays as written).
- ``table``: the model table, from the rows ``flopscope zoo torchvision`` counts
  (:func:`flopscope.zoo.count_model`: shape-only, eval mode, batch 1) in the zoo's Markdown form
  (:func:`flopscope.cli.zoo.zoo_table`), without its timing column.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"

TABLE_MODELS = ("resnet50", "convnext_tiny", "swin_t", "vit_b_16")
"""The models of README's table."""

_REGION = re.compile(r"(<!-- readme_figures: (\w+) -->\n)(.*?)(<!-- /readme_figures -->)", re.S)
# a shown figure: code, two or more spaces, "# ", a number (digits, commas, a point), the rest
_FIGURE = re.compile(r"^(?P<code>\S.*?)(?P<gap>\s{2,}# )(?P<value>-?[\d,]+(?:\.\d+)?)(?P<rest>.*)$")


def tour(block: str) -> str:
    """Run the tour's code and put each shown figure's value in its comment.

    Args:
        block: the region's text: a fenced ``python`` code block.

    Returns:
        The block with its figures as the code computes them now.
    """
    namespace: dict[str, Any] = {}
    out = []
    for line in block.splitlines(keepends=True):
        found = _FIGURE.match(line.rstrip("\n"))
        if line.startswith("```"):
            out.append(line)
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # print(report) is part of the tour
            if found:
                value = eval(found["code"], namespace)  # noqa: S307  (README's own code)
                line = f"{found['code']}{found['gap']}{value}{found['rest']}\n"
            elif line.strip():
                exec(line, namespace)  # noqa: S102  (README's own code)
        out.append(line)
    return "".join(out)


def table(_: str) -> str:
    """The model table, as ``flopscope zoo torchvision --format markdown`` writes its rows.

    Returns:
        The Markdown table.
    """
    from flopscope.cli.zoo import zoo_table
    from flopscope.zoo import count_model

    rows = [count_model("torchvision", name) for name in TABLE_MODELS]
    failed = [r for r in rows if r.error is not None]
    if failed:
        raise RuntimeError(f"counting {failed[0].model} failed: {failed[0].error}")
    return zoo_table(rows, "markdown", "torchvision", times=False)


_MAKERS = {"tour": tour, "table": table}


def rewrite(text: str) -> str:
    """README's text with every generated region made again.

    Args:
        text: README.md's text.

    Returns:
        The text with its regions as the code makes them now.

    Raises:
        ValueError: a region names no known maker, or a maker is never used.
    """
    used = set()

    def make(found: re.Match[str]) -> str:
        name = found[2]
        if name not in _MAKERS:
            raise ValueError(f"README.md has a region {name!r}: known are {', '.join(_MAKERS)}")
        used.add(name)
        return found[1] + _MAKERS[name](found[3]) + found[4]

    new = _REGION.sub(make, text)
    if used != set(_MAKERS):
        raise ValueError(f"README.md lacks the regions {', '.join(sorted(set(_MAKERS) - used))}")
    return new


def main(argv: list[str] | None = None) -> int:
    """Rewrite README.md, or with ``--check`` say whether it is up to date.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0, or 1 when ``--check`` finds README.md out of date.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when README.md disagrees with the code")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = rewrite(text)
    if args.check:
        if new != text:
            print("README.md's figures differ from what the code prints: run "
                  "python scripts/readme_figures.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
