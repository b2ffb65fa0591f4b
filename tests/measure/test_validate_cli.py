"""``flopscope measure`` / ``flopscope validate`` with a FakeBackend (no valgrind run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flopscope.measure as fm
from flopscope.cli import main
from flopscope.measure import FakeBackend, MeasureError, Measurement, Region, counted_segments

MODEL_FILE = """\
import torch
import torch.nn as nn


def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.randn(2, 8)


def nested():
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16)), nn.Linear(16, 4))
    return model, torch.randn(2, 8)


def broken():
    raise RuntimeError("no such weights")
"""


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    path = tmp_path / "models.py"
    path.write_text(MODEL_FILE)
    return str(path)


def scaled(factor: float) -> FakeBackend:
    """A backend that 'measures' the counted FLOPs of each module times ``factor``."""

    def handler(region: Region) -> Measurement:
        assert region.report is not None
        depth = region.depth if region.depth is not None else 1
        segs = {k: round(v * factor) for k, v in counted_segments(region.report, depth).items()}
        total = sum(segs.values())
        return Measurement("fake", total, {"double": total}, segments=segs, notes=("fake run",))

    return FakeBackend(handler)


def use(monkeypatch: pytest.MonkeyPatch, backend: FakeBackend) -> None:
    monkeypatch.setattr(fm, "resolve_backend", lambda name: (backend, "backend fake"))


def test_measure_json(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.0))
    rc = main(["measure", f"{model_file}:tiny", "--dtype", "float64", "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["backend"] == "fake"
    # Linear(8,16): 2*2*8*16 + bias 2*16; ReLU 2*16; Linear(16,4): 2*2*16*4 + bias 2*4
    assert doc["counted_flops"] == 512 + 32 + 32 + 256 + 8
    assert doc["measured_flops"] == doc["counted_flops"] and doc["ratio"] == 1.0
    assert [m["path"] for m in doc["modules"]] == ["", "0", "1", "2"]
    assert doc["modules"][1] == {"path": "0", "counted_flops": 544, "measured_flops": 544,
                                 "ratio": 1.0}
    assert doc["request"]["dtype"] == "float64" and doc["notes"][0] == "backend fake"
    assert "backend fake" in err


def test_measure_table_and_tolerance(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.05))
    rc = main(["measure", f"{model_file}:tiny", "--tolerance", "1%"])
    out, err = capsys.readouterr()
    assert rc == 1  # 5 % is outside 1 %
    assert "measured/counted: 1.05" in out and "(outside)" in out
    assert "outside the tolerance 0.01" in err


def test_measure_table_leaves_out_containers_with_no_code(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.0))
    rc = main(["measure", f"{model_file}:nested", "--depth", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  0") or
            line.startswith("  1")]
    # the inner Sequential "0" holds no code of its own at depth 2 (its Linear is "0.0"): no row;
    # batch 2: 2 * (2 * 8 * 16 + 16) = 544 FLOPs in "0.0", 2 * (2 * 16 * 4 + 4) = 264 in "1"
    assert rows == ["0.0", "1"]
    assert " 544 " in out and " 264 " in out


def test_measure_input_batch_and_depth(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.0))
    rc = main(["measure", f"{model_file}:tiny", "--input", "3x8", "--batch", "5", "--depth", "0",
               "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["counted_flops"] == 5 * (2 * 8 * 16 + 16 + 16 + 2 * 16 * 4 + 4)
    assert [m["path"] for m in doc["modules"]] == [""]


def test_measure_unknown_torchvision_model_is_a_usage_error_before_any_backend_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torchvision")
    rc = main(["measure", "torchvision:resnet5"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "did you mean resnet50" in err and "backend" not in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_measure_bad_options_are_usage_errors(
    model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["measure", f"{model_file}:tiny", "--dtype", "float65"]) == 2
    assert "did you mean float64" in capsys.readouterr().err
    assert main(["measure", f"{model_file}:tiny", "--input", "3by8"]) == 2
    assert "malformed" in (err := capsys.readouterr().err) and "3by8" in err
    assert main(["measure", f"{model_file}:tiny", "--seq-len", "8"]) == 2
    assert "--seq-len applies to hf: sources only" in capsys.readouterr().err
    assert main(["measure", f"{model_file}:tiny", "--backend", "gpu"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["measure", f"{model_file}:tiny", "--output", "/no/such/dir/x.json"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_measure_factory_error_is_a_usage_error(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.0))
    rc = main(["measure", f"{model_file}:broken"])
    _out, err = capsys.readouterr()
    assert rc == 2
    assert "no such weights" in err and "Traceback" not in err


def test_measure_failure_is_a_failed_check(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(_region: Region) -> Measurement:
        raise MeasureError("the measured process failed (exit 1)")

    use(monkeypatch, FakeBackend(fail))
    assert main(["measure", f"{model_file}:tiny"]) == 1
    assert "measured process failed" in capsys.readouterr().err


def test_validate_keeps_going_and_exits_1(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    use(monkeypatch, scaled(1.02))
    rc = main(["validate", f"{model_file}:tiny", f"{model_file}:broken", "--format", "csv",
               "--output", str(tmp_path / "r.csv")])
    _out, err = capsys.readouterr()
    assert rc == 1
    assert f"failed: {model_file}:broken" in err
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("source,dtype,backend")
    assert rows[1].startswith(f"{model_file}:tiny,float64,fake,") and ",1.020" in rows[1]
    assert "no such weights" in rows[2]


def test_validate_table_within_tolerance(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(monkeypatch, scaled(1.02))
    rc = main(["validate", f"{model_file}:tiny", "--tolerance", "3%"])
    out, _err = capsys.readouterr()
    assert rc == 0
    assert "1.02" in out and out.rstrip().endswith("ok")


def test_validate_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    assert main(["validate", "torchvision:resnet18", "torchvision:alexnett"]) == 2
    assert "did you mean alexnet" in capsys.readouterr().err


def test_no_backend_is_a_usage_error(
    model_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flopscope.errors import BackendUnavailableError

    def unavailable(name: str) -> Any:
        raise BackendUnavailableError("backend perf is unavailable: no PMU")

    monkeypatch.setattr(fm, "resolve_backend", unavailable)
    assert main(["measure", f"{model_file}:tiny", "--backend", "perf"]) == 2
    assert "no PMU; choose another --backend" in capsys.readouterr().err
