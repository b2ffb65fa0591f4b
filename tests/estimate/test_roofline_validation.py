"""The roofline validation's verdicts (benchmarks/roofline_validation.py): the bound is judged
on the case's fastest time against its lowest estimate over every profile of the run, tightness
on the paired median round. No timing is checked here: the machine is stubbed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level package of the repository

from benchmarks import roofline_validation as rv  # noqa: E402

from flopscope.estimate import Hardware  # noqa: E402

GB = 1e9


def _machine(bandwidth_gb_s: float) -> Hardware:
    """A one-bandwidth CPU profile: 100 GFLOP/s fp32, no cache, no special functions."""
    rates = {"fp32": 100 * GB}
    return Hardware("this-machine", bandwidth_gb_s * GB, dict(rates), dict(rates), measured=True)


def test_the_bound_takes_the_lowest_estimate_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rounds whose probes saw 10, 40 and 20 GB/s: a copy of 1M fp32 elements counts
    4 MiB read (source), 4 MiB read (destination, write-allocate) and 4 MiB written, 12 MiB =
    12,582,912 bytes, so its lowest estimate is 12,582,912 / 40e9 s (the 40 GB/s round), and
    its paired estimates are that at 10, 40 and 20 GB/s."""
    seen = iter([10.0, 40.0, 20.0])
    monkeypatch.setattr(rv, "measure_this_machine", lambda **_: _machine(next(seen)))
    a, c = torch.ones(2**20), torch.empty(2**20)
    monkeypatch.setattr(rv, "_cases", lambda: [("copy 1M", True, lambda: (lambda: c.copy_(a)))])
    times = iter([5e-4, 2e-4, 3e-4])
    monkeypatch.setattr(rv, "best_seconds", lambda fn, repeats: next(times))
    hw, [row] = rv.run(repeats=1, rounds=3)
    assert hw.memory_bandwidth == 40 * GB  # the header: the best rate of the run
    assert row["bytes"] == 12 * 2**20
    assert row["estimate_s"] == pytest.approx(12 * 2**20 / (40 * GB))
    assert row["measured_s"] == 2e-4  # the fastest round
    assert row["ratio"] == pytest.approx(2e-4 / (12 * 2**20 / (40 * GB)))
    estimates = [12 * 2**20 / (b * GB) for b in (10, 40, 20)]
    assert [r["estimate_s"] for r in row["rounds"]] == pytest.approx(estimates)
    # paired ratios 5e-4 / 1.26e-3 = 0.40, 2e-4 / 3.1e-4 = 0.64, 3e-4 / 6.3e-4 = 0.48
    paired = sorted(t / e for t, e in zip([5e-4, 2e-4, 3e-4], estimates, strict=True))
    assert (row["paired_min"], row["paired_median"], row["paired_max"]) == pytest.approx(
        tuple(paired))
    assert rv._held(row) == "NO"  # 0.64 < 1: the stub's case beats even the best roof


def _row(**changes: Any) -> dict[str, Any]:
    row = {"case": "c", "large": True, "flops": 0, "bytes": 8, "dram_bytes": 8,
           "intensity": 0.0, "bound": "memory", "estimate_s": 1.0, "compute_s": 0.0,
           "memory_s": 1.0, "measured_s": 1.5, "ratio": 1.5, "paired_median": 1.2,
           "paired_min": 0.9, "paired_max": 1.6, "spread": 0.1, "load_1min": 1.0,
           "contended": False, "rounds": []}
    return row | changes


def test_verdicts() -> None:
    assert rv._held(_row(ratio=1.0)) == "yes"
    assert rv._held(_row(ratio=0.99)) == "NO"  # no tolerance: the fastest run beat the roof
    # compute 0.6 s, memory 1.0 s: within 2x of each other, at the ridge; 0.4 s is not
    assert rv.at_ridge(_row(compute_s=0.6))
    assert rv.at_ridge(_row(compute_s=1.0, memory_s=0.5))
    assert not rv.at_ridge(_row(compute_s=0.4))


def test_markdown_judges_tightness_on_the_paired_median() -> None:
    """A case 2.5x its lowest estimate but 1.8x in the median paired round is within 2x; a
    ridge case 2.2x in the median round is not, and shows measured / (compute + memory):
    3.0 s / (0.9 + 1.0) s = 1.58."""
    rows = [_row(case="tight", ratio=2.5, paired_median=1.8),
            _row(case="ridge", compute_s=0.9, estimate_s=1.0, measured_s=3.0, ratio=3.0,
                 paired_median=2.2)]
    text = rv.markdown(_machine(10.0), rows)
    tight = next(line for line in text.splitlines() if line.startswith("| tight "))
    ridge = next(line for line in text.splitlines() if line.startswith("| ridge "))
    assert "| yes | yes |" in tight
    assert "| yes | no (ridge; 1.58x compute + memory) |" in ridge
    assert "Bounded (estimate on the run's best rates <= the case's " \
        "fastest time): 2 of 2 cases; bounded in every paired round as well: 0. Large cases " \
        "within 2x (paired, median round): 1 of 2." in text
