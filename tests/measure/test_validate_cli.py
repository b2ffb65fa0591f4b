"""validate/measure commands with the measurement replaced by a stub (no valgrind run)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

import flopscope.measure as fm
from flopscope.cli.measure import main
from flopscope.measure import Backend, MeasureError, Measurement
from flopscope.measure.validate import (
    MARK_BEGIN,
    MARK_END,
    results_markdown,
    run_validation,
    update_markdown,
    write_csv,
    write_plot,
)

pytest.importorskip("torchvision")


def _fake_measure(factor: float) -> Any:
    """A measure_source stand-in: 'measures' the counted FLOPs times ``factor``."""

    def measure(
        source: str, *, dtype: str, input_size: int, backend: str, **_kw: Any
    ) -> Measurement:
        import torch

        import flopscope
        from flopscope.measure.validate import counted_segments

        if source.endswith("broken"):
            raise MeasureError("the measured process failed (exit 1)")
        model, inputs = fm.resolve_source(source, dtype=dtype, input_size=input_size)
        with torch.no_grad():
            report = flopscope.count(model, *inputs, warn=False)
        segs = {k: round(v * factor) for k, v in counted_segments(report, model).items()}
        total = sum(segs.values())
        return Measurement("stub", total, {"double": total}, segments=segs, notes=("stub",))

    return measure


def test_run_validation_keeps_partial_results() -> None:
    messages: list[str] = []
    results = run_validation(
        ["squeezenet1_0", "broken"],
        dtype="float64",
        input_size=64,
        backend="valgrind",
        progress=messages.append,
        measure_fn=_fake_measure(1.01),
    )
    ok, bad = results
    assert ok.comparison is not None
    assert ok.comparison.ratio == pytest.approx(1.01, rel=1e-3)
    assert bad.comparison is None and bad.error is not None
    assert any("[2/2 broken]" in m and "FAILED" in m for m in messages)
    assert any("[1/2 squeezenet1_0] counting" in m for m in messages)


def test_outputs(tmp_path: Path) -> None:
    results = run_validation(
        ["squeezenet1_0"], dtype="float64", input_size=64, measure_fn=_fake_measure(1.0)
    )
    write_csv(results, tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["model"] == "squeezenet1_0"
    assert float(rows[0]["ratio"]) == pytest.approx(1.0)
    pytest.importorskip("matplotlib")
    assert write_plot(results, tmp_path / "p.png", "t") is None
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_markdown_section_is_replaced_in_place(tmp_path: Path) -> None:
    page = tmp_path / "validation.md"
    page.write_text(f"# Title\n\nintro\n\n{MARK_BEGIN}\nold\n{MARK_END}\n\n## Analysis\nkept\n")
    results = run_validation(
        ["squeezenet1_0"], dtype="float64", input_size=64, measure_fn=_fake_measure(1.0)
    )
    update_markdown(
        page, results_markdown(results, command="cmd", plot_name="p.png", csv_name="r.csv"), "T"
    )
    text = page.read_text()
    assert "old" not in text and "intro" in text and "## Analysis\nkept" in text
    assert "| squeezenet1_0 | 64x64 |" in text and "![" in text


def test_cli_validate_with_stub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fm, "select_backend", lambda b: (Backend.VALGRIND, {}))
    monkeypatch.setattr(fm, "measure_source", _fake_measure(1.05))
    rc = main(
        [
            "validate",
            "torchvision",
            "--models",
            "squeezenet1_0",
            "--input-size",
            "64",
            "--out",
            str(tmp_path / "out"),
            "--markdown",
            str(tmp_path / "v.md"),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1  # 5 % is outside the default 3 % tolerance
    assert "1.0500" in out and "reduced from 224" in out
    assert "outside tolerance or failed: squeezenet1_0" in err
    assert (tmp_path / "out" / "results.csv").exists()
    assert "out/results.csv" in (tmp_path / "v.md").read_text()


def test_cli_measure_with_stub(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fm, "select_backend", lambda b: (Backend.VALGRIND, {}))
    monkeypatch.setattr(fm, "measure_source", _fake_measure(1.0))
    rc = main(
        [
            "measure",
            "torchvision:squeezenet1_0",
            "--dtype",
            "float64",
            "--input-size",
            "64",
            "--tolerance",
            "0.01",
        ]
    )
    out, _err = capsys.readouterr()
    assert rc == 0
    assert "measured/counted: 1.0000" in out and "features" in out


def test_cli_errors_are_short(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fm, "select_backend", lambda b: (Backend.VALGRIND, {}))
    rc = main(["measure", "torchvision:no_such_model"])
    _out, err = capsys.readouterr()
    assert rc == 1
    assert "unknown torchvision model 'no_such_model'" in err and "Traceback" not in err
    assert main(["validate", "torchvision", "--models", ","]) == 2


def test_cli_unknown_backend_is_usage_error() -> None:
    with pytest.raises(SystemExit, match="2"):
        main(["measure", "torchvision:resnet18", "--backend", "gpu"])
