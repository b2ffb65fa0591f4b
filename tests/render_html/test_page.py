"""The HTML page (``--format html``, ``Report.to_html``): its embedded data is the report's JSON,
it asks the network for nothing, and it is small and quick enough for big models."""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.cli.conftest import TINY, Result
from tests.render_html.conftest import TINY_FULL, count_both
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.render import render
from flopscope.render.html import embedded_data, page
from flopscope.report.report import Report


def _report() -> Report:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    return flopscope.count(model, torch.ones(2, 4), warn=False)


def test_cli_page_holds_the_json_of_the_same_count(tmp_path: Path) -> None:
    # --hardware and --memory add the estimate and memory sections: the page carries them too
    page_text, data = count_both(tmp_path, *TINY_FULL)
    embedded = embedded_data(page_text)
    assert embedded == data
    assert {"estimate", "memory"} <= set(embedded)
    assert page_text.startswith("<!DOCTYPE html>")


def test_render_and_to_html_embed_to_dict() -> None:
    report = _report()
    for text in (render(report, format="html"), report.to_html()):
        data = embedded_data(text)
        assert data == report.to_dict()
        assert Report.from_dict(data) == report
    # Linear(4, 3) on 2 rows: 2*4*3 = 24 MACs; Linear(3, 2): 2*3*2 = 12; 36 in all
    assert embedded_data(report.to_html())["totals"]["macs"] == 36


def test_page_asks_the_network_for_nothing() -> None:
    text = _report().to_html()
    lowered = text.lower()
    for marker in ("<script src", "<link", "<img", "<iframe", "@import", "url(", "fetch(",
                   "xmlhttprequest", "websocket", "import(", "<object", "<embed"):
        assert marker not in lowered, marker
    # the one URL in the page is SVG's namespace name, which is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) <= {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in text  # and the page's policy forbids any connection


def test_data_cannot_close_the_script_element() -> None:
    hostile = "</script><script>alert(1)</script><!--"
    report = dataclasses.replace(_report(), model=hostile)
    text = report.to_html()
    assert hostile not in text
    assert embedded_data(text)["model"] == hostile


def test_jupyter_shows_the_page_in_a_frame() -> None:
    report = _report()
    frame = report._repr_html_()
    m = re.fullmatch(r'<iframe srcdoc="(?P<doc>[^"]*)"[^>]*></iframe>', frame)
    assert m is not None
    assert embedded_data(html.unescape(m.group("doc"))) == report.to_dict()


def test_format_html_refuses_a_terminal(cli: Callable[..., Result],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    r = cli("count", f"{TINY}:tiny", "--format", "html")
    assert r.code == 2
    assert "--format html writes a web page: give --output FILE.html" in r.err
    assert r.out == ""


def test_format_html_to_a_pipe(cli: Callable[..., Result]) -> None:
    r = cli("count", f"{TINY}:tiny", "--format", "html")  # capsys: stdout is not a terminal
    assert r.code == 0
    assert r.out.startswith("<!DOCTYPE html>")
    assert embedded_data(r.out)["model"] == "Tiny"


def test_bad_kind_and_not_a_page() -> None:
    with pytest.raises(UsageError, match="unknown page kind 'pie'"):
        page("pie", {}, title="x")
    with pytest.raises(UsageError, match="not a flopscope HTML page"):
        embedded_data("<html></html>")


def test_resnet50_page_is_under_2_mb(tmp_path: Path) -> None:
    page_text, _ = count_both(tmp_path, "torchvision:resnet50", "--shape-only", "--hardware",
                              "h100-sxm", "--memory")
    size = len(page_text.encode("utf-8"))
    assert size < 2 * 1024 * 1024, size
