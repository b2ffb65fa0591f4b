"""A reproducible calibration (issue 29, round 6): every point timed in passes over all the
points, its samples pooled, the samples another process preempted left out where enough others
are left (:func:`flopscope.estimate.timers.robust_median`)."""

from __future__ import annotations

import importlib
import statistics

import pytest
import torch

from flopscope.errors import UsageError
from flopscope.estimate import timers
from flopscope.estimate.timers import Sample, batch_samples, robust_median, rotation_samples


def test_the_median_leaves_out_preempted_samples_where_three_others_are_left() -> None:
    clean = [Sample(1.0, False), Sample(2.0, False), Sample(3.0, False)]
    # three clean samples: their median, 2, whatever the preempted ones took
    assert robust_median([*clean, Sample(10.0, True), Sample(20.0, True)]) == 2.0
    # two clean of four: too few, the median of all four: (2 + 9) / 2
    assert robust_median([Sample(1.0, False), Sample(2.0, False), Sample(9.0, True),
                          Sample(10.0, True)]) == 5.5
    # fewer than three samples in all: every one must be clean to leave the others out
    assert robust_median([Sample(1.0, False), Sample(4.0, False)]) == 2.5
    assert robust_median([Sample(4.0, True)]) == 4.0
    assert robust_median([Sample(1.0, False), Sample(7.0, True)]) == 4.0


def test_a_batch_with_a_context_switch_inside_is_preempted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert timers.switches() >= 0
    calls = []
    samples, once = batch_samples(lambda: calls.append(1), "cpu", budget_s=0.0, batches=4,
                                  once=1.0)
    # once given: a warm-up call, then 4 batches of one call (budget 0 -> at least 1 call)
    assert len(calls) == 5 and once == 1.0 and len(samples) == 4
    ticks = iter(range(10**6))
    monkeypatch.setattr(timers, "switches", lambda: next(ticks))  # a switch in every batch
    samples, _ = batch_samples(lambda: None, "cpu", budget_s=0.0, batches=3)
    assert [s.preempted for s in samples] == [True] * 3
    rounds = rotation_samples([lambda: None] * 2, "cpu", budget_s=0.0, rounds=(3, 3))
    assert [[s.preempted for s in r] for r in rounds] == [[True] * 3] * 2
    monkeypatch.setattr(timers, "switches", lambda: 7)  # never switched
    samples, _ = batch_samples(lambda: None, "cpu", budget_s=0.0, batches=3)
    assert not any(s.preempted for s in samples)


def test_points_pool_their_samples_over_the_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from flopscope.estimate.families import ROTATED_FAMILIES

    module = importlib.import_module("flopscope.estimate.calibrate")
    rotation_calls: dict[int, int] = {}
    budgets: set[float] = set()
    loop_calls: dict[int, int] = {}
    seen_rounds: set[tuple[int, int]] = set()

    def rotation(fns: list[object], device: str, *, budget_s: float = 0.01,
                 rounds: tuple[int, int] = (5, 200)) -> list[list[Sample]]:
        budgets.add(budget_s)
        seen_rounds.add(rounds)
        # pass k of a rotation: 1 ms x (k + 1), and a preempted 1 s
        k = rotation_calls.get(id(fns[0]), 0) if fns else 0
        if fns:
            rotation_calls[id(fns[0])] = k + 1
        return [[Sample(1e-3 * (k + 1), False), Sample(1.0, True)] for _ in fns]

    warmed: list[bool] = []

    def loop(fn: object, device: str, *, budget_s: float = 0.01, batches: int = 3,
             once: float | None = None, warm: bool = True) -> tuple[list[Sample], float]:
        budgets.add(budget_s)
        warmed.append(warm)
        k = loop_calls.get(id(fn), 0)
        loop_calls[id(fn)] = k + 1
        # the first pass sizes the batches; the later ones get its time of one call back
        assert (once is None) == (k == 0)
        return [Sample(2e-3 * (k + 1), False)], 0.5

    monkeypatch.setattr(module, "rotation_samples", rotation)
    monkeypatch.setattr(module, "batch_samples", loop)
    torch.set_num_threads(1)
    with pytest.raises(UsageError, match="passes"):
        module.calibration_points("cpu", passes=0)
    points = module.calibration_points("cpu", budget_s=0.01, passes=4)
    # the first pass: batches of 0.01 / 4 s; the others a pass's share, 3 x 0.01 / 4 s, in
    # int(min(3, max(1, share / 0.5))) = 1 batch of a 0.5 s call, not warmed (3 x 0.5 > share)
    assert budgets == {0.01 / 4, 3 * 0.01 / 4}
    assert warmed.count(True) == len(warmed) // 4
    assert seen_rounds == {(2, 50)}  # ceil(5 / 4) to ceil(200 / 4) rounds a pass
    assert set(loop_calls.values()) == set(rotation_calls.values()) == {4}
    for p in points:
        if p.family in ROTATED_FAMILIES:  # eight samples: 1-4 ms and four preempted (left out)
            assert p.seconds == pytest.approx(statistics.median([1e-3, 2e-3, 3e-3, 4e-3]))
        else:  # four clean samples: 2, 4, 6, 8 ms
            assert p.seconds == pytest.approx(5e-3)


def test_host_probes_take_the_median_of_their_runs() -> None:
    from flopscope.estimate.host_probes import median_rows, median_table

    # add: runs of 1, 5 and 2 us -> 2; view only in two runs: (1 + 3) / 2
    runs = [{"add": 1e-6, "view": 1e-6}, {"add": 5e-6}, {"add": 2e-6, "view": 3e-6}]
    assert median_table(runs) == {"add": 2e-6, "view": 2e-6}
    rows = [{"mm": (1.0, 10.0)}, {"mm": (3.0, 40.0)}, {"mm": (2.0, 20.0)}]
    assert median_rows(rows) == {"mm": (2.0, 20.0)}  # per position: median(1, 3, 2), (10, 40, 20)


def test_calibrate_runs_the_host_probes_before_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.estimate.synthetic import FAST

    module = importlib.import_module("flopscope.estimate.calibrate")
    runs = iter([1e-6, 9e-6, 2e-6])  # one host time per run: the median is 2 us

    def points(device: str, *, budget_s: float, passes: int, progress: object,
               before_pass: object) -> list[object]:
        assert callable(before_pass)
        for p in range(passes):
            before_pass(p)
        return []

    monkeypatch.setattr(module, "calibration_points", points)
    monkeypatch.setattr(module, "host_times", lambda device, calls: {"view": next(runs)})
    monkeypatch.setattr(module, "op_host_times", lambda device, calls: {"view": calls * 1e-6})
    monkeypatch.setattr(module, "evicted_host_times",
                        lambda device, samples: {"view": (float(samples),)})
    after = iter([1e-6, 9e-6, 2e-6])  # the extra after a convolution, one per run: median 2 us
    monkeypatch.setattr(module, "after_host_times",
                        lambda device, samples: {"conv": next(after)})
    cal = module.calibrate(FAST, device="cpu", threads=1, passes=3).calibration
    assert cal is not None
    assert cal.host_after_s == {"conv": 2e-6}
    assert cal.host_s == {"view": 2e-6}
    assert cal.host_op_s == {"view": 133e-6}  # 400 // 3 calls a batch in each run
    assert cal.host_evicted_s == {"view": (3.0,)}  # max(9 // 3, 3) samples a run
