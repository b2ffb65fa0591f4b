"""Rendering (the edge): text, markdown, JSON and CSV of a report; the golden files of the
command line cover the full layouts (tests/golden)."""

from __future__ import annotations

import csv
import io
import json

import torch
from torch import nn

import flopscope
from flopscope.render import RenderOptions, render
from flopscope.render.data import render_csv, render_json
from flopscope.render.markdown import render_markdown
from flopscope.render.text import render_text
from flopscope.report.sections import Column, DataSection


def _training_report() -> flopscope.Report:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with flopscope.Counter(model) as c:
        model(torch.randn(3, 8)).sum().backward()
        opt.step()
    return c.report


def test_text_names_every_phase_that_ran() -> None:
    text = render_text(_training_report())
    assert "forward + backward + optimizer" in text
    assert "optimizer:" in text  # the per-phase line


def test_forward_only_headline_names_no_phase() -> None:
    r = flopscope.count(nn.Linear(4, 2), torch.randn(1, 4))
    assert "forward" not in render_text(r).splitlines()[0]


def test_markdown_has_the_module_table() -> None:
    r = flopscope.count(nn.Sequential(nn.Linear(4, 2)), torch.randn(1, 4))
    md = render_markdown(r)
    assert md.splitlines()[0] == "### Sequential"
    # 4 x 2 = 8 MACs; 2 x 8 + 2 bias adds = 18 FLOPs; bytes: x 16 + W 32 + b 8 read, out 8 written
    assert "| `0` | Linear | 10 | 8 | 18 | 64 B | 100.0% | 1 |" in md
    assert "| `aten.addmm.default` | 1 | 8 | 18 | 64 B | 100.0% |" in md
    assert md.endswith("\n")


def test_json_is_the_report_dict() -> None:
    r = flopscope.count(nn.Linear(4, 2), torch.randn(1, 4))
    assert json.loads(render_json(r)) == json.loads(r.to_json())


def test_csv_rows_match_the_report() -> None:
    r = flopscope.count(nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 1)), torch.randn(1, 4))
    rows = list(csv.DictReader(io.StringIO(render_csv(r))))
    by_path = {row["module"]: row for row in rows}
    # 4 x 2 = 8 MACs and 2 x 1 = 2 MACs, plus a bias add per output element: 2 x 8 + 2, 2 x 2 + 1
    assert (int(by_path["0"]["macs"]), int(by_path["0"]["flops"])) == (8, 18)
    assert (int(by_path["1"]["macs"]), int(by_path["1"]["flops"])) == (2, 5)
    assert int(by_path[""]["macs"]) == r.macs == 10


def test_a_section_is_drawn_by_every_writer_without_render_knowing_it() -> None:
    r = flopscope.count(nn.Sequential(nn.Linear(4, 2)), torch.randn(1, 4))
    column = Column("answer", by_module={"0": "42"}, by_op={}, total="42!")
    r = r.with_sections(DataSection("answer", {"value": 42}, ("the answer is 42",), (column,)))
    text = render_text(r)
    assert "answer" in text and "42!" in text
    assert text.endswith("\nthe answer is 42\n")
    md = render_markdown(r)
    assert "| answer |" in md.splitlines()[4] and md.endswith("\n- the answer is 42\n")
    data = json.loads(render(r, format="json"))
    assert data["answer"] == {"value": 42}
    assert render(r, RenderOptions(format="table")) == text


def test_sections_survive_a_json_round_trip_as_data() -> None:
    r = flopscope.count(nn.Linear(4, 2), torch.randn(1, 4))
    r = r.with_sections(DataSection("answer", {"value": 42}, ("a line",)))
    back = flopscope.Report.from_json(r.to_json())
    assert back == r  # sections are not compared; the counts are
    assert back.section("answer") is not None and back.section("answer").to_dict() == {"value": 42}
    assert back.to_json() == r.to_json()


def test_a_report_prints_as_its_table_from_any_import_path() -> None:
    """Nothing has to be imported first for a report to print (no display registry): in a fresh
    interpreter that imports only flopscope.run, str(report) is the table, not a repr."""
    import subprocess
    import sys

    code = ("import torch; from flopscope.run import count; "
            "print(count(torch.nn.Linear(4, 2), torch.randn(1, 4)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == "Linear"
    assert "total" in out.stdout and "Report(" not in out.stdout
