"""A report in a real Jupyter notebook: a notebook that displays a report is executed by a real
kernel (nbclient, ipykernel), and the HTML it outputs is loaded in Debian's headless Chromium,
as a notebook's output area shows it. Browser tier: skipped without chromium, nbclient or
ipykernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from benchmarks.html_render import Chromium, chromium_path
from torch import nn

import flopscope

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(chromium_path() is None, reason="no chromium installed")]

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

# the notebook's one cell: count a small model and leave the report as the cell's value
CELL = """\
import sys
sys.path.insert(0, {src!r})  # this checkout's flopscope, whatever the kernel's path holds
import torch
from torch import nn
import flopscope
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
report = flopscope.count(model, torch.ones(2, 4), warn=False)
report"""


def test_a_notebook_shows_the_report_page(tmp_path: Path) -> None:
    src = str(Path(flopscope.__file__).resolve().parents[1])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL.format(src=src))]
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    [result] = [o for o in nb.cells[0].outputs if o["output_type"] == "execute_result"]
    # the rich display for the notebook, the plain text for a terminal
    assert result["data"]["text/html"].startswith("<iframe srcdoc=")
    assert "text/plain" in result["data"]
    # the output area: the cell's HTML in a page of its own, loaded with the network off
    page = tmp_path / "notebook_output.html"
    page.write_text("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body>"
                    f"<div class=\"output_html\">{result['data']['text/html']}</div>"
                    "</body></html>\n", encoding="utf-8")
    # what the same count gives here: Linear(4, 3) on 2 rows is 2*4*3 = 24 MACs, Linear(3, 2)
    # 2*3*2 = 12: 36 in all
    totals = flopscope.count(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)),
                             torch.ones(2, 4), warn=False).to_dict()["totals"]
    assert totals["macs"] == 36
    with Chromium() as browser:
        browser.open(page)
        assert browser.errors() == []
        assert browser.requests() == [page.resolve().as_uri()]
        frame = "document.querySelector('.output_html iframe')"
        assert browser.evaluate(f"{frame}.getBoundingClientRect().height") == 902  # 900 + border
        inside = f"{frame}.contentDocument"
        assert browser.evaluate(f"{inside}.getElementById('flopscope').dataset.ready") == "1"
        for key in ("params", "macs", "flops"):
            value = browser.evaluate(
                f"{inside}.querySelector('.total[data-key=\"{key}\"]').dataset.value")
            assert int(value) == totals[key]
        # the page inside the frame is the whole page: its icicle too
        assert int(browser.evaluate(
            f"{inside}.querySelector('#icicle g.node[data-path=\"\"]').dataset.value")
        ) == totals["flops"]
