"""The roofline arithmetic on shipped profiles, exactly, and its sums."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.estimate import PROFILES, CallLog, roofline

H100 = PROFILES["h100-sxm"]


def _log(fn: object) -> CallLog:
    log = CallLog()
    with flopscope.Counter(warn=False, observers=[log]):
        fn()  # type: ignore[operator]
    return log


def test_bf16_gemm_on_h100_is_compute_bound() -> None:
    m = n = k = 4096
    a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    b = torch.empty(k, n, dtype=torch.bfloat16, device="meta")
    est = _log(lambda: torch.mm(a, b)).estimate(H100, tf32=False)
    row = est.by_op["aten.mm.default"]
    # compute: 2MNK = 137,438,953,472 FLOPs / 989.5e12 = 1.3890e-4 s
    # memory: (MK + KN + MN) * 2 bytes = 100,663,296 B / 3.35e12 = 3.0049e-5 s
    assert row.flops == 2 * m * n * k == 137_438_953_472
    assert row.bytes == 3 * 4096 * 4096 * 2 == 100_663_296
    assert row.compute_s == 137_438_953_472 / 989.5e12
    assert row.memory_s == 100_663_296 / 3.35e12
    assert row.time_s == max(row.compute_s, row.memory_s) == pytest.approx(1.38897e-4, rel=1e-4)
    assert row.bound == "compute"
    assert row.intensity == 137_438_953_472 / 100_663_296  # 1365.3 FLOP/B


def test_bf16_gemv_on_h100_is_memory_bound() -> None:
    a = torch.empty(1, 4096, dtype=torch.bfloat16, device="meta")
    b = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    row = _log(lambda: torch.mm(a, b)).estimate(H100).total
    # bytes: (4096 + 4096*4096 + 4096) * 2 = 33,570,816 / 3.35e12 = 1.0021e-5 s
    # compute: 2 * 4096 * 4096 = 33,554,432 / 989.5e12 = 3.39e-8 s
    assert row.bytes == 33_570_816
    assert row.time_s == 33_570_816 / 3.35e12
    assert row.bound == "memory"


def test_fp32_products_use_tf32_only_when_asked() -> None:
    a = torch.empty(1024, 1024, device="meta")
    log = _log(lambda: a @ a)
    flops = 2 * 1024**3  # 2,147,483,648; bytes 3 * 4 MiB = 12,582,912 (3.76e-6 s)
    assert log.estimate(H100, tf32=False).total.time_s == flops / 67e12  # CUDA cores: 3.21e-5 s
    assert log.estimate(H100, tf32=True).total.time_s == flops / 494.5e12  # 4.34e-6 s


def test_elementwise_chain_fused_view() -> None:
    x = torch.empty(1024, device="meta")
    est = _log(lambda: x.exp().mul(2.0)).estimate(H100)
    # exp reads 4 KiB, writes 4 KiB; mul reads it back and writes 4 KiB: 16,384 bytes;
    # fused: exp's write and mul's read of the intermediate dropped: 8,192 bytes
    assert est.total.bytes == 16_384
    assert est.total.fused_bytes == 8_192
    assert est.total.time_s == 2 * 8_192 / 3.35e12
    assert est.total.fused_time_s == 2 * 4_096 / 3.35e12


def test_matmul_then_elementwise_is_not_fused() -> None:
    a = torch.empty(64, 64, device="meta")
    est = _log(lambda: (a @ a).relu()).estimate(H100)
    assert est.total.fused_bytes == est.total.bytes


def test_sums_per_module_op_and_phase() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    report, est = roofline(model, torch.randn(4, 64), hardware="a100-80gb", backward=True)
    assert est.total.flops == report.flops
    assert est.total.bytes == report.total().bytes
    assert sum(r.time_s for r in est.by_op.values()) == pytest.approx(est.total.time_s)
    assert sum(r.time_s for r in est.by_phase.values()) == pytest.approx(est.total.time_s)
    assert set(est.by_phase) == {"forward", "backward"}
    assert est.by_module[""].time_s == pytest.approx(est.total.time_s)
    assert est.by_module["0"].flops == report.by_module()["0"].inclusive.flops
    assert est.share(est.total) == 1.0
    d = est.to_dict()
    assert d["kind"] == "roofline lower bound" and d["hardware"]["name"] == "a100-80gb"
    assert d["by_module"]["2"]["calls"] == est.by_module["2"].calls


def test_module_rule_cost_is_estimated() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    rule = flopscope.Cost(macs=10**9, flops=2 * 10**9, bytes_read=0, bytes_written=0)
    _, est = roofline(model, torch.randn(1, 8), hardware="h100-sxm", rules={nn.Linear: lambda m, i, o: rule})
    # a whole-module cost: default dtype float32, its MACs on the fp32 rate (67 TFLOP/s)
    assert est.total.time_s == 2 * 10**9 / 67e12
