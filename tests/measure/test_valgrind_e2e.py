"""End to end under valgrind: a float64 128x128x128 matmul executes 2*M*N*K FLOPs (within 1 %).

Each test takes about 40-60 s, most of it python start-up and ``import torch`` under valgrind
(not measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flopscope.measure import measure
from flopscope.measure.valgrind import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"valgrind backend unavailable: {unavailable_reason()}"
)


@pytest.mark.slow  # about 30 s under valgrind; the default tier keeps the JIT run below
def test_matmul_float64_measures_2mnk() -> None:
    m, n, k = 128, 128, 128
    a = torch.randn(m, k, dtype=torch.float64)
    b = torch.randn(k, n, dtype=torch.float64)
    stages: list[str] = []
    result = measure(torch.mm, (a, b), backend="valgrind", progress=stages.append)
    expected = 2 * m * n * k
    assert abs(result.flops / expected - 1) < 0.01, (result.flops, expected, result.notes)
    # Everything executed is double precision: no float32 work hides in a float64 matmul.
    assert result.flops_by_precision.get("double", 0) >= 0.99 * result.flops
    assert result.backend == "valgrind"
    assert result.notes[0].startswith("backend valgrind")
    assert any("measured region" in s for s in stages)


def test_float32_conv_counts_jit_code() -> None:
    """oneDNN generates its float32 convolution kernel at run time; the instructions have no file
    behind them and are read from the child's memory.  Without that capture this measures ~0.

    oneDNN's direct convolution skips the taps that fall on zero padding: with a 3x3 kernel,
    padding 1 and a 56x56 image, (56 * 3 - 2)**2 of (56 * 3)**2 taps per channel pair run.
    """
    import torch.nn as nn

    from flopscope.measure import measure_model

    torch.manual_seed(0)
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).eval()
    x = torch.randn(1, 64, 56, 56)
    counted = 2 * 64 * 64 * 9 * 56 * 56
    in_bounds = ((56 * 3 - 2) / (56 * 3)) ** 2
    result = measure_model(conv, x, backend="valgrind")
    single = result.flops_by_precision.get("single", 0)
    assert abs(single / (counted * in_bounds) - 1) < 0.005, (single, counted, result.notes)


LINEAR_FACTORY = """\
import torch
import torch.nn as nn


def factory():
    torch.manual_seed(0)
    return nn.Linear(128, 128, bias=False), torch.randn(128, 128)
"""


@pytest.mark.slow  # about 35 s under valgrind; the default tier keeps the JIT run
def test_cli_measure_file_factory_float64_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The acceptance run of issue 11: a ``file.py:factory`` source, built once in the valgrind
    child (counted there, outside the measured region), measures 2 * 128**3 FLOPs within 1 %."""
    from flopscope.cli import main

    path = tmp_path / "linear.py"
    path.write_text(LINEAR_FACTORY)
    rc = main(["measure", f"{path}:factory", "--dtype", "float64", "--backend", "valgrind",
               "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    expected = 2 * 128**3
    assert doc["backend"] == "valgrind"
    assert doc["counted_flops"] == expected and doc["counted_macs"] == 128**3
    assert abs(doc["measured_flops"] / expected - 1) < 0.01, doc
    assert doc["ratio"] == pytest.approx(doc["measured_flops"] / expected, abs=1e-6)
    assert doc["measured_by_precision"]["double"] >= 0.99 * doc["measured_flops"]
    assert doc["modules"] == [{"path": "", "counted_flops": expected,
                               "measured_flops": doc["measured_flops"], "ratio": doc["ratio"]}]
    assert "backend valgrind" in err and "measured region" in err


MODULE_LIST_FACTORY = """\
import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(128, 128, bias=False) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:  # the ModuleList itself is never called
            x = block(x)
        return x


def factory():
    torch.manual_seed(0)
    return Stack(), torch.randn(128, 128)
"""


@pytest.mark.slow  # about 40 s under valgrind; a ModuleList's segments without it: test_request.py
def test_module_list_items_are_measured_in_its_segment(tmp_path: Path) -> None:
    """maxvit_t keeps its stages in a ModuleList that its forward iterates: the list is a
    top-level segment that is never called.  Its items' code belongs to it (as flopscope counts
    it), not to the code outside the modules (which had 92 % of maxvit_t's measured FLOPs while
    only the segment modules were hooked)."""
    from flopscope.measure import MeasureRequest, measure_request

    path = tmp_path / "stack.py"
    path.write_text(MODULE_LIST_FACTORY)
    result = measure_request(MeasureRequest(f"{path}:factory", dtype="float64"),
                             backend="valgrind")
    expected = 2 * (2 * 128**3)  # two 128x128 @ 128x128 products
    rows = {s.path: s for s in result.comparison.segments}
    assert set(rows) == {"", "blocks"}
    assert rows["blocks"].counted_flops == expected and rows[""].counted_flops == 0
    assert abs(rows["blocks"].measured_flops / expected - 1) < 0.01, rows
    assert rows[""].measured_flops < 0.001 * expected, rows
