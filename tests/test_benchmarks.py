"""The benchmark scripts run end to end on tiny models (no timings are checked here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level package of the repository, not installed

from benchmarks import agreement, document, models, overhead, run, scale, tools  # noqa: E402

THIRD_PARTY = {"thop": "thop", "fvcore": "fvcore", "ptflops": "ptflops",
               "ptflops-aten": "ptflops", "calflops": "calflops"}
TINY_LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


def _need(tool: str) -> None:
    module = THIRD_PARTY.get(tool)
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[bench]')")


@pytest.mark.parametrize("tool", list(tools.TOOLS))
def test_every_tool_counts_the_tiny_cnn(tool: str) -> None:
    _need(tool)
    bench = models.tiny_benches()[0]
    model, inputs = bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu"))
    result = tools.measure(tool, model, inputs, False)
    assert result.error == ""
    # conv 3->8 3x3 on 16x16 (55,296 MACs) and linear 8->10 (80): every tool sees at least these
    assert result.macs is not None and result.macs >= 55_376


def test_backward_is_unsupported_not_an_error_for_forward_only_tools() -> None:
    bench = models.tiny_benches()[0]
    model, inputs = bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu"))
    result = tools.measure("thop", model, inputs, True)
    assert result.macs is None and result.error.startswith("n/a")


def test_agreement_row_of_a_tiny_transformer() -> None:
    bench = models.tiny_benches()[1]
    row = agreement.measure_model(bench, ["flopscope", "FlopCounterMode"])
    assert row["forward"]["flopscope"] > 0
    assert row["backward"]["flopscope"] > row["forward"]["flopscope"]
    assert row["flopscope_uncounted"] == {}
    assert sum(row["where"].values()) == row["forward"]["flopscope"]


def test_overhead_rounds_on_the_tiny_cnn() -> None:
    result = overhead.measure(models.tiny_benches()[0], ["flopscope", "FlopCounterMode"], rounds=2,
                              log=lambda _: None)
    assert set(result["tools"]) == {"flopscope", "FlopCounterMode", overhead.FLOOR}
    assert all(len(t["ratios"]) == 2 for t in result["tools"].values())


@pytest.mark.parametrize("tool", scale.SCALE_TOOLS)
def test_scale_worker_on_a_tiny_decoder(tool: str) -> None:
    row = scale.worker(tool, 8, TINY_LLAMA)
    assert row["macs"] > 0 and row["seconds"] > 0 and row["peak_above_import_mib"] >= 0


def test_run_writes_the_document(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "benchmarks.md"
    code = run.main(["--quick", "--sections", "agreement,overhead", "--rounds", "1",
                     "--results", str(tmp_path / "results"), "--out", str(out)])
    assert code == 0
    text = out.read_text()
    for heading in ("## Units: everything in MACs", "## Agreement", "## Uncounted operators",
                    "## Overhead"):
        assert heading in text
    assert "tiny-llama" in text


def test_document_from_no_results(tmp_path: Path) -> None:
    document.write(tmp_path / "none", tmp_path / "benchmarks.md")
    assert (tmp_path / "benchmarks.md").read_text().startswith("# Benchmarks")


def test_unknown_section_is_a_usage_error() -> None:
    with pytest.raises(SystemExit, match="2"):
        run.main(["--sections", "bogus"])


def test_shape_only_benchmark_on_the_tiny_cnn() -> None:
    from benchmarks import shape_only

    row = shape_only.measure_model("tiny-cnn", rounds=1, log=lambda s: None)
    assert row["macs"] == row["shape_only_macs"] > 0
    assert set(row["ratios"]) == set(shape_only.TOOLS)
    assert row["calls"] > 0
    assert "| tiny-cnn |" in shape_only.markdown({"models": [row], "cold": [], "scale": [],
                                                  "load_before": "0", "load_after": "0"})
