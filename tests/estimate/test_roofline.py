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


def test_fp32_convolutions_are_tf32_as_cudnn_is_set() -> None:
    """cuDNN takes TF32 for float32 convolutions by default (torch.backends.cudnn.allow_tf32),
    while matrix products stay float32: measured on an H200, a float32 3x3 convolution ran on the
    tensor pipe as TF32 and beat a bound taken at the CUDA cores' 67 TFLOP/s (docs/gpu.md)."""
    x, w = torch.empty(8, 64, 56, 56, device="meta"), torch.empty(64, 64, 3, 3, device="meta")
    pointwise = torch.empty(64, 64, 1, 1, device="meta")
    a = torch.empty(1024, 1024, device="meta")
    log = _log(lambda: (torch.nn.functional.conv2d(x, w, padding=1),
                        torch.nn.functional.conv2d(x, pointwise), a @ a))
    conv_flops = 2 * 8 * 64 * 56 * 56 * 64 * 9  # 1,849,688,064: the count ncu's TF32 pipe saw
    one_flops = 2 * 8 * 64 * 56 * 56 * 64  # a 1x1 convolution is cuDNN's too
    mm_flops = 2 * 1024**3
    assert torch.get_float32_matmul_precision() == "highest"
    # (torch.backends.cudnn.flags: the one way to set them once torch's test utilities have
    # called disable_global_flags, as some of our tests' imports do)
    with torch.backends.cudnn.flags(allow_tf32=True):
        est = log.estimate(H100)  # as torch is set: convolutions TF32, the product float32
    convs = [r for r in (flopscope.estimate.Estimate.from_records(
        [rec], H100, tf32=est.tf32, tf32_convolution=est.tf32_convolution).total
        for rec in log.records) if r.macs]
    assert est.tf32_convolution and not est.tf32
    assert [r.compute_s for r in convs] == [conv_flops / 494.5e12, one_flops / 494.5e12,
                                            mm_flops / 67e12]
    assert est.to_dict()["tf32_convolution"] is True
    with torch.backends.cudnn.flags(allow_tf32=False):
        assert not log.estimate(H100).tf32_convolution
        conv_row = log.estimate(H100).by_op["aten.convolution.default"]
    assert conv_row.compute_s == pytest.approx((conv_flops + one_flops) / 67e12)
    # tf32=False: both float32; tf32=True: both TF32
    assert log.estimate(H100, tf32=True).total.compute_s == pytest.approx(
        (conv_flops + one_flops + mm_flops) / 494.5e12)
    # a machine without TF32 units runs them as float32 whatever the switch says
    cpu = flopscope.estimate.Hardware("cpu", 1e15, matrix={"fp32": 1e11}, vector={"fp32": 5e10})
    assert log.estimate(cpu, tf32=True).total.compute_s == pytest.approx(
        (conv_flops + one_flops + mm_flops) / 1e11)


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


# a made-up machine with a last-level cache: 1 GB/s to memory, 10 GB/s from a 1 MiB cache
CACHED = flopscope.estimate.Hardware("cached", 1e9, vector={"fp32": 1e12},
                                     cache_bytes=2**20, cache_bandwidth=1e10)


def test_an_intermediate_that_fits_is_read_from_the_cache() -> None:
    x = torch.randn(1024)  # 4,096 B
    est = _log(lambda: (x + 1) * 2).estimate(CACHED)
    add, mul = est.by_op["aten.add.Tensor"], est.by_op["aten.mul.Tensor"]
    # add: reads x (never touched before: from memory), writes 4,096 B into the cache:
    # max(8,192 / 1e10, 4,096 / 1e9) = 4.096e-6 s
    assert (add.bytes, add.dram_bytes) == (8_192, 4_096)
    assert add.memory_s == 4_096 / 1e9
    # mul: reads x + 1 (touched 0 bytes ago, 4,096 <= 1 MiB: a hit), writes into the cache:
    # all 8,192 B at cache bandwidth = 8.192e-7 s
    assert (mul.bytes, mul.dram_bytes) == (8_192, 0)
    assert mul.memory_s == 8_192 / 1e10
    assert est.total.time_s == 4_096 / 1e9 + 8_192 / 1e10
    # the same chain without the cache figures: every byte at memory bandwidth
    flat = _log(lambda: (x + 1) * 2).estimate(H100)
    assert flat.total.dram_bytes == flat.total.bytes == 16_384


