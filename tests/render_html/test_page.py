"""The HTML page (``--format html``, ``Report.to_html``): its embedded data is the report's JSON,
it asks the network for nothing, and it is small and quick enough for big models."""

from __future__ import annotations

import dataclasses
import fnmatch
import html
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch
from tests.cli.conftest import TINY, Result
from tests.render_html.conftest import GENERATE, PLAN, TINY_FULL, attention_symbolic, count_both
from torch import nn

import flopscope
import flopscope.render.html
from flopscope.cli import main
from flopscope.errors import UsageError
from flopscope.render import render
from flopscope.render.html import embedded_data, page
from flopscope.report.report import Report
from flopscope.symbolic import count_symbolic


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


def test_diff_page_holds_both_reports(tmp_path: Path, cli: Callable[..., Result]) -> None:
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "d.html"
    assert cli("count", f"{TINY}:tiny", "--format", "json", "--output", str(a)).code == 0
    assert cli("count", f"{TINY}:tiny_wider", "--format", "json", "--output", str(b)).code == 0
    r = cli("diff", str(a), str(b), "--format", "html", "--output", str(out))
    assert r.code == 1  # the head changed: the verdict (exit 1 beyond tolerance) still holds
    assert "FAIL: 2 module(s) differ" in r.err and r.out == ""
    data = embedded_data(out.read_text(encoding="utf-8"))
    assert data == {"a": json.loads(a.read_text()), "b": json.loads(b.read_text()),
                    "names": [str(a), str(b)]}


def test_zoo_page_is_a_table(tmp_path: Path, cli: Callable[..., Result]) -> None:
    out = tmp_path / "z.html"
    r = cli("zoo", "torchvision", "--models", "alexnet", "--format", "html", "--output", str(out))
    assert r.code == 0
    data = embedded_data(out.read_text(encoding="utf-8"))
    assert data["columns"][:5] == ["model", "input", "params", "macs", "flops"]
    [row] = data["rows"]
    # alexnet at 1x3x224x224: torchvision publishes 0.714 GFLOPS (MACs); params 61,100,840
    assert (row["model"], row["input"], row["params"]) == ("alexnet", "1x3x224x224", 61100840)
    assert row["reference_gmacs"] == 0.714 and row["error"] is None


