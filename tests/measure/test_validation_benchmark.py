"""benchmarks/validation.py (the documented experiment) with a FakeBackend: resumable, keeps
partial results, writes CSV, plot and the generated Markdown section."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from benchmarks import validation

from flopscope.measure import FakeBackend, MeasureError, Measurement, MeasureRequest, Region

MODELS = """\
import torch
import torch.nn as nn


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)
"""


class Scaled:
    """A fake measurement: counted FLOPs per module times ``factor``; fails for ``fail``."""

    def __init__(self, factor: float, fail: str = "") -> None:
        self.factor, self.fail, self.calls = factor, fail, 0

    def __call__(self, region: Region) -> Measurement:
        from flopscope.measure import counted_segments

        self.calls += 1
        assert region.report is not None
        if self.fail and region.report.meta.source and self.fail in region.report.meta.source:
            raise MeasureError("the measured process failed (exit 1)")
        segs = {k: round(v * self.factor) for k, v in counted_segments(region.report).items()}
        total = sum(segs.values())
        notes = ("valgrind/callgrind: 123 instructions executed in the region", "shared note")
        return Measurement("fake", total, {"double": total}, segments=segs, notes=notes)


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    (tmp_path / "m1.py").write_text(MODELS)
    (tmp_path / "m2.py").write_text(MODELS)
    return [f"{tmp_path / 'm1.py'}:tiny", f"{tmp_path / 'm2.py'}:tiny"]


def test_partial_results_are_kept_and_the_run_resumes(tmp_path: Path, sources: list[str]) -> None:
    out = tmp_path / "out"
    requests = [MeasureRequest(s, dtype="float64") for s in sources]
    first = Scaled(1.01, fail="m2.py")
    records = validation.run(requests, out, backend=FakeBackend(first))
    assert [r["error"] is None for r in records] == [True, False]
    assert validation.ratio(records[0]) == pytest.approx(1.01, abs=2e-3)
    assert json.loads(validation.run_file(out, sources[0]).read_text())["result"]["backend"] == "fake"
    # Rerun: the measured model is kept, the failed one is measured again.
    second = Scaled(1.0)
    records = validation.run(requests, out, backend=FakeBackend(second))
    assert second.calls == 1
    assert [validation.ratio(r) for r in records] == [pytest.approx(1.01, abs=2e-3), 1.0]
    # Other options, or --fresh: measured again.
    third = Scaled(1.0)
    validation.run([MeasureRequest(sources[0], dtype="float32")], out, backend=FakeBackend(third))
    validation.run(requests, out, backend=FakeBackend(third), fresh=True)
    assert third.calls == 3


def test_outputs(tmp_path: Path, sources: list[str]) -> None:
    out = tmp_path / "out"
    records = validation.run([MeasureRequest(s, dtype="float64") for s in sources], out,
                             backend=FakeBackend(Scaled(1.0, fail="m2.py")))
    validation.write_csv(records, out / "results.csv")
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["source"] == sources[0] and float(rows[0]["ratio"]) == pytest.approx(1.0)
    assert rows[1]["ratio"] == "" and "measured process failed" in rows[1]["error"]
    page = tmp_path / "validation.md"
    page.write_text(f"# T\n\nintro\n\n{validation.MARK_BEGIN}\nold\n{validation.MARK_END}\n\n"
                    "## Analysis\nkept\n")
    text = validation.results_markdown(records, command="cmd", plot_name="p.png",
                                       csv_name="r.csv")
    validation.update_markdown(page, text, "T")
    doc = page.read_text()
    assert "old" not in doc and "intro" in doc and "## Analysis\nkept" in doc
    assert "| **1.0000** |" in doc and "failed**" in doc and "- shared note" in doc
    assert "| `0` | 544 | 544 | 1.0000 |" in doc
    pytest.importorskip("matplotlib")
    assert validation.write_plot(records, tmp_path / "p.png", "t") is None
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_main_writes_everything_and_exits_1_on_failure(
    tmp_path: Path, sources: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBackend(Scaled(1.0, fail="m2.py"))
    import flopscope.measure.registry as registry

    monkeypatch.setattr(registry, "resolve_backend", lambda name: (fake, "backend fake"))
    out, page = tmp_path / "out", tmp_path / "v.md"
    rc = validation.main(["--models", *sources, "--out", str(out), "--markdown", str(page)])
    assert rc == 1
    assert (out / "results.csv").exists() and "out/results.csv" in page.read_text()
    assert "python -m benchmarks.validation --models" in page.read_text()