def test_cache_too_small_and_reuse_distance() -> None:
    small = flopscope.estimate.Hardware("small", 1e9, vector={"fp32": 1e12},
                                        cache_bytes=2_048, cache_bandwidth=1e10)
    x = torch.randn(1024)
    est = _log(lambda: (x + 1) * 2).estimate(small)
    assert est.total.dram_bytes == est.total.bytes == 16_384  # 4,096-byte tensors never fit
    a, b = torch.randn(1024), torch.randn(256 * 1024)  # 4 KiB and 1 MiB
    log = _log(lambda: (a.neg(), b.neg(), a.neg()))
    third = log.records[2]
    # a was last touched before b's 2 MiB of traffic: 2 MiB + 4 KiB > 1 MiB, a miss
    assert third.reuse == ((4_096, 2 * 2**20),)
    assert third.cached_bytes(2**20) == 4_096  # only its output, written to the cache


def test_a_storage_at_a_dead_ones_address_is_not_found_in_the_cache() -> None:
    # a storage's key is its address: one made after another died can take it. A tensor made
    # outside any operator (torch.tensor's data, lifted by aten.lift_fresh) is then new to the
    # cache model, not the dead one read again (the plan's small runs differed by this).
    for _ in range(20):  # a fresh count each try, until malloc hands over the dead address
        log = CallLog()
        with flopscope.Counter(warn=False, observers=[log]):
            a = torch.ones(256)
            a.add_(1.0)  # a touched: 1,024 bytes
            dead = a.untyped_storage()._cdata
            del a
            # new storages kept alive, so each one takes another free block, until one takes the
            # dead one's (the heap's state before this test decides how many: not the first)
            kept = []
            for _ in range(200):
                b = torch.tensor([2.0] * 256)
                kept.append(b)
                if b.untyped_storage()._cdata == dead:
                    b * 3
                    break
        reused = b.untyped_storage()._cdata == dead
        del kept
        if reused:
            break
    assert reused, "malloc never reused the address: the case is not reached here"
    lifts = [r for r in log.records if r.op == "aten.lift_fresh.default"]
    lift = lifts[-1]  # b's: the storage at the dead one's address
    mul = next(r for r in log.records if r.op == "aten.mul.Tensor")
    assert lift.reuse == ()  # a new storage: from main memory
    assert mul.reuse == ((1_024, 0),)  # b, just touched by the lift


def test_a_call_timed_in_a_loop_finds_its_inputs_in_the_cache() -> None:
    a, b, c = torch.randn(1024), torch.randn(1024), torch.empty(1024)
    log = _log(lambda: [torch.add(a, b, out=c) for _ in range(2)])
    first, second = (flopscope.estimate.Estimate.from_records([r], CACHED).total
                     for r in log.records)
    # counted bytes: a, b and the out= tensor read, c written: 4 x 4,096
    assert first.bytes == second.bytes == 16_384
    assert first.dram_bytes == 12_288  # cold: the three inputs from memory, c into the cache
    assert second.dram_bytes == 0  # warm: everything in the cache
    assert second.time_s == 16_384 / 1e10


def test_an_input_passed_twice_is_read_from_memory_once() -> None:
    # AdamW's exp_avg_sq.addcmul_(grad, grad): the second argument reads the same bytes in the
    # same pass, a hit at distance 0 whether or not the first read missed
    x, g = torch.randn(1024), torch.randn(1024)  # 4,096 B each, never touched before
    rec = _log(lambda: x.addcmul_(g, g)).records[0]
    assert rec.reuse == ((4_096, 0),)
    # counted: x, g, g read (12,288 B), x written (4,096 B); from memory: x and g once (8,192 B)
    total = flopscope.estimate.Estimate.from_records([rec], CACHED).total
    assert (total.bytes, total.dram_bytes) == (16_384, 8_192)


def test_two_views_of_one_storage_are_different_bytes() -> None:
    # q and k, halves of one fused projection: the second half is not the first read again
    q, k = torch.randn(2, 1024)  # views made outside the count: the storage never touched
    rec = _log(lambda: torch.mul(q, k)).records[0]
    assert rec.reuse == ()  # both halves from memory: 8,192 B read, nothing hit
    assert rec.cached(2**20) == (0, 4_096)  # only the fresh output is written to the cache


def test_nvidia_profiles_have_no_cache_level() -> None:
    # NVIDIA publishes L2 capacities, not L2 bandwidth: the capacity is kept, the level unused
    assert H100.cache_bytes == 50 * 2**20 and H100.cache_bandwidth is None
    assert not H100.has_cache
    mi300x = flopscope.estimate.PROFILES["mi300x"]
    assert mi300x.has_cache and mi300x.cache_bytes == 256 * 2**20
    assert mi300x.cache_bandwidth == 17e12


