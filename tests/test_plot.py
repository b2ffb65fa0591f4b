"""Charts: the file is written, bad arguments are usage errors, missing matplotlib is one
ImportError that says what to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.render.plot import plot_report, require_matplotlib


def _report() -> flopscope.Report:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return flopscope.count(model, torch.randn(2, 8), warn=False)


def test_require_matplotlib_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'flopscope\[plot\]'"):
        require_matplotlib()


def test_plot_png_and_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = plot_report(_report(), tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = plot_report(_report(), tmp_path / "nested" / "c.svg", by="op")
    assert "<svg" in svg.read_text()


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"path": "c.jpg"}, r"\.png, \.svg or \.pdf"),
    ({"by": "layer"}, r"unknown breakdown 'layer'"),
])
def test_plot_bad_arguments(tmp_path: Path, kwargs: dict[str, str], expected: str) -> None:
    path = tmp_path / kwargs.pop("path", "c.png")
    with pytest.raises(UsageError, match=expected):
        plot_report(_report(), path, **kwargs)