def test_symbolic_page_holds_formulas_and_curves(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    sym = count_symbolic(model, torch.ones(2, 4), symbolic={"batch": [(0, 0)]})
    data = embedded_data(sym.to_html())
    curves = data.pop("curves")
    assert data.pop("derived") == {}  # no seq_len: no per-token figures
    assert data == json.loads(json.dumps(sym.to_dict()))
    # FLOPs, MACs and bytes of the whole model and of each module under the root with a cost
    # (the Linear '0' and the ReLU '1')
    assert [(c["symbol"], c["field"], c["module"]) for c in curves] == [
        ("batch", f, m) for f in ("flops", "macs", "bytes") for m in ("", "0", "1")]
    for curve in curves:
        assert curve["fixed"] == {} and "split" not in curve
        assert curve["points"][-1][0] == 32 * sym.hints["batch"]
        # every point is the formula at that size: what a concrete count there gives
        for x, value in curve["points"]:
            cost = sym.evaluate(batch=x).by_module()[curve["module"]].inclusive
            assert value == getattr(cost, curve["field"])


def test_symbolic_page_has_the_per_token_figures() -> None:
    sym = attention_symbolic()
    # FLOPs = 32*b*s^2 (two b x s x s x 8 products) + 136*b*s (the 8x8 projection: 2*64 per
    # row, and its bias: 8): one more token costs d/ds / b = 64*s + 136; attention's terms catch
    # up with the rest where 32*s^2 >= 136*s (b = 1): s = 5
    assert str(sym.total().flops) == "32*batch*seq_len**2 + 136*batch*seq_len"
    data = embedded_data(sym.to_html())
    derived = data["derived"]
    assert derived["per_token"]["formula"] == "64*seq_len + 136"
    assert derived["per_token"]["at_hints"] == 64 * 16 + 136  # traced at seq_len 16
    assert derived["crossover"] == {"symbol": "seq_len", "field": "flops", "fixed": {"batch": 1},
                                    "at": 5}
    [total] = [c for c in data["curves"]
               if (c["symbol"], c["field"], c["module"]) == ("seq_len", "flops", "")]
    assert total["fixed"] == {"batch": 2}
    # the total split: attention's terms and the rest add up to it at every size
    for (x, value), (_, high), (_, rest) in zip(total["points"], total["split"]["high"],
                                                total["split"]["rest"], strict=True):
        assert (high, rest) == (64 * x * x, 272 * x) and high + rest == value
    assert total["crossover"] == 5  # 64 s^2 >= 272 s at batch 2 too: s >= 4.25


def test_generate_page_holds_the_json(tmp_path: Path) -> None:


    page_file, json_file = tmp_path / "g.html", tmp_path / "g.json"
    assert main([*GENERATE, "--format", "html", "--output", str(page_file)]) == 0
    assert main([*GENERATE, "--format", "json", "--output", str(json_file)]) == 0
    data = embedded_data(page_file.read_text(encoding="utf-8"))
    assert data == json.loads(json_file.read_text(encoding="utf-8"))
    assert [s["kind"] for s in data["steps"]] == ["prefill", "decode", "decode"]


def test_profile_page_holds_the_measured_section(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    assert main(["profile", f"{TINY}:tiny", "--repeat", "1", "--warmup", "0", "--hardware",
                 "none", "--format", "html", "--output", str(out)]) == 0
    data = embedded_data(out.read_text(encoding="utf-8"))
    assert data["measured"]["repeat"] == 1 and data["measured"]["wall_s"] > 0
    # the counts beside the times are the count's: conv 8*64*27 + linear 8*4 = 13,856 MACs
    assert Report.from_dict(data).macs == 8 * 64 * 27 + 8 * 4


def test_the_wheel_carries_the_page_assets() -> None:
    # setuptools ships package data by pyproject's globs (a wheel built from the tree was checked
    # by hand to hold them): every asset the page inlines must match one
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["flopscope"]
    assets = Path(flopscope.render.html.__file__).parent / "html_assets"
    names = sorted(p.name for p in assets.iterdir())
    assert names == ["pages.js", "plan.js", "report.css", "report.js", "widgets.js"]
    for name in names:
        assert any(fnmatch.fnmatch(f"render/html_assets/{name}", g) for g in globs), name


def test_profile_page_carries_the_peaks_for_its_roofline(tmp_path: Path) -> None:
    from flopscope.estimate import get_hardware

    out = tmp_path / "p.html"
    assert main(["profile", f"{TINY}:tiny", "--repeat", "1", "--warmup", "0", "--hardware",
                 "h100-sxm", "--format", "html", "--output", str(out)]) == 0
    measured = embedded_data(out.read_text(encoding="utf-8"))["measured"]
    # the profile's roofs in its file format, its calibration left out (none for the datasheet)
    peaks = {k: v for k, v in get_hardware("h100-sxm").to_dict().items() if k != "calibration"}
    assert measured["peaks"] == peaks
    assert measured["peaks"]["memory_bandwidth_gb_s"] == 3350.0  # H100 SXM: 3.35 TB/s
    assert measured["hardware"] == "h100-sxm"  # the name stays where it was
    # without a profile there are no peaks (and no roofline on the page)
    assert main(["profile", f"{TINY}:tiny", "--repeat", "1", "--warmup", "0", "--hardware",
                 "none", "--format", "html", "--output", str(out)]) == 0
    assert "peaks" not in embedded_data(out.read_text(encoding="utf-8"))["measured"]


def test_a_training_estimate_has_rows_per_phase(tmp_path: Path) -> None:
    _, data = count_both(tmp_path, f"{TINY}:tiny", "--backward", "--optimizer", "adam", "--memory",
                         "--hardware", "h100-sxm")
    est, totals = data["estimate"], data["totals"]
    assert set(est["phases"]) == {"forward", "backward", "optimizer"} == set(est["by_phase"])
    for phase, rows in est["phases"].items():
        # each phase's operators add up to its row; its root module holds all of its work
        assert sum(r["flops"] for r in rows["by_op"].values()) == totals[phase]["flops"]
        assert rows["by_module"][""]["flops"] == totals[phase]["flops"]
        assert sum(r["time_s"] for r in rows["by_op"].values()) == pytest.approx(
            est["by_phase"][phase]["time_s"])
    # the phases' rows split the whole estimate's
    assert sum(est["phases"][p]["by_op"]["aten.convolution.default"]["flops"]
               for p in est["phases"] if "aten.convolution.default" in est["phases"][p]["by_op"]
               ) == est["by_op"]["aten.convolution.default"]["flops"]


def test_a_forward_estimate_has_no_rows_per_phase(tmp_path: Path) -> None:
    _, data = count_both(tmp_path, *TINY_FULL)
    assert list(data["estimate"]["by_phase"]) == ["forward"]
    assert "phases" not in data["estimate"]  # nothing to filter: the page stays as small


def test_plan_page_holds_the_plan(plan_both: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    from flopscope.plan.timing import PART_NAMES

    page_file, data = plan_both
    embedded = embedded_data(page_file.read_text(encoding="utf-8"))
    explain = embedded.pop("explain")
    # the plan's own dict (what --format json writes), but for how long planning took and how
    # many roles it simulated (the second run found them cached)
    unlike = ("seconds", "simulations")
    assert {k: v for k, v in embedded.items() if k not in unlike} == {
        k: v for k, v in data.items() if k not in unlike}
    assert 0 <= embedded["simulations"] <= embedded["roles"] == 10
    # the 20 MiB budget (5 fit since the memory tracker follows FSDP2's storage resizes: a
    # layer's gathered parameters are freed after its forward; 6 with loss parallelism, the
    # default: TP2 mb1x2's head over the vocabulary, 20,656,200 bytes, 21,836,872 without)
    assert (len(data["ranked"]), len(data["dropped"])) == (6, 2)
    # the words of the table: the parts of a step, and why the best wins against the others
    assert explain["part_names"] == PART_NAMES
    assert main([*PLAN]) == 0
    text = capsys.readouterr().out
    assert explain["why"] and all(f"  {line}\n" in text for line in explain["why"])
    assert explain["why"][0].startswith(data["ranked"][1]["layout"] + ": ")


def test_plan_to_html_is_the_cli_page(plan_both: tuple[Path, Any]) -> None:
    # Plan.to_html (and Jupyter's frame) draw the same data as the command line's page
    page_file, _ = plan_both
    plan = flopscope.plan("hf:llama", gpus=2, hardware="h100", seq_len=256, global_batch=2,
                          memory_budget=20 * 2**20,
                          config=dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=4))
    ours = embedded_data(plan.to_html())
    theirs = embedded_data(page_file.read_text(encoding="utf-8"))
    for key in ("seconds", "simulations"):
        ours.pop(key), theirs.pop(key)
    assert ours == theirs
    m = re.fullmatch(r'<iframe srcdoc="(?P<doc>[^"]*)"[^>]*></iframe>', plan._repr_html_())
    assert m is not None and embedded_data(html.unescape(m.group("doc")))["ranked"] == ours["ranked"]


def test_plan_html_refuses_a_terminal(cli: Callable[..., Result],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    r = cli(*PLAN, "--format", "html")
    assert r.code == 2  # before any planning
    assert "--format html writes a web page: give --output FILE.html" in r.err