def test_in_place_writes_are_cached_only_when_they_fit() -> None:
    big = torch.randn(512 * 1024)  # 2 MiB: larger than CACHED's 1 MiB
    log = _log(lambda: big.add_(1))
    # add_ reads and writes its own 2 MiB storage: neither fits, all from and to memory
    assert log.records[0].out_bytes == 2 * 2**20
    assert log.estimate(CACHED).total.dram_bytes == 4 * 2**20


def test_reads_and_writes_at_their_own_bandwidths() -> None:
    split = flopscope.estimate.Hardware("split", 4e9, vector={"fp32": 1e12},
                                        write_bandwidth=1e9)
    x = torch.randn(1024)
    row = _log(lambda: x.neg()).estimate(split).total
    # neg reads 4,096 B at 4 GB/s (1.024e-6 s) and writes 4,096 B at 1 GB/s (4.096e-6 s): they
    # share the channels, so the times add
    assert row.memory_s == 4_096 / 4e9 + 4_096 / 1e9
    same = flopscope.estimate.Hardware("same", 4e9, vector={"fp32": 1e12})
    assert _log(lambda: x.neg()).estimate(same).total.memory_s == 8_192 / 4e9


def test_convolutions_run_at_the_profiles_convolution_rate() -> None:
    """A measured CPU profile can give convolutions their own attained rate (oneDNN's kernels
    and the BLAS GEMM reach different fractions of the cores); other products keep ``matrix``."""
    hw = flopscope.estimate.Hardware("cpu", 1e15, matrix={"fp32": 1e11}, vector={"fp32": 1e11},
                                     convolution={"fp32": 2e11})
    x, w = torch.randn(1, 8, 16, 16), torch.randn(8, 8, 3, 3)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    est = _log(lambda: (torch.nn.functional.conv2d(x, w, padding=1), a @ b)).estimate(hw)
    conv = next(r for op, r in est.by_op.items() if "convolution" in op)
    mm = est.by_op["aten.mm.default"]
    # conv: 8 x 16 x 16 x 8 x 9 = 147,456 MACs -> 294,912 FLOPs / 2e11 = 1.47456e-6 s
    assert conv.compute_s == pytest.approx(2 * 147_456 / 2e11)
    # mm: 64^3 = 262,144 MACs -> 524,288 FLOPs at the matrix rate 1e11 = 5.24288e-6 s
    assert mm.compute_s == pytest.approx(2 * 64**3 / 1e11)


def test_one_by_one_convolutions_run_at_the_matrix_rate() -> None:
    """A 1x1 convolution with one group is a GEMM over the channels: its products run at the
    matrix rate, not the convolution rate (which is measured on 3x3 kernels); a depthwise 1x1
    (one input channel per group) is not a GEMM and keeps the convolution rate."""
    hw = flopscope.estimate.Hardware("cpu", 1e15, matrix={"fp32": 1e11}, vector={"fp32": 1e11},
                                     convolution={"fp32": 2e11})
    x = torch.randn(2, 16, 8, 8)
    pointwise, depthwise = torch.randn(32, 16, 1, 1), torch.randn(16, 1, 1, 1)
    log = _log(lambda: (torch.nn.functional.conv2d(x, pointwise),
                        torch.nn.functional.conv2d(x, depthwise, groups=16)))
    gemm, dw = (flopscope.estimate.Estimate.from_records([r], hw).total for r in log.records)
    # 1x1: 2 x 8 x 8 x 32 x 16 = 65,536 MACs -> 131,072 FLOPs / 1e11 (matrix) = 1.31072e-6 s
    assert gemm.macs == 65_536
    assert gemm.compute_s == 131_072 / 1e11
    # depthwise: 2 x 16 x 8 x 8 = 2,048 MACs -> 4,096 FLOPs / 2e11 (convolution) = 2.048e-8 s
    assert dw.macs == 2_048
    assert dw.compute_s == 4_096 / 2e11
    # the backward of the 1x1 convolution is two GEMMs too: the matrix rate
    xg = x.clone().requires_grad_()
    log = _log(lambda: torch.nn.functional.conv2d(xg, pointwise).sum().backward())
    back = next(r for r in log.records if "backward" in r.op)
    assert not back.convolution
    row = flopscope.estimate.Estimate.from_records([back], hw).total
    assert row.compute_s == 2 * back.macs / 1e11


# special-function rates: exp at 1e9 evaluations/s, tanh at 5e8, gelu (erf) at 2e9
SPECIAL = flopscope.estimate.Hardware(
    "special", 1e12, vector={"fp32": 1e12},
    special={"fp32": {"exp": 1e9, "tanh": 5e8, "gelu": 2e9, "pow": 4e8, "softmax": 1e9}})


