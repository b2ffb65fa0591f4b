"""benchmarks/validation_page.py: the page's tables, CSV and deviation list from stored run JSON
(no valgrind: two fake zoo records, one operator suite record, one transformer record)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import validation_page as page


def _record(source: str, counted: int, measured: int, modules: list[dict[str, Any]] | None = None,
            inputs: tuple[str, ...] = ("1x3x64x64",), **extra: Any) -> dict[str, Any]:
    return {
        "source": source,
        "request": {"source": source, "inputs": list(inputs), "batch": None, "seq_len": None,
                    "config": {}, "dtype": "float64", "depth": 1, "seed": 0},
        "seconds": 12.0,
        "error": None,
        "result": {"counted_macs": counted // 2, "counted_flops": counted,
                   "measured_flops": measured, "ratio": round(measured / counted, 6),
                   "inputs": [f"{inputs[0]}:float64"] if inputs else [],
                   "modules": modules or [], "region_seconds": 1.0, "backend": "valgrind",
                   "notes": []},
        **extra,
    }


def _write(root: Path, group: str, records: list[dict[str, Any]]) -> None:
    runs = root / group / "runs"
    runs.mkdir(parents=True)
    for i, rec in enumerate(records):
        (runs / f"r{i}.json").write_text(json.dumps(rec))


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[page.Group]]:
    root = tmp_path / "validation"
    _write(root, "zoo64", [
        _record("torchvision:resnet18", 1_000_000, 1_010_000),     # 1.0100
        _record("torchvision:mobilenet_v2", 200_000, 210_000, modules=[  # 1.0500: a deviation
            {"path": "", "counted_flops": 0, "measured_flops": 2_000, "ratio": None},
            {"path": "features", "counted_flops": 190_000, "measured_flops": 198_000,
             "ratio": 1.0421},
            {"path": "classifier", "counted_flops": 10_000, "measured_flops": 10_000,
             "ratio": 1.0}]),
    ])
    _write(root, "ops", [_record("benchmarks/validation_ops.py:all_ops", 3_000, 2_000, modules=[
        {"path": "", "counted_flops": 0, "measured_flops": 0, "ratio": None},
        {"path": "matmul__mm__n64", "counted_flops": 1_000, "measured_flops": 1_000, "ratio": 1.0},
        {"path": "pooling__max_pool2d_3x3s2__c16hw32", "counted_flops": 2_000,
         "measured_flops": 1_000, "ratio": 0.5},
    ], inputs=())])
    _write(root, "transformers", [_record(
        "benchmarks/validation_transformers.py:gpt2_causal", 1_000, 800, inputs=(),
        modules=[{"path": "h.0.attn", "counted_flops": 600, "measured_flops": 420, "ratio": 0.7},
                 {"path": "h.0.attn.c_attn", "counted_flops": 400, "measured_flops": 380,
                  "ratio": 0.95}],
        attention={"counted": 600, "executed": 450, "model": 300})])
    gs = [
        page.Group("zoo64", "zoo", "zoo",
                   ("torchvision:resnet18", "torchvision:mobilenet_v2", "torchvision:vgg11"),
                   ("1x3x64x64",)),
        page.Group("ops", "ops", "ops"),
        page.Group("transformers", "tf", "transformers",
                   ("benchmarks/validation_transformers.py:gpt2_causal",)),
    ]
    return root, gs


def test_page_tables_from_stored_json(stored: tuple[Path, list[page.Group]]) -> None:
    root, gs = stored
    md = root.parent / "validation.md"
    md.write_text("# Validation\n\nprose before\n\n" + page.MARK_BEGIN + "\nold\n" + page.MARK_END
                  + "\n\nprose after\n")
    page.write_page(root, md, gs, plot=False)
    text = md.read_text()
    assert text.startswith("# Validation\n\nprose before") and text.endswith("prose after\n")
    assert "old" not in text
    # Zoo: both stored models with ratio, vgg11 listed as not measured yet.
    assert "| resnet18 | resnet | 1x3x64x64 | 500,000 | 1,000,000 | 1,010,000 | **1.0100** |  |" in text
    assert ("| mobilenet_v2 | mobilenet | 1x3x64x64 | 100,000 | 200,000 | 210,000 | **1.0500** | "
            "`features` 1.042 (80%), (outside modules) n/a (20%) |") in text
    assert "| vgg11 | vgg | 1x3x64x64 | - | - | - | not measured yet |  |" in text
    assert ("2 models measured, measured/counted 1.0100 to 1.0500; 1 within 3 %, 1 of the other 1 "
            "with the cause of their gap named per operator family") in text
    # Operators: one row per child module, split into family / op / size; >3 % in bold.
    assert "| matmul | `mm` | n64 | float64 | 1,000 | 1,000 | 1.0000 |" in text
    assert "| pooling | `max_pool2d_3x3s2` | c16hw32 | float64 | 2,000 | 1,000 | **0.5000** |" in text
    assert "| pooling | 1 | 0.5000 - 0.5000 | 0 |" in text
    # Transformers: counted, attention three ways, counted with attention as executed (850).
    # The attention segment is the attention call alone: its projection is a segment of its own.
    assert ("| gpt2_causal | 1,000 | 600 | 450 | 300 | 850 | 800 | 0.8000 | 0.9412 | "
            "600 / 420 (0.7000, own code) |") in text
    # Deviations above 2 %, each with a cause.
    dev = text.split("### Every deviation above 2%")[1]
    assert "- mobilenet_v2 (1x3x64x64): 1.0500" in dev
    assert "`max_pool2d_3x3s2` c16hw32 (pooling): 0.5000 - max pooling executes compares" in dev
    assert "resnet18" not in dev and "`mm`" not in dev
    with open(root / "all_results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["kind"], r["name"], r["ratio"]) for r in rows] == [
        ("zoo", "resnet18", "1.0100"), ("zoo", "mobilenet_v2", "1.0500"), ("zoo", "vgg11", ""),
        ("op", "mm", "1.0000"), ("op", "max_pool2d_3x3s2", "0.5000"),
        ("transformer", "gpt2_causal", "0.8000"),
    ]
    assert rows[-1]["attention_executed"] == "450"


def test_plot_written(stored: tuple[Path, list[page.Group]]) -> None:
    pytest.importorskip("matplotlib")
    root, gs = stored
    page.write_page(root, root.parent / "v.md", gs)
    assert (root / "counted_vs_measured_all.png").stat().st_size > 1000
    assert "counted_vs_measured_all.png" in (root.parent / "v.md").read_text()


def test_families_and_causes() -> None:
    assert page.model_family("resnext50_32x4d") == "resnext"
    assert page.model_family("wide_resnet50_2") == "wide_resnet"
    assert page.model_family("torchvision:efficientnet_v2_s") == "efficientnet"
    assert page.cause_of("nothing/known", (("x", "y"),)) == "not explained yet"
    assert page.cause_of("pooling/max_pool2d", (("max_pool", "compares"),)) == "compares"


def test_op_workload_names_split() -> None:
    from benchmarks import validation_ops as ops

    families = {ops.split_name(n)[0] for n in ops.WORKLOADS}
    assert {"matmul", "conv", "attention", "softmax", "norm", "activation", "pooling",
            "interpolation", "reduction", "cumulative", "fft", "linalg", "sampling", "distance",
            "grouped_gemm", "loss"} <= families
    per_op: dict[tuple[str, str], int] = {}
    # every op at two sizes or more (fft2 is an extra of the FFT family, which has fft at two)
    for n in ops.WORKLOADS:
        f, op, _ = ops.split_name(n)
        per_op[(f, op)] = per_op.get((f, op), 0) + 1
    per_op[("fft", "fft2_c2c")] += 1
    assert min(per_op.values()) >= 2


def test_family_split_sums_module_types(tmp_path: Path) -> None:
    root = tmp_path / "validation"
    modules = [
        {"path": "", "counted_flops": 0, "measured_flops": 0, "ratio": None},
        {"path": "blocks", "counted_flops": 0, "measured_flops": 0, "ratio": None},
        {"path": "blocks.0.act", "counted_flops": 50, "measured_flops": 1_260, "ratio": 25.2},
        {"path": "blocks.1.act", "counted_flops": 50, "measured_flops": 1_260, "ratio": 25.2},
        {"path": "blocks.0.fc", "counted_flops": 10_000, "measured_flops": 10_100, "ratio": 1.01},
        {"path": "blocks.1", "counted_flops": 100, "measured_flops": 0, "ratio": 0.0},
    ]
    rec = _record("torchvision:maxvit_t", 10_200, 12_620, modules=modules, inputs=("1x3x224x224",),
                  module_types={"": "MaxVit", "blocks": "ModuleList", "blocks.0.act": "GELU",
                                "blocks.1.act": "GELU", "blocks.0.fc": "Linear",
                                "blocks.1": "MBConv"},
                  module_ops={"blocks.0.act": {"aten.gelu.default": 50},
                              "blocks.1.act": {"aten.gelu.default": 50},
                              "blocks.0.fc": {"aten.addmm.default": 10_000},
                              "blocks.1": {"aten.add.Tensor": 100}})
    _write(root, "families", [rec])
    rows = page.family_rows(rec)
    # gap 12,620 - 10,200 = 2,420: GELU (2,520 - 100) / 2,420 = 1.0, Linear 100 / 2,420, MBConv
    # -100 / 2,420; the empty root and ModuleList rows are left out.
    assert [(r["type"], r["modules"], r["counted"], r["measured"]) for r in rows] == [
        ("GELU", 2, 100, 2_520), ("Linear", 1, 10_000, 10_100), ("MBConv", 1, 100, 0)]
    assert rows[0]["share"] == pytest.approx(2_420 / 2_420) and rows[0]["ratio"] == 25.2
    md = tmp_path / "v.md"
    page.write_page(root, md, [page.Group("families", "f", "families")], plot=False)
    text = md.read_text()
    assert "**maxvit_t** (1x3x224x224, every module a segment: 6 segments)" in text
    assert "| GELU | 2 | 100 | 2,520 | 25.2000 | 100.0% | gelu 100 |" in text
    assert "| MBConv | 1 | 100 | 0 | 0.0000 | -4.1% | add.Tensor 100 |" in text
    # The zoo row's deviation is named from the split: GELU holds the whole gap (share 1.0 >=
    # 0.99), so it is the one family named, with the operator table's cause of gelu.
    cause = page.family_cause(rec)
    assert cause.endswith("GELU 25.2000 (100.0% of the gap): " + page.cause_of("activation/gelu"))
    zoo = page.zoo_rows([rec])
    assert page.deviations(zoo, [], families=[rec]) == [
        f"- maxvit_t (1x3x224x224): 1.2373 - {cause}"]
    assert "--groups families" in page.deviations(zoo, [])[0]  # no split: how to make one
