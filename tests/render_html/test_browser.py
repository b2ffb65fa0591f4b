"""The HTML page in a real browser: Debian's headless Chromium loads it from disk with the network
off (``benchmarks.html_render.Chromium``, the DevTools protocol over a pipe). Skipped when no
chromium is installed (``apt-get install chromium``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks.html_render import Chromium, chromium_path, llama_70b_report
from tests.cli.conftest import TINY
from tests.render_html.conftest import GENERATE, TINY_FULL, attention_symbolic
from torch import nn

from flopscope.cli import main
from flopscope.render.html import embedded_data, render_html, render_plan_html
from flopscope.report.report import Report
from flopscope.symbolic import count_symbolic

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(chromium_path() is None, reason="no chromium installed")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    with Chromium() as b:
        yield b


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The tiny model's page with the estimate and memory sections, and its JSON."""
    folder = tmp_path_factory.mktemp("tiny")
    page, data = folder / "r.html", folder / "r.json"
    assert main(["count", *TINY_FULL, "--format", "html", "--output", str(page)]) == 0
    assert main(["count", *TINY_FULL, "--format", "json", "--output", str(data)]) == 0
    return page, json.loads(data.read_text())


def _opened(browser: Chromium, page: Path) -> None:
    browser.open(page)
    assert browser.evaluate("document.getElementById('flopscope').dataset.ready") == "1"
    assert browser.errors() == []
    # the page's own file, and nothing else (the network is off: anything else would fail)
    assert browser.requests() == [page.resolve().as_uri()]


def _value(browser: Chromium, selector: str) -> Any:
    return browser.evaluate(f"document.querySelector({json.dumps(selector)}).dataset.value")


def test_totals_in_the_dom_equal_the_json(browser: Chromium, tiny: tuple[Path, Any]) -> None:
    page, data = tiny
    _opened(browser, page)
    totals = data["totals"]
    for key in ("params", "macs", "flops"):
        assert int(_value(browser, f'.total[data-key="{key}"]')) == totals[key]
    assert int(_value(browser, '.total[data-key="bytes"]')) == (totals["bytes_read"]
                                                                 + totals["bytes_written"])
    assert float(_value(browser, '.total[data-key="estimate"]')) == data["estimate"]["total"]["time_s"]
    assert int(_value(browser, "#memory-peak")) == data["memory"]["peak_bytes"]
    # the timeline's highest call is the peak, marked
    assert int(_value(browser, "#timeline-peak")) == data["memory"]["peak_bytes"]
    # the icicle's root block is the records summed over the tree: the report's total
    assert int(_value(browser, '#icicle g.node[data-path=""]')) == totals["flops"]


def test_a_click_zooms_the_icicle(browser: Chromium, tiny: tuple[Path, Any]) -> None:
    page, data = tiny
    _opened(browser, page)
    focus = "document.getElementById('icicle').dataset.focus"
    first = "document.querySelector('#icicle g.node').dataset.path"
    assert browser.evaluate(focus) == ""
    browser.click('#icicle g.node[data-path="features"]')
    assert browser.evaluate(focus) == "features"
    assert browser.evaluate(first) == "features"  # the zoomed module is the top block now
    assert browser.evaluate("document.querySelector('#icicle g.node[data-path=\"head\"]')") is None
    browser.click('#icicle g.node[data-path="features"]')  # again: back to its parent
    assert browser.evaluate(focus) == ""
    assert browser.errors() == []


def test_size_by_the_estimate(browser: Chromium, tiny: tuple[Path, Any]) -> None:
    page, data = tiny
    _opened(browser, page)
    browser.evaluate("(() => { const s = document.getElementById('icicle-measure'); "
                     "s.value = 'estimate'; s.dispatchEvent(new Event('change')); })()")
    assert browser.evaluate("document.getElementById('icicle').dataset.measure") == "estimate"
    root = float(_value(browser, '#icicle g.node[data-path=""]'))
    assert root == data["estimate"]["by_module"][""]["time_s"]


def test_tables_sort_and_filter(browser: Chromium, tiny: tuple[Path, Any]) -> None:
    page, data = tiny
    _opened(browser, page)
    browser.click('#operators th[data-key="flops"]')  # numbers sort largest first
    top = browser.evaluate("document.querySelector('#operators tbody td').textContent")
    flops: dict[str, int] = {}
    for r in data["records"]:
        flops[r["op"]] = flops.get(r["op"], 0) + r["flops"]
    assert top == max(flops, key=lambda op: flops[op])
    browser.evaluate("(() => { const f = document.getElementById('modules-filter'); "
                     "f.value = 'batchnorm'; f.dispatchEvent(new Event('input')); })()")
    rows = browser.evaluate("[...document.querySelectorAll('#modules tbody tr')]"
                            ".map(r => r.cells[1].textContent)")
    assert rows == ["BatchNorm2d"]


