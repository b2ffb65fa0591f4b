"""Which fresh allocations take page faults (issue 29, round 7): glibc's main heap simulated over
a run's large allocations and frees (:mod:`flopscope.estimate.heap`), and the prediction's use of
it (a call's new pages at the calibration's seconds per byte)."""

from __future__ import annotations

import pytest
import torch
from tests.estimate import synthetic
from tests.estimate.synthetic import FAST, Fn

import flopscope
from flopscope.estimate import Hardware
from flopscope.estimate.calibration import Point
from flopscope.estimate.heap import (
    MMAP_MAX,
    PAGE,
    TRACKED_BYTES,
    Heap,
    HeapState,
    faulted_bytes,
    this_process,
    walk,
)
from flopscope.estimate.roofline import CallLog

MIB = 1 << 20
TWELVE = 12 * MIB
# glibc's chunk of a 12 MiB request: 12 MiB + 8 bytes of header, rounded up to 16 bytes
CHUNK = 12 * MIB + 16


def _three_alive_then_freed(n: int = TWELVE) -> list[tuple[int, int, int]]:
    """Calls 0-2 each allocate n bytes; all three are freed after the last call."""
    return [(0, 1, n), (1, 2, n), (2, 3, n), (3, 1, 0), (3, 2, 0), (3, 3, 0)]


def test_a_heap_trimmed_after_each_run_faults_every_run() -> None:
    # mmap threshold 16 MiB: the 12 MiB chunks come from the heap (program break); freeing all
    # three leaves 36 MiB + 128 KiB of padding free at the top, more than the trim threshold
    # (2 x 16 MiB): the top goes back to the system and the next run maps it again
    faults = faulted_bytes(_three_alive_then_freed(), 3, threshold=16 * MIB)
    # the first chunk starts at 0; after the trim 128 KiB + 4 KiB (135,168 bytes, the padding
    # kept, page-aligned) are still mapped: CHUNK - 135,168 new bytes, rounded up to a page
    first = (CHUNK - 135_168 + PAGE - 1) // PAGE * PAGE
    # the others start past everything mapped: their whole chunk, rounded up to a page
    rest = (CHUNK + PAGE - 1) // PAGE * PAGE
    assert faults == [first, rest, rest]
    assert first == 12_451_840 and rest == 12_587_008  # 3,040 and 3,073 pages


