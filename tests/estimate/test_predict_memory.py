"""The prediction's memory mechanisms (issue 29, round 3): a fresh allocation that the allocator
maps anew costs its page faults (training steps: a large embedding's gradient and AdamW's
temporaries of its size), and a streaming call whose inputs the last-level cache no longer
holds (a weight, an optimizer's state) runs at its operator's rate streaming from memory, not
at the rate of a loop that keeps them cached."""

from __future__ import annotations

import dataclasses
import importlib
import platform
import subprocess
import sys

import pytest
import torch
from tests.estimate import synthetic
from tests.estimate.synthetic import FAST, Fn
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import Calibration, Hardware
from flopscope.estimate.calibration import Point

host_probes = importlib.import_module("flopscope.estimate.host_probes")

HOST = {"elementwise": 1e-6, "view": 5e-7}
MIB = 1 << 20


def calibrated(points: tuple[Point, ...], hw: Hardware = FAST, **extra: object) -> Hardware:
    return synthetic.calibrated(points, HOST, hw, date="2026-11-27T00:00:00+00:00", **extra)


# mul: 1e10 B/s of device time (after the 1e-6 s host time) at 1e3-1e8 B
FLAT = (Point("elementwise", "fp32", "mul", 100, 1_000, 1e-6 + 1e-7, op="mul"),
        Point("elementwise", "fp32", "mul", 10**7, 10**8, 1e-6 + 1e-2, op="mul"))


