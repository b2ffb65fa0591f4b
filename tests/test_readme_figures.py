"""README's figures are what the code prints: scripts/readme_figures.py makes them again (the tour
runs README's own code; the table is what ``flopscope zoo torchvision`` counts) and README.md must
not differ."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_figures_are_what_the_code_prints(recwarn: pytest.WarningsRecorder) -> None:
    pytest.importorskip("torchvision")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    made = _script().rewrite(text)
    assert made == text, "README.md's figures are stale: run python scripts/readme_figures.py"
    # the tour counts an eval-mode model: no training-mode warning
    assert not [w for w in recwarn if "training mode" in str(w.message)]


def test_the_script_rewrites_a_stale_figure() -> None:
    pytest.importorskip("torchvision")
    stale = ("<!-- readme_figures: tour -->\n```python\nx = 6 * 7\nx  # 41   (the answer)\n```\n"
             "<!-- /readme_figures -->\n<!-- readme_figures: table -->\n| old |\n"
             "<!-- /readme_figures -->\n")
    made = _script().rewrite(stale)
    assert "x  # 42   (the answer)\n" in made
    # the table is the zoo's rows: resnet50 is 25.56 M parameters, 4.089 GMAC, 8.218 GFLOP
    assert "| `resnet50` | 1x3x224x224 | 25.56 | 4.089 | 8.218 | 4.089 |" in made
    assert "| old |" not in made