def test_under_the_largest_threshold_the_heap_keeps_them() -> None:
    # trim threshold 2 x 32 MiB: 36 MiB free at the top stays mapped; the next run reuses it
    assert faulted_bytes(_three_alive_then_freed(), 3, threshold=MMAP_MAX) == [0, 0, 0]
    assert faulted_bytes(_three_alive_then_freed(), 3, threshold=MMAP_MAX, passes=1) == [
        (CHUNK + PAGE - 1) // PAGE * PAGE] * 3  # the first run maps them


def test_an_allocation_above_the_largest_threshold_is_mapped_every_time() -> None:
    big = 40 * MIB
    events = [(0, 1, big), (1, 1, 0)]
    # chunk: 40 MiB + 8 rounded to 16 bytes, + 8 bytes of the mapping's header, to a page
    assert faulted_bytes(events, 1) == [40 * MIB + PAGE]


def test_freeing_a_mapped_chunk_raises_the_threshold() -> None:
    heap = Heap(threshold=MIB)
    assert heap.malloc("a", 2 * MIB) == 2 * MIB + PAGE  # mapped on its own
    heap.free("a")
    assert heap.threshold == 2 * MIB + PAGE  # its size: glibc's dynamic threshold
    assert heap.malloc("b", 2 * MIB) > 0  # now from the heap, which grows (new pages)
    heap.free("b")
    assert heap.malloc("c", 2 * MIB) == 0  # the heap's free top serves it
    heap.free("unknown")  # nothing to free: no error


def _three(x: torch.Tensor) -> torch.Tensor:
    a, b, c = x * 2.0, x * 3.0, x * 4.0  # three outputs of x's size alive together
    return a.sum() + b.sum() + c.sum()  # scalars: under the tracked size


def test_the_log_records_large_fresh_allocations_and_their_frees() -> None:
    log = CallLog()
    with torch.no_grad():  # 12 MiB tensors
        flopscope.count(Fn(_three), torch.randn(TWELVE // 4), observers=[log])
    faults = log.faulted_bytes(16 * MIB)
    muls = [i for i, r in enumerate(log.records) if r.op == "aten.mul.Tensor"]
    assert len(muls) == 3
    # the same sequence as the heap's test above: the three products fault every run
    assert [faults[i] for i in muls] == [12_451_840, 12_587_008, 12_587_008]
    assert sum(faults) == 12_451_840 + 2 * 12_587_008  # nothing else faults
    assert log.faulted_bytes(MMAP_MAX) == [0] * len(log.records)


def test_the_prediction_charges_the_simulated_new_pages() -> None:
    # mul: 1e10 B/s of device time after 1e-6 s of host time
    points = (Point("elementwise", "fp32", "mul", 100, 1_000, 1e-6 + 1e-7, op="mul"),
              Point("elementwise", "fp32", "mul", 10**7, 10**8, 1e-6 + 1e-2, op="mul"))

    def hw(fault_s_per_byte: float) -> Hardware:
        return synthetic.calibrated(points, {"elementwise": 1e-6}, FAST,
                                    date="2026-11-28T00:00:00+00:00", mmap_bytes=16 * MIB,
                                    fault_s_per_byte=fault_s_per_byte)

    x = torch.randn(TWELVE // 4)
    with torch.no_grad():
        _, faulting = flopscope.estimate.roofline(Fn(_three), x, hardware=hw(1e-9))
        _, free = flopscope.estimate.roofline(Fn(_three), x, hardware=hw(0.0))
    # the three 12 MiB products under 16 MiB, each faulting every run (the heap's test above):
    # their new pages at 1e-9 s per byte, nothing else
    new = 12_451_840 + 2 * 12_587_008
    assert faulting.total.predicted_s - free.total.predicted_s == pytest.approx(new * 1e-9,
                                                                                rel=1e-9)
    mul = faulting.by_op["aten.mul.Tensor"].predicted_s - free.by_op["aten.mul.Tensor"].predicted_s
    assert mul == pytest.approx(new * 1e-9, rel=1e-9)


def test_a_heap_holding_a_free_chunk_below_memory_in_use_keeps_the_run_s_pages() -> None:
    # the trimmed run above (threshold 16 MiB) in a process whose heap holds one free chunk of
    # CHUNK bytes below a chunk in use: the first allocation takes it (its pages resident: no
    # fault); the other two grow the heap; freed, they leave 2 x CHUNK + the padding at the top,
    # 24 MiB + ~128 KiB, under the trim threshold (2 x 16 MiB): nothing goes back, and the
    # next run finds every page mapped
    start = HeapState(free=(CHUNK,))
    assert faulted_bytes(_three_alive_then_freed(), 3, threshold=16 * MIB,
                         start=start) == [0, 0, 0]
    # against a fresh process's (empty) heap: every run faults (the first test above)
    assert faulted_bytes(_three_alive_then_freed(), 3, threshold=16 * MIB) == [
        12_451_840, 12_587_008, 12_587_008]
    # a free chunk too small for them serves none: the top holds all three, 36 MiB, trimmed
    small = HeapState(free=(TRACKED_BYTES,))
    assert faulted_bytes(_three_alive_then_freed(), 3, threshold=16 * MIB,
                         start=small) == [12_451_840, 12_587_008, 12_587_008]


def test_a_heap_s_top_is_its_free_end() -> None:
    heap = Heap.holding(HeapState(free=(MIB, 2 * MIB), top=3 * MIB))
    # MIB free, 32 in use, 2 MiB free, 32 in use: the top starts at 3 MiB + 64
    assert heap.top == 3 * MIB + 64 and heap.brk == heap.resident == 6 * MIB + 64
    assert heap.malloc("a", 2 * MIB - 8) == 0  # its chunk: exactly the 2 MiB free one
    assert heap.malloc("b", 3 * MIB - 8) == 0  # 3 MiB from the top's 3 MiB: mapped already
    assert HeapState(free=(MIB, 2 * MIB), top=3 * MIB).to_dict() == {
        "free_chunks": 2, "free_chunk_bytes": 3 * MIB, "top_bytes": 3 * MIB}


def _heap_bytes(chunks: list[tuple[int, bool]]) -> bytearray:
    """A glibc heap's bytes: each chunk's size word (at its offset + 8) holds its size and, in
    its lowest bit, whether the chunk before it is in use."""
    out = bytearray(sum(size for size, _ in chunks))
    at, before_used = 0, True  # the first chunk's bit is always set
    for size, used in chunks:
        out[at + 8:at + 16] = (size | int(before_used)).to_bytes(8, "little")
        at, before_used = at + size, used
    return out


def test_a_heap_is_walked_chunk_by_chunk() -> None:
    chunks = [(0x290, True), (512 << 10, False), (64, True), (128 << 10, False), (32, True),
              (MIB, False)]  # the last: the top
    buf = _heap_bytes(chunks)

    def read(offset: int) -> int:
        return int.from_bytes(buf[offset:offset + 8], "little")

    # the free 512 KiB chunk (the 128 KiB one is under TRACKED_BYTES, 256 KiB), the 1 MiB top
    assert walk(read, len(buf)) == HeapState(free=(512 << 10,), top=MIB)
    assert walk(read, len(buf) + 16) is None  # the chunks end before the heap does
    buf[0x290 + 8] |= 2  # a chunk marked mapped: not a heap of chunks
    assert walk(read, len(buf)) is None


def test_this_process_s_heap_is_read_where_the_c_library_is_glibc() -> None:
    import platform

    state = this_process()
    if platform.libc_ver()[0] != "glibc":
        assert state is None
        return
    assert state is not None and state.top > 0
    assert all(n >= TRACKED_BYTES and n % 16 == 0 for n in state.free)


def test_the_heap_read_through_proc_mem_is_the_heap_read_by_address() -> None:
    """this_process reads the heap's words through /proc/self/mem (a trimmed heap is a read
    error, not a crash) into one small buffer (nothing allocated from the heap it walks): the
    same state as a walk of the same words read directly by address, right after it."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return
    with open("/proc/self/maps") as maps:
        line = next((x for x in maps if x.rstrip().endswith("[heap]")), None)
    assert line is not None
    lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
    word = ctypes.c_uint64.from_address
    state = this_process()
    assert state == walk(lambda offset: word(lo + offset).value, hi - lo)


def test_the_log_s_replay_starts_from_its_heap() -> None:
    log = CallLog()
    with torch.no_grad():
        flopscope.count(Fn(_three), torch.randn(TWELVE // 4), observers=[log])
    muls = [i for i, r in enumerate(log.records) if r.op == "aten.mul.Tensor"]
    log.heap_start = HeapState(free=(CHUNK,))  # the heap test above: no fault
    assert log.faulted_bytes(16 * MIB) == [0] * len(log.records)
    log.heap_start = None  # a fresh process: every run faults
    assert [log.faulted_bytes(16 * MIB)[i] for i in muls] == [12_451_840, 12_587_008,
                                                              12_587_008]