def test_uncounted_operators_are_shown(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "opaque.html"
    assert main(["count", f"{TINY}:opaque", "--format", "html", "--output", str(page)]) == 0
    _opened(browser, page)
    text = browser.evaluate("document.getElementById('warn-uncounted').textContent")
    assert "tinyfix.smear" in text


def test_a_70b_shaped_page_stays_responsive(browser: Chromium, tmp_path: Path) -> None:
    report = llama_70b_report(tokens=512)
    page = tmp_path / "llama70b.html"
    page.write_text(render_html(report), encoding="utf-8")
    _opened(browser, page)
    load_ms = browser.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
    assert load_ms < 3000, load_ms  # measured: about 230 ms on this 2-core machine
    zoom_ms = browser.evaluate(
        "(() => { const n = document.querySelector('#icicle g.node[data-path=\"model.layers\"]');"
        " const t = performance.now(); n.dispatchEvent(new MouseEvent('click', {bubbles: true}));"
        " return performance.now() - t; })()")
    assert zoom_ms < 500, zoom_ms  # measured: about 17 ms
    assert browser.evaluate("document.getElementById('icicle').dataset.focus") == "model.layers"
    assert int(_value(browser, '#icicle g.node[data-path="model.layers"]')) == sum(
        r.cost.flops for r in report.records if r.module.startswith("model.layers."))


def test_diff_page_highlights_the_changes(browser: Chromium, tmp_path: Path) -> None:
    a, b, page = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "d.html"
    assert main(["count", f"{TINY}:tiny", "--format", "json", "--output", str(a)]) == 0
    assert main(["count", f"{TINY}:tiny_wider", "--format", "json", "--output", str(b)]) == 0
    assert main(["diff", str(a), str(b), "--format", "html", "--output", str(page)]) == 1
    _opened(browser, page)
    changed = browser.evaluate("[...document.querySelectorAll('#diff tbody tr.changed')]"
                               ".map(r => r.cells[0].textContent)")
    assert changed == ["(root)", "head"]  # tiny_wider widens the head only
    colour = "document.querySelector('#icicle-b g.node[data-path=\"{}\"]').dataset.colour"
    assert browser.evaluate(colour.format("head")) == "#f0b429"  # changed: yellow in the icicle
    assert browser.evaluate(colour.format("features")) == "#b9c6d8"  # the same
    browser.click("#icicle-b g.node[data-path='features']")
    assert browser.evaluate("document.getElementById('icicle-b').dataset.focus") == "features"
    assert browser.evaluate("document.getElementById('icicle-a').dataset.focus") == ""


def test_symbolic_page_draws_a_curve_per_symbol(browser: Chromium, tmp_path: Path) -> None:
    sym = count_symbolic(nn.Linear(4, 3), torch.ones(2, 4), symbolic={"batch": [(0, 0)]})
    page = tmp_path / "s.html"
    page.write_text(sym.to_html(), encoding="utf-8")
    _opened(browser, page)
    assert browser.evaluate("document.querySelectorAll('svg[data-symbol=\"batch\"] circle')"
                            ".length") == 33
    assert browser.evaluate("document.querySelector('#formulas-total code').textContent") == str(
        sym.total().macs)


def test_generate_page_draws_its_steps(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "g.html"
    assert main([*GENERATE, "--format", "html", "--output", str(page)]) == 0
    _opened(browser, page)
    assert browser.evaluate("document.querySelectorAll('#steps-chart rect.step').length") == 3
    # the report of all steps is drawn under the steps, its icicle included
    assert browser.evaluate("document.querySelectorAll('#icicle g.node').length") > 10


def test_a_profile_page_draws_the_measured_roofline(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    assert main(["profile", f"{TINY}:tiny", "--repeat", "1", "--warmup", "0", "--hardware",
                 "h100-sxm", "--format", "html", "--output", str(page)]) == 0
    data = embedded_data(page.read_text(encoding="utf-8"))
    _opened(browser, page)
    assert browser.evaluate("document.querySelectorAll('#roofline path.roof').length") >= 1
    by_op = data["measured"]["by_op"]
    drawn = browser.evaluate("Object.fromEntries([...document.querySelectorAll("
                             "'#roofline .measured-point')].map(c => [c.dataset.op, c.dataset.y]))")
    # every operator with work and time, at its measured rate: FLOPs / measured seconds
    assert {op: float(y) for op, y in drawn.items()} == {
        op: r["flops"] / r["seconds"] for op, r in by_op.items()
        if r["flops"] and r["bytes"] and r["seconds"]}
    bounds = browser.evaluate("Object.fromEntries([...document.querySelectorAll("
                              "'#roofline .bound-point')].map(c => [c.dataset.op, c.dataset.y]))")
    # beside each, the rate of its roofline bound: FLOPs / bound seconds
    assert {op: float(y) for op, y in bounds.items()} == {
        op: r["flops"] / r["bound_s"] for op, r in by_op.items()
        if r["flops"] and r["bytes"] and r["bound_s"]}
    assert len(bounds) == len(drawn) > 0


def _pick_phase(browser: Chromium, phase: str) -> None:
    browser.evaluate("(() => { const s = document.getElementById('phase'); "
                     f"s.value = {json.dumps(phase)}; s.dispatchEvent(new Event('change')); }})()")


def test_the_phase_filter(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    argv = ["count", f"{TINY}:tiny", "--backward", "--optimizer", "adam", "--memory", "--hardware",
            "h100-sxm"]
    assert main([*argv, "--format", "html", "--output", str(page)]) == 0
    data = embedded_data(page.read_text(encoding="utf-8"))
    _opened(browser, page)
    assert browser.evaluate("[...document.querySelectorAll('#phase option')].map(o => o.value)"
                            ) == ["", "forward", "backward", "optimizer"]
    root = "document.querySelector('#icicle g.node[data-path=\"\"]').dataset.value"
    ops = "[...document.querySelectorAll('#operators tbody tr')].map(r => r.cells[0].textContent)"
    points = "[...document.querySelectorAll('#roofline .point')].map(c => c.dataset.op)"
    for phase in ("backward", "optimizer", "forward"):
        _pick_phase(browser, phase)
        assert int(browser.evaluate(root)) == data["totals"][phase]["flops"]
        assert sorted(browser.evaluate(ops)) == sorted(
            {r["op"] for r in data["records"] if r["phase"] == phase})
        rows = data["estimate"]["phases"][phase]["by_op"]
        assert sorted(browser.evaluate(points)) == sorted(
            op for op, r in rows.items() if r["intensity"] and r["time_s"] and r["bytes"])
    # the memory timeline shades the chosen phase's calls: its runs of calls, first to last
    tl = data["memory"]["timeline"]
    runs, start = [], None
    for i, p in enumerate([*tl["phase"], None]):
        if p == "backward" and start is None:
            start = i
        elif p != "backward" and start is not None:
            runs.append([str(tl["index"][start]), str(tl["index"][i - 1])])
            start = None
    _pick_phase(browser, "backward")
    assert runs and browser.evaluate(
        "[...document.querySelectorAll('#timeline-phase rect.phase-span')]"
        ".map(r => [r.dataset.from, r.dataset.to])") == runs
    _pick_phase(browser, "")  # every phase again
    assert int(browser.evaluate(root)) == data["totals"]["flops"]
    assert browser.evaluate("document.querySelectorAll('#timeline-phase rect').length") == 0
    assert browser.errors() == []


def test_the_plan_page(browser: Chromium, plan_both: tuple[Path, Any]) -> None:
    page, data = plan_both
    _opened(browser, page)
    best = data["ranked"][0]
    assert browser.evaluate("document.querySelector('.total[data-key=\"best\"]').dataset.value"
                            ) == best["layout"]
    assert float(_value(browser, '.total[data-key="step"]')) == best["time_s"]["total"]
    # h100's reference calibration: the step predicted, where from said, the bound's MFU beside
    assert data["prediction"]["reference"] and best["time_kind"] == "prediction"
    assert data["prediction"]["source"] in browser.evaluate(
        "document.getElementById('plan-prediction').textContent")
    assert float(_value(browser, '.total[data-key="mfu-bound"]')) == best["mfu_bound"]
    # the chart: every layout at (peak memory, step time); the front filled; the dropped grey
    layouts = "[...document.querySelectorAll('#pareto {}')].map(c => c.dataset.layout)"
    assert sorted(browser.evaluate(layouts.format(".layout-point"))) == sorted(
        c["layout"] for c in data["ranked"])
    assert sorted(browser.evaluate(layouts.format(".pareto"))) == sorted(data["pareto"])
    assert sorted(browser.evaluate(layouts.format(".dropped-point"))) == sorted(
        c["layout"] for c in data["dropped"])
    # the tables: the ranked layouts in order, the dropped ones with their reasons
    cells = "[...document.querySelectorAll('#{} tbody tr')].map(r => r.cells[{}].textContent)"
    assert browser.evaluate(cells.format("ranked", 1)) == [c["layout"] for c in data["ranked"]]
    assert sorted(browser.evaluate(cells.format("dropped", 3))) == sorted(
        c["reason"] for c in data["dropped"])
    # where the best layout's time goes: its parts, adding up to its step
    parts = browser.evaluate("Object.fromEntries([...document.querySelectorAll("
                             "'#breakdown-bar span')].map(s => [s.dataset.part, s.dataset.value]))")
    assert {k: float(v) for k, v in parts.items()} == {
        k: v for k, v in best["time_s"].items() if k not in ("total", "fsdp_hidden") and v > 0}
    assert sum(map(float, parts.values())) == pytest.approx(best["time_s"]["total"])
    assert browser.evaluate("document.querySelectorAll('#plan-why li').length") >= 1
    # a click on a dropped layout shows its time, memory and why it was dropped
    other = data["dropped"][0]["layout"]
    browser.click(f'#pareto .dropped-point[data-layout="{other}"]')
    assert browser.evaluate("document.getElementById('breakdown').dataset.layout") == other
    assert browser.evaluate("document.getElementById('pareto-selected').dataset.layout") == other
    assert data["dropped"][0]["reason"] in browser.evaluate(
        "document.getElementById('breakdown').textContent")
    browser.click("#ranked tbody tr:nth-child(2)")  # a row of the table picks its layout too
    assert browser.evaluate("document.getElementById('breakdown').dataset.layout") == data[
        "ranked"][1]["layout"]
    assert browser.errors() == []


_UNITS = {"ns": 1e-9, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0}


def _seconds_of(text: str) -> float:
    """A time cell's text (the page's three significant digits and unit) as seconds."""
    number, unit = text.split(" ")
    return float(number) * _UNITS[unit]


def test_the_plan_page_shows_the_bound_beside_the_prediction(
        browser: Chromium, plan_both: tuple[Path, Any]) -> None:
    """The ranked table's two bound columns (h100's reference calibration: the step and MFU
    predicted, the roofline bound's beside them): after MFU, each row's own values."""
    page, data = plan_both
    _opened(browser, page)
    heads = browser.evaluate("[...document.querySelectorAll('#ranked thead th')]"
                             ".map(h => h.textContent)")
    at = heads.index("MFU")
    assert heads[at - 2:at + 3] == ["step", "tokens/s/GPU", "MFU", "step (bound)",
                                    "MFU (bound)"]
    cells = ("[...document.querySelectorAll('#ranked tbody tr')].map(r => [...r.cells]"
             ".map(c => c.textContent))")
    rows = browser.evaluate(cells)
    assert [r[1] for r in rows] == [c["layout"] for c in data["ranked"]]
    assert any(c["bound_time_s"]["total"] < c["time_s"]["total"] for c in data["ranked"])
    for row, c in zip(rows, data["ranked"], strict=True):
        # the page's units: three significant digits (at most 0.5% off the value) and MFU to
        # a tenth of a percent
        assert _seconds_of(row[at - 2]) == pytest.approx(c["time_s"]["total"], rel=5e-3)
        assert _seconds_of(row[at + 1]) == pytest.approx(c["bound_time_s"]["total"], rel=5e-3)
        assert row[at + 2] == f"{100 * c['mfu_bound']:.1f}%"
        assert row[at] == f"{100 * c['mfu']:.1f}%"
    # sorted by the bound's step: the layouts in the order of their bound_time_s
    browser.click('#ranked th[data-key="step_bound"]')
    order = [r[1] for r in browser.evaluate(cells)]
    assert [c["layout"] for c in sorted(data["ranked"], key=lambda c: c["bound_time_s"]["total"],
                                        reverse=True)] == order
    assert browser.errors() == []


def test_a_plan_page_shows_keys_it_does_not_know(browser: Chromium, plan_both: tuple[Path, Any],
                                                 tmp_path: Path) -> None:
    page, _ = plan_both
    data = embedded_data(page.read_text(encoding="utf-8"))
    data["future"] = {"what": "a key a newer planner adds"}
    data["ranked"][0]["time_s"]["overlap"] = 0.0  # a step part this page has no name for
    for c in data["ranked"]:  # an expert-parallel degree and the data-parallel kind
        c["ep"], c["data_parallel"] = 2, "fsdp"
    newer = tmp_path / "newer.html"
    newer.write_text(render_plan_html(data), encoding="utf-8")
    _opened(browser, newer)
    assert "a key a newer planner adds" in browser.evaluate(
        "document.getElementById('section-future').textContent")
    header = browser.evaluate("[...document.querySelectorAll('#ranked th')].map(t => t.textContent)")
    assert {"overlap", "EP", "data parallel"} <= set(header)


def test_the_symbolic_page_per_token_and_choices(browser: Chromium, tmp_path: Path) -> None:
    sym = attention_symbolic()
    page = tmp_path / "attn.html"
    page.write_text(sym.to_html(), encoding="utf-8")
    data = embedded_data(page.read_text(encoding="utf-8"))
    _opened(browser, page)
    assert browser.evaluate("document.getElementById('per-token').dataset.formula") == (
        "64*seq_len + 136")
    assert _value(browser, "#crossover") == "5"
    # the seq_len chart: the total split, attention's terms meeting the rest at 5 (batch 2)
    chart = 'svg[data-symbol="seq_len"]'
    assert _value(browser, f"{chart} line.crossover") == "5"
    assert browser.evaluate(f"document.querySelectorAll('{chart} .split-high').length") == 1

    def drawn() -> list[list[int]]:
        return browser.evaluate(f"[...document.querySelectorAll('{chart} circle')]"
                                ".map(c => [Number(c.dataset.x), Number(c.dataset.y)])")

    def curve(field: str, module: str) -> list[list[int]]:
        [c] = [c for c in data["curves"] if (c["symbol"], c["field"], c["module"]) == (
            "seq_len", field, module)]
        return c["points"]

    assert drawn() == curve("flops", "")
    for select, value in (("field", "macs"), ("module", "proj")):
        browser.evaluate(f"(() => {{ const s = document.getElementById('curve-{select}-seq_len');"
                         f" s.value = '{value}'; s.dispatchEvent(new Event('change')); }})()")
    assert drawn() == curve("macs", "proj")  # the projection's MACs: 64 * batch * seq_len
    assert browser.evaluate(f"document.querySelectorAll('{chart} line.crossover').length") == 0
    assert browser.errors() == []


def test_integers_beyond_2_53_stay_exact(browser: Chromium, tmp_path: Path) -> None:
    # the tiny model's records scaled past 2^53 (odd, so no double holds them): the page reads
    # the numbers' own text, so the totals, the icicle and the tables' exact values are exact
    data = main_json(["count", f"{TINY}:tiny"], tmp_path)
    for r in data["records"]:
        for key in ("macs", "flops", "bytes_read", "bytes_written"):
            r[key] = r[key] * 2**40 + 1
    report = Report.from_dict(data)
    page = tmp_path / "big.html"
    page.write_text(report.to_html(), encoding="utf-8")
    big = report.to_dict()
    assert big["totals"]["flops"] > 2**53 and float(big["totals"]["flops"]) != big["totals"]["flops"]
    _opened(browser, page)
    totals = big["totals"]
    for key in ("macs", "flops"):
        assert int(_value(browser, f'.total[data-key="{key}"]')) == totals[key]
    assert int(_value(browser, '.total[data-key="bytes"]')) == (totals["bytes_read"]
                                                                 + totals["bytes_written"])
    assert browser.evaluate("document.querySelector('.total[data-key=\"flops\"] ~ .exact')"
                            ".textContent") == f"{totals['flops']:,}"
    assert int(_value(browser, '#icicle g.node[data-path=""]')) == totals["flops"]
    features = report.by_module()["features"].inclusive.flops
    assert int(_value(browser, '#icicle g.node[data-path="features"]')) == features
    # the module table's FLOPs cell holds the exact value in its title
    browser.evaluate("(() => { const f = document.getElementById('modules-filter'); "
                     "f.value = '/^\\\\s*features$/'; f.dispatchEvent(new Event('input')); })()")
    titles = browser.evaluate("[...document.querySelectorAll('#modules tbody tr')].map(r => "
                              "r.cells[4].title)")
    assert titles == [f"{features:,}"]
    assert browser.errors() == []


def main_json(argv: list[str], folder: Path) -> Any:
    """``flopscope ARGV --format json``, parsed."""
    out = folder / "out.json"
    assert main([*argv, "--format", "json", "--output", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def _served(tp: int, pp: int, replicas: int, batch: int, *, fits: bool = True,
            largest: bool = False) -> dict[str, Any]:
    """One (layout, batch) of a serving plan as ``ServeCandidate.to_dict`` writes it (the plan
    serving work's format: prefill and mean decode step in parts, seconds; bytes)."""
    compute = 1e-3 * batch / tp
    # a mixture of experts' layouts: the expert all-to-alls a part of their own
    prefill = {"compute": 40 * compute, "tp_comm": 2e-4 * (tp > 1), "ep_comm": 3e-4 * (tp > 1),
               "p2p": 1e-4 * (pp - 1)}
    decode = {"compute": compute, "tp_comm": 5e-5 * (tp > 1), "ep_comm": 7e-5 * (tp > 1),
              "p2p": 2e-5 * (pp - 1)}
    prefill["total"], decode["total"] = sum(prefill.values()), sum(decode.values())
    new_tokens = 128
    per_s = replicas * batch * new_tokens / (prefill["total"] + (new_tokens - 1) * decode["total"])
    gpus = tp * pp * replicas
    weights, kv = 2**30 // (tp * pp), batch * 2**24 // (tp * pp)
    return {"layout": f"TP{tp} PP{pp} DP{replicas}", "tp": tp, "pp": pp, "replicas": replicas,
            "batch": batch, "largest_batch": largest, "memory_bytes": weights + kv + 2**20,
            "weights_bytes": weights, "kv_cache_bytes": kv, "peak_where": "lm_head (prefill)",
            "prefill_s": prefill, "decode_step_s": decode,
            "time_to_first_token_s": prefill["total"], "latency_per_token_s": decode["total"],
            "tokens_per_s": per_s, "tokens_per_s_per_gpu": per_s / gpus, "fits": fits,
            "reason": None if fits else "needs 3.00 GiB, over the 2.00 GiB budget"}


def test_a_serving_plan_page(browser: Chromium, tmp_path: Path) -> None:
    ranked = [_served(1, 1, 4, 16, largest=True), _served(2, 1, 2, 8), _served(4, 1, 1, 1)]
    ranked.sort(key=lambda c: -c["tokens_per_s"])
    data = {"mode": "serve", "source": "hf:llama", "gpus": 4, "hardware": "h100-sxm",
            "gpus_per_node": 8, "seq_len": 512, "max_new_tokens": 128, "dtype": "bfloat16",
            "memory_budget": 2 * 2**30, "time_model": "roofline lower bound", "ranked": ranked,
            "dropped": [_served(1, 1, 4, 64, fits=False)],
            "best_throughput": f"{ranked[0]['layout']} batch {ranked[0]['batch']}",
            "best_latency": "TP4 PP1 DP1 batch 1", "roles": 6, "simulations": 6,
            "seconds": 1.0, "notes": ["a note"],
            "explain": {"why": ["TP2 PP1 DP2 batch 8: fewer sequences in flight"]}}
    page = tmp_path / "serve.html"
    page.write_text(render_plan_html(data), encoding="utf-8")
    _opened(browser, page)
    labels = [f"{c['layout']} batch {c['batch']}" for c in ranked]
    assert browser.evaluate("[...document.querySelectorAll('#serve-chart .serve-point')]"
                            ".map(c => c.dataset.layout)") == labels
    assert _value(browser, '.total[data-key="best"]') == data["best_throughput"]
    assert _value(browser, '.total[data-key="best-latency"]') == "TP4 PP1 DP1 batch 1"
    # where the most tokens/s spend a prefill and a decode step, part by part
    for step, key in (("prefill", "prefill_s"), ("decode", "decode_step_s")):
        parts = browser.evaluate(f"Object.fromEntries([...document.querySelectorAll("
                                 f"'#breakdown-{step} span')].map(s => [s.dataset.part, "
                                 "Number(s.dataset.value)]))")
        assert parts == {k: v for k, v in ranked[0][key].items() if k != "total" and v > 0}
    assert browser.evaluate("[...document.querySelectorAll('#ranked tbody tr')]"
                            ".map(r => r.cells[1].textContent)") == labels
    assert browser.evaluate("document.getElementById('plan-why').textContent") == (
        "TP2 PP1 DP2 batch 8: fewer sequences in flight")  # why the best wins, where given
    browser.click("#ranked tbody tr:nth-child(3)")
    assert browser.evaluate("document.getElementById('breakdown').dataset.layout") == labels[2]
    assert browser.evaluate("document.getElementById('serve-selected').dataset.layout") == labels[2]
    assert "over the 2.00 GiB budget" in browser.evaluate(
        "document.getElementById('dropped').textContent")
    assert browser.evaluate("document.querySelector('[id^=section-]')") is None  # all known
    # every part of a step is drawn: the expert all-to-alls of a layout with tensor parallelism
    browser.click(f"#ranked tbody tr:nth-child({1 + [c['tp'] for c in ranked].index(2)})")
    assert browser.evaluate("[...document.querySelectorAll('#breakdown-decode span')]"
                            ".map(s => s.title.split(':')[0])") == [
        "compute", "tensor-parallel collectives", "expert all-to-alls"]


def _served_page(browser: Chromium, page: Path, **options: Any) -> Any:
    """A small Llama's serving plan (2 H100s, 64 MiB each), its page written to ``page`` and
    opened; the plan."""
    import flopscope
    from flopscope.plan import ServePlan
    from flopscope.plan.display import plan_html

    plan = flopscope.plan("hf:llama", gpus=2, hardware="h100", seq_len=64, mode="serve",
                          max_new_tokens=8, batches=[1, 4], memory_budget=64 * 2**20,
                          config=dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=4), **options)
    assert isinstance(plan, ServePlan) and plan.best_throughput is not None
    page.write_text(plan_html(plan), encoding="utf-8")
    _opened(browser, page)
    return plan


def test_a_real_serving_plan_page_says_why_the_best_wins(browser: Chromium,
                                                        tmp_path: Path) -> None:
    """A serving plan's own page (``plan_html``, ``--serve --format html``) shows the
    table's "Why it wins" under the best layout's breakdown, with the words it is read by."""
    from flopscope.estimate import get_hardware
    from flopscope.plan.time_words import validated_on

    page = tmp_path / "served.html"
    plan = _served_page(browser, page)
    explain = embedded_data(page.read_text(encoding="utf-8"))["explain"]
    assert explain["why"]
    assert browser.evaluate("[...document.querySelectorAll('#plan-why li')]"
                            ".map(li => li.textContent)") == explain["why"]
    assert browser.evaluate("document.getElementById('plan-why').previousElementSibling"
                            ".textContent") == explain["why_title"]
    assert browser.evaluate("document.getElementById('breakdown').dataset.layout") == (
        plan.best_throughput.label)
    # the shipped H100's reference calibration: the times predicted, what the error bar was
    # measured on, the bound's latency and tokens/s beside in the table
    hint = browser.evaluate("document.getElementById('plan-prediction').textContent")
    assert hint.startswith("Times predicted (") and validated_on(get_hardware("h100").calibration) in hint
    heads = browser.evaluate("[...document.querySelectorAll('#ranked thead th')]"
                             ".map(h => h.textContent)")
    assert "per token (bound)" in heads[-3] and "tok/s/GPU (bound)" in heads[-2]
    assert "tok/s/GPU (cont.)" in heads[-1]  # continuous batching, last
    bound = plan.best_throughput.decode_bound
    data = embedded_data(page.read_text(encoding="utf-8"))
    assert bound is not None and data["ranked"][0]["latency_per_token_bound_s"] == bound.total
    cell = browser.evaluate("document.querySelector('#ranked tbody tr').cells["
                            + str(len(heads) - 3) + "].textContent")
    assert cell.endswith("s") and cell != "-"  # the bound, drawn (the widget's own units)
    assert browser.evaluate("document.querySelector('[id^=section-]')") is None  # all known
    # the test model's decode step is host-bound on the H100: the best for latency at the
    # device's time alone is named, and a decode step's parts (waiting for the host among
    # them) add up to the step
    alone = plan.best_latency_without_host
    assert alone is not None
    assert browser.evaluate("document.querySelector('.total[data-key=\"best-latency-device\"]')"
                            ".dataset.value") == alone.label
    parts = browser.evaluate("[...document.querySelectorAll('#breakdown-decode span')]"
                             ".map(s => [s.dataset.part, Number(s.dataset.value)])")
    decode = plan.best_throughput.decode
    assert dict(parts) == {k: v for k, v in decode.to_dict().items()
                           if k not in ("total", "host") and v > 0}
    assert sum(v for _, v in parts) == pytest.approx(decode.total)
    # continuous batching: its best named, and the best row's mixed step drawn part by part
    best_cont = plan.best_continuous
    assert best_cont is not None and best_cont.continuous is not None
    assert browser.evaluate("document.querySelector('.total[data-key=\"best-continuous\"]')"
                            ".dataset.value") == best_cont.label
    cont = plan.best_throughput.continuous
    assert cont is not None
    parts = browser.evaluate("[...document.querySelectorAll('#breakdown-continuous span')]"
                             ".map(s => [s.dataset.part, Number(s.dataset.value)])")
    assert dict(parts) == {k: v for k, v in cont.step.to_dict().items()
                           if k not in ("total", "host") and v > 0}
    # another row's breakdown has no "why it wins"
    browser.click("#ranked tbody tr:nth-child(2)")
    assert browser.evaluate("document.getElementById('plan-why')") is None
    assert browser.errors() == []


def test_a_continuous_batching_plan_page(browser: Chromium, tmp_path: Path) -> None:
    """A plan with continuous batching: the page says so, has no column of continuous
    batching beside (its rows are that), and names a row's step as a step, whose parts add
    up to it."""

    plan = _served_page(browser, tmp_path / "continuous.html", batching="continuous")
    assert plan.best_throughput is not None
    assert browser.evaluate("document.querySelector('.sub').textContent").endswith(
        ", continuous batching")
    heads = browser.evaluate("[...document.querySelectorAll('#ranked thead th')]"
                             ".map(h => h.textContent)")
    assert not any("(cont.)" in h for h in heads)
    titles = browser.evaluate("[...document.querySelectorAll('#breakdown h3')]"
                              ".map(h => h.textContent)")
    assert any(t.startswith("a step (latency per token): ") for t in titles)
    parts = browser.evaluate("[...document.querySelectorAll('#breakdown-decode span')]"
                             ".map(s => Number(s.dataset.value))")
    assert sum(parts) == pytest.approx(plan.best_throughput.decode.total)
    assert browser.evaluate("document.querySelector('[id^=section-]')") is None  # all known
    assert browser.errors() == []


def test_numbers_are_shown_without_an_exponent(browser: Chromium, tmp_path: Path) -> None:
    # 1023 MiB + 511 KiB: under the 1023.5 MiB where GiB takes over, over 999.5: three
    # significant digits were "1.02e+3 MiB"
    data = main_json(["count", f"{TINY}:tiny"], tmp_path)
    for i, r in enumerate(data["records"]):
        r["bytes_read"], r["bytes_written"] = (1023 * 2**20 + 2**19 - 1024 if i == 0 else 0), 0
    page = tmp_path / "bytes.html"
    page.write_text(Report.from_dict(data).to_html(), encoding="utf-8")
    _opened(browser, page)
    assert browser.evaluate("document.querySelector('.total[data-key=\"bytes\"]').textContent"
                            ) == "1023 MiB"


def _calibrated() -> Any:
    """h100-sxm's roofs with a small calibration (one element-wise and one product rate, host
    times): the estimate and the profile then carry predictions beside their bounds."""
    import dataclasses

    from flopscope.estimate import Calibration, get_hardware
    from flopscope.estimate.calibration import Point

    points = (Point("elementwise", "fp32", "add", 1_000, 10_000, 2e-5),
              Point("matmul", "fp32", "mm", 2_000_000, 10_000, 1e-3))
    cal = Calibration("2026-11-27T00:00:00+00:00", "cpu (test)", 1, {"torch": "x"},
                      {"elementwise": 1e-6, "matmul": 2e-6, "view": 5e-7}, points)
    return dataclasses.replace(get_hardware("h100-sxm"), calibration=cal)


def _rates(browser: Chromium, cls: str) -> dict[str, float]:
    return {op: float(y) for op, y in browser.evaluate(
        f"Object.fromEntries([...document.querySelectorAll('#roofline .{cls}')]"
        ".map(c => [c.dataset.op, c.dataset.y]))").items()}


def test_predicted_rates_beside_the_bounds(browser: Chromium, tmp_path: Path) -> None:
    import flopscope

    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(4, 8)
    hw = _calibrated()
    # a count with the calibrated estimate: each operator's predicted rate, FLOPs / predicted s
    est = flopscope.estimate.roofline(model, x, hardware=hw).report
    page = tmp_path / "c.html"
    page.write_text(est.to_html(), encoding="utf-8")
    by_op = embedded_data(page.read_text(encoding="utf-8"))["estimate"]["by_op"]
    _opened(browser, page)
    want = {op: r["flops"] / r["predicted_s"] for op, r in by_op.items()
            if r["flops"] and r["bytes"] and r["predicted_s"]}
    assert _rates(browser, "predicted-point") == want and len(want) == 2  # addmm and relu
    # a profile on it: measured, bound and predicted rates of each operator
    prof = flopscope.profile(model, x, hardware=hw, warmup=0, repeat=1).report
    page = tmp_path / "p.html"
    page.write_text(prof.to_html(), encoding="utf-8")
    by_op = embedded_data(page.read_text(encoding="utf-8"))["measured"]["by_op"]
    _opened(browser, page)
    assert _rates(browser, "predicted-point") == {
        op: r["flops"] / r["predicted_s"] for op, r in by_op.items()
        if r["flops"] and r["bytes"] and r["predicted_s"]}
    assert set(_rates(browser, "bound-point")) == set(_rates(browser, "measured-point")) == set(
        want)


def test_no_point_above_the_roofs_drawn(browser: Chromium, tiny: tuple[Path, Any]) -> None:
    # the tiny model's convolution is float32, which cuDNN runs as TF32 by default (the
    # estimate's tf32_convolution): the TF32 matrix roof is its roof and is drawn (resnet50's
    # backward convolutions, at 150 TFLOP/s, were drawn over the 67 TFLOP/s float32 vector roof,
    # the only one); no operator's rate is above the highest roof drawn
    page, data = tiny
    assert data["estimate"]["tf32_convolution"] and not data["estimate"]["tf32"]
    _opened(browser, page)
    assert browser.evaluate("document.getElementById('roofline-dtype').value") == "fp32"
    text = browser.evaluate("document.getElementById('roofline').textContent")
    assert "tf32 matrix (convolutions) roof 495 TFLOP/s" in text  # H100 SXM's dense TF32
    peak = data["estimate"]["hardware"]["matrix_tflops"]["tf32"] * 1e12
    rates = _rates(browser, "point")
    assert max(rates.values()) <= peak
    conv = data["estimate"]["by_op"]["aten.convolution.default"]
    assert rates["aten.convolution.default"] == conv["flops"] / conv["time_s"]


def test_a_sweep_of_plans(browser: Chromium, plan_both: tuple[Path, Any],
                          tmp_path: Path) -> None:
    # a sweep's points as the planner's sweep writes them: the point and its plan (or an error)
    _, data = plan_both
    points = [{"source": "hf:llama", "gpus": 2, "seq_len": 256, "error": None, "plan": data},
              {"source": "hf:llama", "gpus": 3, "seq_len": 256, "error": "no layout divides "
               "3 GPUs", "plan": None}]
    page = tmp_path / "sweep.html"
    page.write_text(render_plan_html(points), encoding="utf-8")
    _opened(browser, page)
    rows = browser.evaluate("[...document.querySelectorAll('#sweep tbody tr')]"
                            ".map(r => [r.cells[1].textContent, r.cells[3].textContent])")
    assert rows == [["2", data["ranked"][0]["layout"]], ["3", "-"]]
    # the first plan is drawn below; a click on the failed point says why
    assert browser.evaluate("document.querySelectorAll('#sweep-plan #pareto .layout-point')"
                            ".length") == len(data["ranked"])
    browser.click("#sweep tbody tr:nth-child(2)")
    assert "no layout divides 3 GPUs" in browser.evaluate(
        "document.getElementById('sweep-plan').textContent")
    assert browser.errors() == []