def test_a_fresh_allocation_mapped_anew_pays_its_page_faults() -> None:
    hw = calibrated(FLAT, mmap_bytes=32 * MIB, fault_s_per_byte=1e-9)
    big, small = torch.randn(10 * MIB), torch.randn(MIB // 8)  # outputs of 40 MiB and 512 KiB
    with torch.no_grad():
        _, est_big = flopscope.estimate.roofline(Fn(lambda t: t * 2.0), big, hardware=hw)
        _, est_small = flopscope.estimate.roofline(Fn(lambda t: t * 2.0), small, hardware=hw)
    # 40 MiB read + 40 MiB written at 1e10 B/s, host 1e-6 s, and the 40 MiB output (above
    # glibc's largest mmap threshold, 32 MiB: mapped anew on every run, its chunk 40 MiB and a
    # page, flopscope.estimate.heap) at 1e-9 s per byte
    assert est_big.total.predicted_s == pytest.approx(
        1e-6 + 80 * MIB / 1e10 + (40 * MIB + 4096) * 1e-9, rel=1e-9)
    # 512 KiB output: the heap's memory, kept from run to run: no fault
    assert est_small.total.predicted_s == pytest.approx(1e-6 + MIB / 1e10, rel=1e-9)


def test_a_points_page_faults_are_taken_out_of_its_rate() -> None:
    # the large point allocated 4e7 B fresh (>= 1 MiB): of its 1.1e-2 s, 4e7 x 2.5e-11 = 1e-3 s
    # were page faults, its rate is 1e8 B / 1e-2 s = 1e10 B/s like the small point's
    points = (FLAT[0], Point("elementwise", "fp32", "mul", 10**7, 10**8, 1e-6 + 1.1e-2,
                             op="mul", fresh=4 * 10**7))
    hw = calibrated(points, mmap_bytes=MIB, fault_s_per_byte=2.5e-11)
    x = torch.randn(MIB // 8)  # 512 KiB each way: no fault of its own
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(Fn(lambda t: t * 2.0), x, hardware=hw)
    assert est.total.predicted_s == pytest.approx(1e-6 + MIB / 1e10, rel=1e-9)


# mul: 1e10 B/s in a loop up to 1e6 B (cached), 1e9 B/s at 1e8 B (streaming from memory)
STREAM = (FLAT[0], Point("elementwise", "fp32", "mul", 10**5, 10**6, 1e-6 + 1e-4, op="mul"),
          Point("elementwise", "fp32", "mul", 10**7, 10**8, 1e-6 + 1e-1, op="mul"))


class Weighted(nn.Module):
    """Reads a parameter the run has not touched before (the cache model: from memory), and
    an activation it just wrote (from the cache)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * 2.0) + (x + 0.0) * 2.0


def test_a_call_whose_inputs_left_the_cache_streams_them_from_memory() -> None:
    n = 4096  # 16 KiB tensors
    cached = calibrated(STREAM, dataclasses.replace(FAST, cache_bytes=MIB))
    unknown = calibrated(STREAM)  # no cache capacity: every call at its loop's rate
    model, x = Weighted(n), torch.randn(n)
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(model, x, hardware=cached)
        _, plain = flopscope.estimate.roofline(model, x, hardware=unknown)
    ops = {op: row.predicted_s for op, row in est.by_op.items()}
    by_op_plain = {op: row.predicted_s for op, row in plain.by_op.items()}
    # w * 2.0: 16 KiB read from memory (w untouched in the run), 16 KiB written (fits the
    # cache): half its 32 KiB at the streaming rate (1e9 B/s, the curve's point beyond the
    # 1 MiB cache), half at the loop's 1e10 B/s; (x + 0.0) * 2.0 reads what was just
    # written: the loop's rate. The two muls and the add, each with 1e-6 s of host time:
    w_mul = 0.5 * 32768 / 1e10 + 0.5 * 32768 / 1e9
    x_mul = 32768 / 1e10
    assert ops["aten.mul.Tensor"] == pytest.approx(2e-6 + w_mul + x_mul, rel=1e-9)
    assert by_op_plain["aten.mul.Tensor"] == pytest.approx(2e-6 + 2 * x_mul, rel=1e-9)


def test_without_a_point_beyond_the_cache_the_loops_rate_holds() -> None:
    hw = calibrated(FLAT[:1] + STREAM[1:2], dataclasses.replace(FAST, cache_bytes=MIB))
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(Weighted(4096), torch.randn(4096), hardware=hw)
    # the largest point (1e6 B) is within the 1 MiB cache: no streaming rate is known
    assert est.by_op["aten.mul.Tensor"].predicted_s == pytest.approx(2e-6 + 2 * 32768 / 1e10,
                                                                     rel=1e-9)


def test_fault_fields_round_trip_and_bad_ones_are_clear_errors() -> None:
    cal = Calibration("d", "cpu", 1, points=(FLAT[0], dataclasses.replace(FLAT[1], fresh=123)),
                      mmap_bytes=32 * MIB, fault_s_per_byte=4e-10)
    again = Calibration.from_dict(cal.to_dict())
    assert again.mmap_bytes == 32 * MIB and again.fault_s_per_byte == 4e-10
    assert again.points[1].fresh == 123 and again.points[0].fresh == 0
    assert again.fault_s(32 * MIB) == pytest.approx(32 * MIB * 4e-10)
    assert again.fault_s(32 * MIB - 1) == 0.0
    old = cal.to_dict()
    del old["mmap_bytes"], old["fault_s_per_byte"]
    assert Calibration.from_dict(old).fault_s(1 << 40) == 0.0  # files before it: not modelled
    bad = {**cal.to_dict(), "fault_s_per_byte": -1}
    with pytest.raises(UsageError, match="module_call_s must not be negative"):
        Calibration.from_dict(bad, where="cpu.json")
    with pytest.raises(UsageError, match="module_call_s must be numbers"):
        Calibration.from_dict({**cal.to_dict(), "mmap_bytes": "lots"}, where="cpu.json")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_fault_cost_measures_glibcs_fresh_mappings() -> None:
    # in a fresh process, as `flopscope calibrate` runs it first (a test process's heap may
    # hold enough free memory to serve the allocation without a fault)
    code = ("import torch; torch.set_num_threads(1); import importlib; "
            "print(*importlib.import_module('flopscope.estimate.host_probes').fault_cost("
            "'cpu', samples=2))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert int(out[0]) == 32 * MIB  # above glibc's largest dynamic mmap threshold
    assert float(out[1]) >= 0.0
    assert host_probes.fault_cost("cuda") == (0, 0.0)  # CUDA's caching allocator


def test_each_module_call_adds_pythons_time_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)])
    x = torch.randn(2, 4)
    without = calibrated(FLAT)
    with_modules = calibrated(FLAT, module_call_s=1e-6)
    for backward in (False, True):
        _, base = flopscope.estimate.roofline(model, x, hardware=without, backward=backward)
        _, est = flopscope.estimate.roofline(model, x, hardware=with_modules, backward=backward)
        # 10 module calls: the outer Sequential, 3 inner ones, 3 Linear, 3 ReLU; none in the
        # backward (autograd runs it outside the modules' calls)
        assert est.total.predicted_s - base.total.predicted_s == pytest.approx(10e-6, rel=1e-9)
        assert est.total.host_s - base.total.host_s == pytest.approx(10e-6, rel=1e-9)
        # the first ReLU's own call: 1e-6 s in its row
        assert (est.by_module["0.1"].predicted_s - base.by_module["0.1"].predicted_s
                == pytest.approx(1e-6, rel=1e-9))
    # profile's per-call prediction (its predicted column) counts them the same way
    runs = [flopscope.profile(model, x, hardware=hw, repeat=1, warmup=0)[1]
            for hw in (without, with_modules)]
    sums = [sum(c.bound.predicted_s for c in t.calls if c.bound is not None) for t in runs]
    assert sums[1] - sums[0] == pytest.approx(10e-6, rel=1e-9)


def test_module_call_time_is_measured() -> None:
    torch.set_num_threads(1)
    seconds = host_probes.module_call_time("cpu", modules=20, samples=3)
    assert 0.0 <= seconds < 1e-3
    cal = Calibration("d", "cpu", 1, module_call_s=1.5e-6)
    assert Calibration.from_dict(cal.to_dict()).module_call_s == 1.5e-6
    with pytest.raises(UsageError, match="module_call_s must not be negative"):
        Calibration.from_dict({**cal.to_dict(), "module_call_s": -1.0}, where="cpu.json")


# products (host 2e-6 s a call): a 64 x 64 x 64 product in a loop (cached) at 1e10 FLOP/s; an
# M = 1 product of 1024 x 1024 weights (4,202,496 bytes, past the 1 MiB cache) streamed at 1e9 B/s
PRODUCTS = (Point("matmul", "fp32", "mm 64x64x64", 2 * 64**3, 3 * 4 * 64 * 64,
                  2e-6 + 2 * 64**3 / 1e10, op="mm", reduction=64),
            Point("matmul", "fp32", "mm 1x1024x1024", 2 * 1024 * 1024,
                  4 * (1024 + 1024 * 1024 + 1024), 2e-6 + 4 * (1024 + 1024 * 1024 + 1024) / 1e9,
                  op="mm", reduction=1024))


def test_a_cold_products_floor_is_on_its_bytes_not_its_flops() -> None:
    # a product whose operands the cache no longer holds reads them from memory at least once,
    # at the rate the streamed products read theirs (1e9 B/s); a product of high intensity
    # reuses what it reads, so that floor is below its compute time and its rate holds. The
    # floor used to be on its FLOPs at the streamed products' FLOP rate (5e8, at intensity
    # 0.5): 2/3 x 2 x 64^3 / 5e8 = 7.0e-4 s for a product of 5.2e-5 s (13x; a 2048^3 product
    # on this machine 1.2x, 3072^3 1.9x)
    hw = synthetic.calibrated(PRODUCTS, {"matmul": 2e-6, "view": 5e-7},
                              dataclasses.replace(FAST, cache_bytes=MIB),
                              date="2026-11-27T00:00:00+00:00")
    linear = nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(linear, torch.randn(64, 64), hardware=hw)
    mm = est.by_op["aten.mm.default"]
    # the weight and the input cold (never touched in the run), the output into the cache:
    # 2/3 of its 49,152 bytes from memory, 3.3e-5 s at 1e9 B/s, under its 5.2e-5 s at the
    # point's 1e10 FLOP/s (its coordinates are the point's)
    assert mm.predicted_s == pytest.approx(2e-6 + 2 * 64**3 / 1e10, rel=1e-9)
    # batch 1: 64 + 4,096 of its 4,224 elements cold, 16,640 bytes at 1e9 B/s (1.66e-5 s),
    # far above its compute at any of the curve's rates (8,192 FLOPs): the floor holds
    with torch.no_grad():
        _, est = flopscope.estimate.roofline(linear, torch.randn(1, 64), hardware=hw)
    assert est.by_op["aten.mm.default"].predicted_s == pytest.approx(
        2e-6 + 4 * (64 + 64 * 64) / 1e9, rel=1e-9)