def test_special_functions_take_their_element_rate() -> None:
    x = torch.empty(1_000_000, device="meta")
    row = _log(lambda: x.exp()).estimate(SPECIAL).total
    # exp: 1,000,000 FLOPs (one per element: the count is unchanged) / 1e12 = 1e-6 s;
    # 8,000,000 B / 1e12 B/s = 8e-6 s; 1,000,000 evaluations / 1e9 per s = 1e-3 s: the largest
    assert row.flops == 1_000_000
    assert row.memory_s == 8_000_000 / 1e12
    assert row.compute_s == row.time_s == 1_000_000 / 1e9
    assert row.bound == "compute"
    # the same exp on a profile without special rates: memory-bound at 8e-6 s
    plain = flopscope.estimate.Hardware("plain", 1e12, vector={"fp32": 1e12})
    assert _log(lambda: x.exp()).estimate(plain).total.time_s == 8_000_000 / 1e12
    # in place and out= variants are the same function
    out = torch.empty(1_000_000, device="meta")
    assert _log(lambda: torch.exp(x, out=out)).estimate(SPECIAL).total.time_s == 1e-3
    assert _log(lambda: x.clone().tanh_()).estimate(SPECIAL).by_op[
        "aten.tanh_.default"].time_s == 1_000_000 / 5e8
    # fp64 has no rate in this profile: no special time (memory-bound, 16e6 B / 1e12)
    x64 = torch.empty(1_000_000, dtype=torch.float64, device="meta")
    assert _log(lambda: x64.exp()).estimate(SPECIAL).total.time_s == 16_000_000 / 1e12


def test_special_time_only_when_it_exceeds_memory_time() -> None:
    fast = flopscope.estimate.Hardware("fast", 1e9, vector={"fp32": 1e12},
                                       special={"fp32": {"exp": 1e12}})
    x = torch.empty(1_000_000, device="meta")
    row = _log(lambda: x.exp()).estimate(fast).total
    # 1e6 / 1e12 = 1e-6 s of evaluations < 8e6 B / 1e9 B/s = 8e-3 s of memory
    assert row.time_s == row.memory_s == 8_000_000 / 1e9
    assert row.bound == "memory"


def test_which_calls_are_special_functions() -> None:
    from flopscope.estimate.roofline import special_function

    x = torch.empty(1_000, device="meta")
    rows = {}
    for name, fn in [("gelu", lambda: torch.nn.functional.gelu(x)),
                     ("gelu_tanh", lambda: torch.nn.functional.gelu(x, approximate="tanh")),
                     ("pow 2.5", lambda: x.pow(2.5)), ("pow 2", lambda: x.pow(2)),
                     ("pow 0.5", lambda: x.pow(0.5)), ("pow 3.0", lambda: x.pow(3.0)),
                     ("softmax", lambda: x.view(10, 100).softmax(-1)), ("neg", lambda: x.neg())]:
        (rec,) = [r for r in _log(fn).records if r.flops]
        rows[name] = rec.special
    assert rows == {"gelu": ("gelu", 1_000), "gelu_tanh": ("gelu_tanh", 1_000),
                    "pow 2.5": ("pow", 1_000), "pow 2": None, "pow 0.5": None, "pow 3.0": None,
                    "softmax": ("softmax", 1_000), "neg": None}
    assert special_function("aten.exp.default", None) is None  # a module rule's cost
    # gelu: 1,000 / 2e9 = 5e-7 s; pow 2.5: 1,000 / 4e8 = 2.5e-6 s; both above their memory
    # time 8,000 B / 1e12 = 8e-9 s and their FLOPs' time (5,000 and 1,000 FLOPs / 1e12)
    assert _log(lambda: torch.nn.functional.gelu(x)).estimate(SPECIAL).total.time_s == 1_000 / 2e9
    assert _log(lambda: x.pow(2.5)).estimate(SPECIAL).total.time_s == 1_000 / 4e8


def test_every_special_function_is_recognised_and_probed() -> None:
    """The operators the roofline maps to special functions and the functions a profile may rate
    (and this-machine probes) are the same set: a rate nothing uses, or an operator no probe
    measures, would be a silent gap."""
    from flopscope.estimate.profile import SPECIAL_FUNCTIONS
    from flopscope.estimate.roofline import _SPECIAL_OPS
    from flopscope.estimate.this_machine import _special_probes

    assert set(_SPECIAL_OPS.values()) | {"gelu_tanh"} == set(SPECIAL_FUNCTIONS)
    probes = _special_probes(1024)
    assert [name for name, _, _ in probes] == list(SPECIAL_FUNCTIONS)
    for name, fn, one in probes:  # every probe runs, as the function the roofline charges
        log = _log(lambda fn=fn: fn())
        assert [r.special for r in log.records if r.special] == [(name, 1024)]
        one()
