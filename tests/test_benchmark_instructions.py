"""benchmarks/instructions.py without valgrind: callgrind's client requests do nothing outside
it, so the worker runs as a plain process; and the reading of callgrind's dumps."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level package of the repository

from benchmarks import instructions  # noqa: E402


def test_dumps_are_read_by_their_trigger(tmp_path: Path) -> None:
    for n, (name, total) in enumerate([("empty", 17), ("plain", 1000), ("flopscope", 1500)]):
        (tmp_path / f"cg.out.1.{n + 1}").write_text(
            f"# callgrind format\ndesc: Trigger: Client Request: {name}\n\nevents: Ir\n"
            f"summary: {total}\n\nfn=(1) f\n0 {total}\n\ntotals: {total}\n")
    (tmp_path / "cg.out.1").write_text("")  # the final dump, empty with --instr-atstart=no
    assert instructions._dumps(tmp_path) == {"empty": 17, "plain": 1000, "flopscope": 1500}


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler for the client-request helper")
def test_the_worker_runs_every_tool_outside_valgrind(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ptflops")
    lib = instructions._helper(tmp_path)
    instructions._worker("resnet18", 32, 1, str(lib), True)
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # resnet18 under no_grad: 20 convolutions, 20 batch norms (each with an empty), 17 relu_,
    # 8 add_, a max pool, the average pool (mean), the flatten (view), the linear (t, addmm):
    # 20 + 40 + 17 + 8 + 1 + 1 + 1 + 2 = 90 operator calls
    assert row["model"] == "resnet18" and row["ops"] == 90 and row["repeat"] == 1
