"""Which fresh allocations take page faults: glibc's main heap, simulated over a run's large
allocations and frees (docs/prediction.md, round 7).

A call whose output storage comes from memory the process already holds costs its work; one
whose pages the operating system maps anew costs a page fault per 4 KiB page besides
(:attr:`Calibration.fault_s_per_byte <flopscope.estimate.calibration.Calibration
.fault_s_per_byte>`). glibc's malloc maps an allocation anew when it is at least its mmap
threshold and no free chunk of its heap fits it, and unmaps it when freed; it grows its heap for
the others and gives the heap's top back to the system when a free leaves more than its *trim
threshold* free there (twice the mmap threshold once that has risen; both rise when a mapped
chunk of up to 32 MiB is freed). So an allocation well under the mmap threshold also faults when
the run freed, just before, enough memory at the heap's top for it to be trimmed: measured here
(2 threads, 2026-11-28), a training step of BERT-base takes 140,000-215,000 minor page faults,
68,700 of them the three 94 MB allocations (the embedding's gradient, AdamW's ``sqrt`` and
division of its second moment); the rest are AdamW's ``sqrt`` and division of the 9.4 MB
moments of the feed-forward weights and the 9.4 MB weight gradients of the backward, each
faulting anew after the previous parameter's temporaries were freed and trimmed.

:func:`faulted_bytes` replays the allocations of at least :data:`TRACKED_BYTES` (smaller ones come
from the free chunks a running process holds; in the runs measured they took under 0.1% of the
faults) and their frees through :class:`Heap`, a best-fit heap with glibc's thresholds and
trimming, three times over (the run repeated: what the first pass leaves alive is freed at the
start of the next, as a training step's gradients are by ``zero_grad``), and returns the last
pass's newly mapped bytes per call. The thresholds start at their largest (the mmap threshold at
:data:`MMAP_MAX`): a process that has freed a mapped chunk of 32 MiB or more than its threshold
has them there, and the heap's history before the run is unknown. Not simulated: the bins'
exact order, the small allocations, other arenas (threads that allocate), and the process's
history before the run (the same step faulted 140,000 to 215,000 times in different processes
here).

**The heap a run starts in** (round 11). The replay starts from an empty heap by default: a
training script's own process, whose steady-state steps fault (measured here at 1 thread,
2026-11-28: BERT-base's steps 2-6 in a fresh process took 133,000-260,000 minor faults each).
A process whose heap already holds large free chunks below memory still in use (a process that
ran other models, or a calibration, first) takes its allocations from them without a fault:
the same steps took 85,000-89,000 faults each after a calibration in the same process, and 0 in
the validation's process after 30 other models (round 9). :func:`this_process` reads that
state (glibc's main heap walked chunk by chunk: its free chunks' sizes and its top), and
:func:`faulted_bytes` starts the replay from it when given one (:class:`HeapState`); a
prediction of runs in this process (``flopscope.profile``) does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["FROM_BEFORE", "MMAP_MAX", "PAGE", "TRACKED_BYTES", "Heap", "HeapState", "faulted_bytes",
           "this_process", "walk"]

FROM_BEFORE = -1
"""The bytes of an event that frees a storage made before the run (an input the run's calls
read first, then dropped: a decode step's previous KV cache)."""

PAGE = 4096
"""Bytes per page."""

MMAP_MAX = 32 << 20
"""glibc's largest dynamic mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit)."""

TRACKED_BYTES = 256 << 10
"""Allocations smaller than this are not simulated (served from the free chunks the process
holds)."""

_TOP_PAD = 128 << 10  # glibc's M_TOP_PAD: what the heap grows beyond a request, and keeps
_MIN_CHUNK = 32
_CONSOLIDATE = 64 << 10  # a free of at least this much checks the top for trimming


def _up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class HeapState:
    """The main heap's free memory when a run starts: what it can serve without a fault.

    Attributes:
        free: the sizes of its free chunks of at least :data:`TRACKED_BYTES`, in address order
            (each between chunks in use: they do not join).
        top: the free bytes of its top chunk (at the program break).
    """

    free: tuple[int, ...] = ()
    top: int = 0

    @property
    def free_bytes(self) -> int:
        """Bytes the heap holds free (its large chunks and its top)."""
        return sum(self.free) + self.top

    def to_dict(self) -> dict[str, int]:
        """The JSON form: the free chunks' count and bytes, the top's bytes."""
        return {"free_chunks": len(self.free), "free_chunk_bytes": sum(self.free),
                "top_bytes": self.top}


def walk(read: Callable[[int], int], size: int) -> HeapState | None:
    """The state of a glibc heap of ``size`` bytes, walked chunk by chunk from its start.

    Each chunk begins with the previous chunk's size (when that one is free) and its own size,
    whose lowest bit says whether the chunk before it is in use (the next two: mapped, not the
    main arena); chunks follow each other to the top chunk, which ends at the heap's end. A
    chunk the allocator keeps in a per-thread cache or a fast bin reads as in use (they are
    small).

    Args:
        read: the 8-byte word at an offset from the heap's start.
        size: the heap's bytes (its start to the program break).

    Returns:
        The state, or ``None`` where the walk does not end at the heap's end on chunks of
        sensible sizes (not a glibc heap, or one changing under the walk).
    """
    # nothing kept per chunk: a list of every chunk would grow through the heap being walked
    at, last, free = 0, 0, []
    while at < size:
        word = read(at + 8)
        chunk = word & ~7
        if chunk < _MIN_CHUNK or chunk % 16 or at + chunk > size or word & 6:
            return None
        if not word & 1 and last >= TRACKED_BYTES:  # the chunk before is free
            free.append(last)
        last = chunk
        at += chunk
    if at != size or not last:
        return None
    return HeapState(tuple(free), last)


def this_process() -> HeapState | None:
    """This process's main heap now (``[heap]`` in ``/proc/self/maps``, walked by
    :func:`walk`), or ``None`` where there is none to walk (not Linux, not glibc, a heap that
    is not one run of chunks).

    The words are read through ``/proc/self/mem``, not by address: a heap that shrinks under the
    walk (another thread's free trimming it) gives a read error there, where a read by address
    of the unmapped page would end the process."""
    import os
    import platform
    import struct

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        with open("/proc/self/maps") as maps:
            line = next((x for x in maps if x.rstrip().endswith("[heap]")), None)
        if line is None:
            return None
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        # one small buffer, read into: the walk allocates nothing from the heap it reads (a
        # buffer of 64 KiB per read was carved from a free chunk, which the walk then missed)
        buf = bytearray(4096)
        unpack = struct.Struct("<Q").unpack_from
        block = [-1, 0]  # the offset read last, and how many bytes came

        def word(offset: int) -> int:
            at = offset - block[0]
            if not 0 <= at <= block[1] - 8:  # chunks follow each other: read ahead
                block[0], block[1] = offset, os.preadv(fd, [buf], lo + offset)
                at = 0
                if block[1] < 8:
                    raise OSError("short read")
            return int(unpack(buf, at)[0])

        for _ in range(3):  # the heap changed under the walk (another thread allocated): again
            try:
                state = walk(word, hi - lo)
            except OSError:
                return None
            if state is not None:
                return state
        return None
    finally:
        os.close(fd)


@dataclass
class Heap:
    """glibc's main arena, as far as page faults go: chunks in address order (best fit among
    the free ones), a top chunk grown with the program break, allocations of at least
    ``threshold`` mapped on their own where no free chunk fits them.

    Args:
        threshold: the mmap threshold (the trim threshold is twice it).
    """

    threshold: int = MMAP_MAX
    blocks: list[list[int]] = field(default_factory=list)  # [start, size, in use (0/1)]
    top: int = 0  # where the top chunk starts
    brk: int = 0  # the program break: the heap's end
    resident: int = 0  # pages below this were touched since the heap last shrank past it
    _where: dict[object, tuple[bool, int]] = field(default_factory=dict)

    @classmethod
    def holding(cls, state: HeapState, threshold: int = MMAP_MAX) -> Heap:
        """A heap that holds ``state``'s free memory, its pages resident: each free chunk
        followed by a chunk in use (what kept it from joining the top), then the top.

        Args:
            state: the free chunks and top.
            threshold: the mmap threshold.

        Returns:
            The heap.
        """
        heap = cls(threshold=threshold)
        at = 0
        for size in state.free:
            heap.blocks += [[at, size, 0], [at + size, _MIN_CHUNK, 1]]
            at += size + _MIN_CHUNK
        heap.top = at
        heap.brk = heap.resident = at + state.top
        return heap

    def malloc(self, key: object, nbytes: int) -> int:
        """Allocate ``nbytes`` for ``key``; its bytes newly mapped (faulted when written).

        Args:
            key: the allocation's identity (for :meth:`free`).
            nbytes: its size.

        Returns:
            Bytes of new pages.
        """
        need = max(_MIN_CHUNK, _up(nbytes + 8, 16))
        best: list[int] | None = None
        for b in self.blocks:
            if not b[2] and b[1] >= need and (best is None or b[1] < best[1]):
                best = b
        if best is not None:
            if best[1] - need >= _MIN_CHUNK:
                i = self.blocks.index(best)
                self.blocks.insert(i + 1, [best[0] + need, best[1] - need, 0])
                best[1] = need
            best[2] = 1
            start = best[0]
        else:
            if self.brk - self.top < need:
                if need >= self.threshold:  # mapped on its own
                    size = _up(need + 8, PAGE)
                    self._where[key] = (True, size)
                    return size
                self.brk = _up(self.top + need + _TOP_PAD, PAGE)
            start = self.top
            self.blocks.append([start, need, 1])
            self.top += need
        self._where[key] = (False, start)
        new = max(0, start + need - max(start, self.resident))
        self.resident = max(self.resident, start + need)
        return _up(new, PAGE) if new else 0

    def free(self, key: object) -> None:
        """Free ``key``'s allocation (nothing for an unknown key): a mapped one is unmapped (and
        raises the thresholds to its size, up to :data:`MMAP_MAX`); a heap chunk joins its free
        neighbours and the top, which is trimmed when more than the trim threshold is free
        there."""
        where = self._where.pop(key, None)
        if where is None:
            return
        mapped, at = where
        if mapped:
            if self.threshold < at <= MMAP_MAX:
                self.threshold = at
            return
        i = next(j for j, b in enumerate(self.blocks) if b[0] == at)
        b = self.blocks[i]
        b[2] = 0
        size = b[1]
        if i + 1 < len(self.blocks) and not self.blocks[i + 1][2]:
            b[1] += self.blocks.pop(i + 1)[1]
        if i > 0 and not self.blocks[i - 1][2]:
            self.blocks[i - 1][1] += self.blocks.pop(i)[1]
            i -= 1
        if i == len(self.blocks) - 1:  # joins the top
            self.top = self.blocks.pop(i)[0]
        if size >= _CONSOLIDATE and self.brk - self.top >= 2 * self.threshold:
            extra = (self.brk - self.top - _TOP_PAD - _MIN_CHUNK) // PAGE * PAGE
            if extra > 0:
                self.brk -= extra
                self.resident = min(self.resident, self.brk)


def faulted_bytes(events: Sequence[tuple[int, int, int]], calls: int, *,
                  threshold: int = MMAP_MAX, passes: int = 3,
                  start: HeapState | None = None) -> list[int]:
    """Bytes of new pages each call's fresh allocations take in a steady state of the run.

    A run that frees storages made before it (:data:`FROM_BEFORE` events: a decode step
    drops the previous step's KV cache as it appends to it) frees, in its steady state, what
    the run before left alive: the first of those survivors (in allocation order) are freed
    at those events, one each, the rest at the run's start; its frees after its last call
    (the next step's, recorded late) count as left alive (round 11: freed all at the end,
    a decode step's cache, 84 MB of new chunks at the heap's top, was trimmed and faulted
    anew every step, 17,000 pages predicted against none measured).

    Args:
        events: in order, ``(call index, allocation id, bytes)``: an allocation by that call
            (bytes > 0), or the allocation's free before that call (bytes 0; index ``calls``:
            after the last call), or a free of a storage from before the run (bytes
            :data:`FROM_BEFORE`).
        calls: how many calls.
        threshold: the mmap threshold to start at.
        passes: how many times the run is replayed (the last one's faults are returned).
        start: the heap the first pass starts in (:func:`this_process`); ``None``: an empty
            one (a fresh process).

    Returns:
        Bytes per call.
    """
    heap = Heap.holding(start, threshold) if start is not None else Heap(threshold=threshold)
    faulted = [0] * calls
    # frees of storages from before the run by its calls (not the caller's, after them)
    dropped = sum(1 for i, _, n in events if n == FROM_BEFORE and i < calls)
    left: list[tuple[int, int]] = []  # what the run before left alive, in allocation order
    for p in range(passes):
        faulted = [0] * calls
        for old in left[dropped:]:  # freed at the run's start
            heap.free(old)
        held = iter(left[:dropped])  # freed where the run frees storages from before it
        alive: dict[int, None] = {}
        for index, key, nbytes in events:
            if nbytes > 0:
                if index < calls:
                    faulted[index] += heap.malloc((p, key), nbytes)
                alive[key] = None
            elif nbytes == FROM_BEFORE:
                freed = next(held, None) if index < calls else None
                if freed is not None:
                    heap.free(freed)
            elif index < calls or not dropped:
                heap.free((p, key))
                alive.pop(key, None)
        for old in held:
            heap.free(old)
        left = [(p, key) for key in alive]
    return faulted
