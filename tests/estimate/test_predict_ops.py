"""The prediction per operator (issue 29, round 2): a call takes its own ATen operator's points
and host time where the calibration has them, the family's otherwise; pooling's work is its
window operations; the calibration records the operator of every point and the host time of
each operator's tiny call."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from tests.estimate.synthetic import FAST, Fn, calibrated
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import Calibration, Hardware, load_hardware
from flopscope.estimate.calibration import Point
from flopscope.estimate.host_probes import op_host_times
from flopscope.estimate.workloads import host_calls, workloads

HOST = {"elementwise": 1e-6, "pooling": 1e-6, "view": 5e-7}
HOST_OP = {"sqrt": 3e-6}
POINTS = (
    # the family's curve: add, 1e4 B in 1e-6 s of device time (1e10 B/s) at every size
    Point("elementwise", "fp32", "add", 1_000, 10_000, 2e-6, op="add"),
    Point("elementwise", "fp32", "add", 100_000, 1_000_000, 1e-6 + 1e-4, op="add"),
    # sqrt's own: 1e4 B in 4e-6 s of device time after its 3e-6 s host time (2.5e9 B/s)
    Point("elementwise", "fp32", "sqrt", 1_000, 10_000, 3e-6 + 4e-6, op="sqrt"),
    # max pooling: 1e5 window operations in 1e-4 s of device time (1e9 per second)
    Point("pooling", "fp32", "max_pool2d", 100_000, 50_000, 1e-6 + 1e-4,
          op="max_pool2d_with_indices"),
)


def synthetic(points: tuple[Point, ...] = POINTS) -> Hardware:
    return calibrated(points, HOST, host_op_s=HOST_OP)


def test_a_call_takes_its_own_operators_points_and_host_time() -> None:
    x = torch.rand(1024) + 1  # sqrt: reads and writes 4096 B each = 8192 B
    _, est = flopscope.estimate.roofline(Fn(torch.sqrt), x, hardware=synthetic())
    # sqrt's rate 2.5e9 B/s (its one point), sqrt's host time 3e-6 s
    assert est.total.predicted_s == pytest.approx(3e-6 + 8192 / 2.5e9, rel=1e-12)
    assert est.total.host_s == pytest.approx(3e-6)


def test_an_operator_without_points_takes_its_familys() -> None:
    x = torch.rand(1024)  # x - x: 12288 B; no sub points: the family's curve and host time
    _, est = flopscope.estimate.roofline(Fn(lambda t: t - t), x, hardware=synthetic())
    # the family's curve holds every operator's points: at 1e4 B add's 1e10 and sqrt's 2.5e9
    # B/s (their mean log rate), at 1e6 B add's 1e10; 12288 B lies between, linearly in log
    low = (10 + math.log10(2.5e9)) / 2
    rate = 10 ** (low + (10 - low) * (math.log10(12288) - 4) / 2)
    assert est.total.predicted_s == pytest.approx(1e-6 + 12288 / rate, rel=1e-12)


def test_pooling_work_is_its_window_operations() -> None:
    x = torch.randn(1, 16, 32, 32)
    hw = synthetic()
    with torch.no_grad():
        _, s2 = flopscope.estimate.roofline(Fn(lambda t: nn.functional.max_pool2d(t, 3, 2, 1)),
                                            x, hardware=hw)
        _, s1 = flopscope.estimate.roofline(Fn(lambda t: nn.functional.max_pool2d(t, 3, 1, 1)),
                                            x, hardware=hw)
    # 3x3 windows: 9 operations per output; 16 x 16 x 16 outputs at stride 2, 16 x 32 x 32 at 1
    assert s2.total.flops == 9 * 16 * 16 * 16 and s1.total.flops == 9 * 16 * 32 * 32
    # at the one point's 1e9 operations per second, after the pooling host time
    assert s2.total.predicted_s == pytest.approx(1e-6 + 9 * 16**3 / 1e9, rel=1e-12)
    assert s1.total.predicted_s == pytest.approx(1e-6 + 9 * 16 * 32**2 / 1e9, rel=1e-12)


def test_operators_and_host_times_round_trip(tmp_path: Path) -> None:
    hw = synthetic()
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(hw.to_dict()))
    data = json.loads(path.read_text())["calibration"]
    assert data["host_op_s"] == HOST_OP and data["points"][2]["op"] == "sqrt"
    (loaded,) = load_hardware(path)
    assert loaded == hw
    # a file without them (written before) reads with no operator curves or host times
    for p in data["points"]:
        del p["op"]
    del data["host_op_s"]
    old = Calibration.from_dict(data)
    assert old.host_op_s == {} and {p.op for p in old.points} == {""}


def test_bad_operator_host_times_are_a_clear_error() -> None:
    data = synthetic().to_dict()
    data["calibration"]["host_op_s"] = ["sqrt"]
    with pytest.raises(UsageError, match="cal.json: calibration: host_op_s must be a table"):
        Hardware.from_dict(data, where="cal.json")
    data["calibration"]["host_op_s"] = {"sqrt": "fast"}
    with pytest.raises(UsageError, match="host_op_s: could not convert string"):
        Hardware.from_dict(data, where="cal.json")


def test_every_workload_is_one_operator_the_prediction_recognises() -> None:
    from flopscope.estimate.timers import counted_call

    with torch.no_grad():
        for w in workloads("cpu"):
            c = counted_call(w.fn)
            fam, flops, nbytes, op, calls = c.family, c.flops, c.bytes, c.op, c.calls
            assert op, w.what
            assert flops or nbytes, w.what
            # one ATen call each (a view beside a product is the only extra allowed)
            assert calls == 1 or (fam == "matmul" and calls <= 2), (w.what, calls)


def test_the_attention_points_hold_a_decode_steps_one_query_token() -> None:
    """Round 12: a decode step's attention (one query token per sequence against its KV cache)
    reads the keys and values at about 0.5 FLOP per byte; the square points are at 16 and
    more, and their rate predicted it at 1/7-1/12 of its measured time (benchmarks
    .decode_diagnosis). The calibration has points of that shape, rotated in their own group."""
    from flopscope.estimate.timers import counted_call

    with torch.no_grad():
        short = {w.what: counted_call(w.fn) for w in workloads("cpu")
                 if w.group == "attention, one query token"}
    assert len(short) == 6
    assert all(c.family == "attention" and c.flops / c.bytes < 0.52 for c in short.values())
    c = short["sdpa 4x1x128x64"]
    # 4 heads, 1 query, 128 keys of 64: q.k^T and p.v 2 x 2 x 4 x 128 x 64 = 131,072 FLOPs,
    # the softmax 6 per score, 4 x 128 x 6 = 3,072
    assert c.flops == 131_072 + 3_072
    # q and the output 4 x 64 x 4 B each, keys and values 2 x 4 x 128 x 64 x 4 B, the
    # log-sum-exp 4 x 4 B
    assert c.bytes == 1_024 + 262_144 + 1_024 + 16


def test_operator_host_times_cover_the_workloads_operators() -> None:
    torch.set_num_threads(1)
    host = op_host_times("cpu", calls=5)
    assert {"addmm", "convolution", "sqrt", "add_", "addcdiv_", "native_batch_norm",
            "max_pool2d_with_indices", "embedding_dense_backward", "view", "empty"} <= set(host)
    assert all(0 < s < 1e-2 for s in host.values())
    assert len(host_calls("cpu")) >= len(host)


def test_one_thread_on_the_cpu_is_timed_by_the_threads_cpu_time() -> None:
    import time

    from flopscope.estimate.timers import clock, time_per_call

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert clock("cpu")[0] == "thread CPU time" and clock("cuda")[0] == "wall"
        # a call that waits (as a process does while others hold the core) costs no CPU time
        assert time_per_call(lambda: time.sleep(0.002), "cpu", budget_s=0.004) < 1e-3
        torch.set_num_threads(2)
        assert clock("cpu")[0] == "wall"  # two threads' CPU times add up past the wall time
        assert time_per_call(lambda: time.sleep(0.002), "cpu", budget_s=0.004) >= 0.002
    finally:
        torch.set_num_threads(before)


def test_host_time_grows_with_the_bytes_moved_since_the_operators_last_call() -> None:
    hot = {"add": 1e-6}
    # after 2^18 and 2^20 bytes moved: add's tiny call takes 3 and 5 us (2 and 4 us more)
    cal = Calibration("2026-11-26T00:00:00+00:00", "cpu (test)", 1, {}, HOST, POINTS,
                      host_op_s=hot, host_evicted_s={"add": (3e-6, 5e-6)},
                      evictions=(1 << 18, 1 << 20))
    hw = dataclasses.replace(FAST, calibration=cal)

    class AddMulAdd(nn.Module):
        def forward(self, x: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
            a = x + x
            big * 2
            return a + x

    x, big = torch.randn(1024), torch.randn(1 << 20)
    _, est = flopscope.estimate.roofline(AddMulAdd(), x, big, hardware=hw)
    # first add: nothing moved before it (hot, 1 us); second: the mul moved big's 4 MiB and
    # its 4 MiB output since, 2^23 B, past the largest size measured: 1 + 4 us
    assert est.by_op["aten.add.Tensor"].host_s == pytest.approx(1e-6 + 5e-6, rel=1e-12)
    # mul, no tiny call of its own: the family's 1 us plus the median operator's growth after
    # the 2^13 B the first add moved (x and its output): 2 us x (13 - 12) / (18 - 12), linear
    # in log2(bytes) from none at 4 KiB to 2 us at 2^18 B
    assert est.by_op["aten.mul.Tensor"].host_s == pytest.approx(1e-6 + 2e-6 / 6, rel=1e-12)


def test_evicted_host_times_are_measured_per_operator() -> None:
    from flopscope.estimate.host_probes import EVICTIONS, evicted_host_times

    torch.set_num_threads(1)
    table = evicted_host_times("cpu", samples=1)
    assert {"add", "convolution", "view"} <= set(table)
    assert all(len(v) == len(EVICTIONS) and min(v) > 0 for v in table.values())
    assert evicted_host_times("cuda") == {}  # the device's memory is not the host's caches


def test_layer_like_points_are_timed_in_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from flopscope.estimate.families import ROTATED_FAMILIES
    from flopscope.estimate.timers import Sample

    # the module (the package's ``calibrate`` attribute is the function of that name)
    module = importlib.import_module("flopscope.estimate.calibrate")

    rotated: list[int] = []
    real = module.rotation_samples

    def spy(fns: list[object], device: str, *, budget_s: float = 0.01,
            rounds: tuple[int, int] = (5, 200)) -> list[list[Sample]]:
        rotated.append(len(fns))
        return [[Sample(1e-3, False)] for _ in fns]

    monkeypatch.setattr(module, "rotation_samples", spy)
    monkeypatch.setattr(module, "batch_samples",
                        lambda fn, device, budget_s=0.01, once=None: ([Sample(2e-3, False)], 1.0))
    torch.set_num_threads(1)
    points = module.calibration_points("cpu", budget_s=1e-4, passes=1)
    for p in points:  # the rotated families' points took the rotation's time, the rest a loop's
        assert p.seconds == (1e-3 if p.family in ROTATED_FAMILIES else 2e-3), p.what
    assert sum(rotated) == sum(p.family in ROTATED_FAMILIES for p in points) > 0
    # the real rotation calls each function once per round (a warm-up and at least 5 rounds)
    counts = [0, 0]

    def call(i: int) -> None:
        counts[i] += 1

    times = real([lambda: call(0), lambda: call(1)], "cpu", budget_s=0.0)
    assert len(times) == 2 and [len(t) for t in times] == [5, 5]
    assert counts[0] == counts[1] == 6


def test_convolutions_are_interpolated_by_their_reduction_length() -> None:
    from flopscope.estimate.timers import counted_call

    x = torch.randn(1, 32, 28, 28)
    depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    with torch.no_grad():
        c = counted_call(lambda: depthwise(x))
    assert c.reduction == 9  # MACs per output: 1 channel per group x a 3x3 window
    # two points of the depthwise call's FLOPs and bytes, one at its reduction length and one
    # at a dense convolution's (32 x 9 = 288), at 1e9 and 1e10 FLOP/s of device time
    points = (Point("conv", "fp32", "dw", c.flops, c.bytes, 1e-6 + c.flops / 1e9, op=c.op,
                    reduction=9),
              Point("conv", "fp32", "dense", c.flops, c.bytes, 1e-6 + c.flops / 1e10, op=c.op,
                    reduction=288))
    hw = dataclasses.replace(FAST, calibration=Calibration(
        "2026-11-26T00:00:00+00:00", "cpu (test)", 1, {}, {"conv": 1e-6}, points))
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(depthwise, x, hardware=hw)
    # at distance 0 from the depthwise point: its rate, not the two's mean
    assert est.total.predicted_s == pytest.approx(1e-6 + c.flops / 1e9, rel=1e-9)


@pytest.mark.filterwarnings("ignore:flopscope. the model was counted in training mode")
def test_batch_norm_in_training_takes_the_training_points() -> None:
    x = torch.randn(1, 16, 32, 32)
    bn = nn.BatchNorm2d(16)
    op = "aten.native_batch_norm.default"
    counts = {}
    for training in (False, True):
        bn.train(training)
        with torch.no_grad():
            _, est = flopscope.estimate.roofline(bn, x, hardware=FAST)
        counts[training] = (est.by_op[op].flops, est.by_op[op].bytes)
    (ev_flops, ev_bytes), (tr_flops, tr_bytes) = counts[False], counts[True]
    assert tr_flops > 2 * ev_flops  # statistics computed: more FLOPs per byte
    # eval at 1e10 B/s, training at 1e9 B/s, both after 1 us of host time
    points = (Point("normalization", "fp32", "eval", ev_flops, ev_bytes, 1e-6 + ev_bytes / 1e10,
                    op="native_batch_norm"),
              Point("normalization", "fp32", "train", tr_flops, tr_bytes, 1e-6 + tr_bytes / 1e9,
                    op="native_batch_norm"))
    hw = dataclasses.replace(FAST, calibration=Calibration(
        "2026-11-26T00:00:00+00:00", "cpu (test)", 1, {}, {"normalization": 1e-6}, points))
    for training, rate, nbytes in ((False, 1e10, ev_bytes), (True, 1e9, tr_bytes)):
        bn.train(training)
        with torch.no_grad():
            _, est = flopscope.estimate.roofline(bn, x, hardware=hw)
        # at distance 0 from its own mode's point: that point's rate, not the two's mean
        assert est.by_op[op].predicted_s == pytest.approx(1e-6 + nbytes / rate, rel=1e-9)


def test_a_small_rotated_point_is_a_rate() -> None:
    # a product's point timed in rotation: 1 us of host time, 0.5 us more (what a model's call
    # pays with its code and weights evicted): under half its time, still its rate
    pts = (Point("matmul", "fp32", "mm 8", 1024, 768, 1.5e-6, op="mm", reduction=8),)
    hw = dataclasses.replace(FAST, calibration=Calibration(
        "2026-11-26T00:00:00+00:00", "cpu (test)", 1, {}, {"matmul": 1e-6}, pts))
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    _, est = flopscope.estimate.roofline(Fn(lambda t: t @ b), a, hardware=hw)
    # 1024 FLOPs at 1024 / 0.5e-6 FLOP/s (the same shape: distance 0) after 1 us of host time
    assert est.total.predicted_s == pytest.approx(1e-6 + 0.5e-6, rel=1e-9)
    assert est.total.uncalibrated_s == 0


def test_attentions_safe_softmax_is_timed_and_predicted_as_its_own_operator() -> None:
    from flopscope.estimate.timers import counted_call

    # the math path of scaled_dot_product_attention (training on a CPU) normalises by
    # _safe_softmax, four kernels counted as one element-wise call: the calibration times it
    ops = {counted_call(w.fn).op for w in workloads("cpu") if w.what.startswith("_safe_softmax")}
    assert ops == {"_safe_softmax"}
    # with its own point, 8,192 B in 8e-6 s of device time (1.024e9 B/s) after the family's
    # 1e-6 s host time, a call of 4 rows of 256 (4,096 B read, 4,096 B written) takes that rate,
    # not add's 1e10 B/s
    safe = Point("elementwise", "fp32", "_safe_softmax 2^10", 5 * 1_024, 8_192, 1e-6 + 8e-6,
                 op="_safe_softmax")
    x = torch.randn(4, 256)
    _, est = flopscope.estimate.roofline(Fn(lambda t: torch.ops.aten._safe_softmax(t, -1)), x,
                                         hardware=synthetic((*POINTS, safe)))
    assert est.total.predicted_s == pytest.approx(1e-6 + 8_192 / 1.024e9, rel=1e-12)


def test_a_call_after_a_convolution_or_a_product_takes_the_calibrations_extra_host_time() -> None:
    import torch.nn.functional as F

    # the tiny call after a convolution takes 4 us more than after an add of its bytes, after
    # a product 3 us; after an element-wise call -1 us (measured lower: never taken below 0)
    cal = Calibration("2026-11-28T00:00:00+00:00", "cpu (test)", 2, {}, HOST, POINTS,
                      host_op_s={"relu": 2e-6, "add": 1e-6},
                      host_after_s={"conv": 4e-6, "matmul": 3e-6, "elementwise": -1e-6})
    hw = dataclasses.replace(FAST, calibration=cal)

    class M(nn.Module):
        def forward(self, img: torch.Tensor, w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
            F.relu(F.conv2d(img, w))  # conv first (after nothing), relu after it
            torch.mm(a, a)
            F.conv2d(img, w)  # after a product, but a rotated family: its points hold it
            s = a + a  # after a convolution
            t = s + s  # after an element-wise call
            return t + torch.mm(a, a)  # after a product

    img, w, a = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3), torch.randn(8, 8)
    _, est = flopscope.estimate.roofline(M(), img, w, a, hardware=hw)
    by_op = {op.split(".")[1]: row.host_s for op, row in est.by_op.items()}
    assert by_op["relu"] == pytest.approx(2e-6 + 4e-6, rel=1e-12)
    # three adds: 1 + 4 us (after the convolution), 1 + max(-1, 0) us (after the add),
    # 1 + 3 us (after the product) = 10 us
    assert by_op["add"] == pytest.approx(10e-6, rel=1e-12)
    # the convolutions and products: no tiny call of their own, the element-wise family's
    # 1 us each, no extra (rotation-timed families)
    assert by_op["convolution"] == pytest.approx(2e-6, rel=1e-12)
    assert by_op["mm"] == pytest.approx(2e-6, rel=1e-12)
    # without the measurement (files before round 9) the host time is the operator's alone
    plain = dataclasses.replace(FAST, calibration=dataclasses.replace(cal, host_after_s={}))
    _, est = flopscope.estimate.roofline(M(), img, w, a, hardware=plain)
    assert est.by_op["aten.add.Tensor"].host_s == pytest.approx(3e-6, rel=1e-12)


def test_the_call_before_is_recorded_and_stored_with_the_calibration() -> None:
    from flopscope.core.counter import Counter
    from flopscope.estimate.roofline import CallLog

    log = CallLog()
    x = torch.randn(8, 8)
    with Counter(warn=False, observers=[log]):
        torch.relu(torch.mm(x, x)).sum()
    assert [r.after for r in log.records] == ["", "matmul", "elementwise"]
    cal = Calibration("2026-11-28T00:00:00+00:00", "cpu (test)", 2, {}, HOST, POINTS,
                      host_after_s={"conv": 4e-6, "matmul": 3e-6})
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.host_after_s == {"conv": 4e-6, "matmul": 3e-6}
    with pytest.raises(UsageError, match="host_after_s: unknown family"):
        Calibration.from_dict({**cal.to_dict(), "host_after_s": {"lstm": 1e-6}})


def test_after_host_times_are_measured_per_family_of_the_call_before() -> None:
    from flopscope.estimate.host_probes import after_host_times

    table = after_host_times("cpu", samples=1)
    assert set(table) == {"conv", "matmul"}
    assert all(math.isfinite(v) and abs(v) < 1e-2 for v in table.values())
    assert after_host_times("cuda") == {}


def test_the_convolutions_include_channel_counts_off_onednns_blocks() -> None:
    # round 12: at 2 threads PyTorch runs a 1x1 convolution through oneDNN, which reorders its
    # input and output to 16-channel blocks each call, padded where the count is not a multiple
    # of 16 (shufflenet_v2's 24 -> 58 over 56 x 56: 334 of its 533 us in the reorders); the
    # calibration had no 1x1 or depthwise point off the blocks beyond 24 -> 144
    import re

    off = set()
    for w in workloads("cpu"):
        m = re.match(r"conv2d (\d+)->(\d+) (\d+)x\d+ k(\d) s1 g(\d+)", w.what)
        if m is None:
            continue
        cin, cout, side, k, groups = map(int, m.groups())
        if cin % 16 and cout % 16 and side >= 14:
            off.add("1x1" if k == 1 and groups == 1 else "depthwise" if groups == cin else "")
    assert {"1x1", "depthwise"} <= off
