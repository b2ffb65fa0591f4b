"""Executed instructions to FLOPs: read each instruction's bytes, disassemble, classify, sum.

Callgrind writes addresses of instructions in an object file as the file's own virtual addresses
(the load bias removed), which is what the ELF program headers map to file offsets.  Code
generated at run time (oneDNN's kernels) has no file: the child copies those pages from its own
memory (:func:`capture_code`) and the parent reads them back (:func:`read_captured`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from flopscope.errors import MeasureError
from flopscope.measure.classify import classify
from flopscope.measure.disasm import MAX_INSN_BYTES, disassemble
from flopscope.measure.valgrind.callgrind import NO_FILE, CallgrindDump
from flopscope.measure.valgrind.contract import SEGMENT_PREFIX

__all__ = ["Analysis", "analyze", "capture_code", "read_captured", "read_elf_bytes"]

_PAGE = 4096


def _readable_ranges() -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if fields[1].startswith("r"):
                ranges.append((lo, hi))
    return ranges


def capture_code(addresses: set[int], out: Path) -> int:
    """Write the bytes at ``addresses`` (whole pages, within readable mappings) to ``out``.

    Format: repeated records of ``<QI`` (start address, length) followed by the bytes.

    Args:
        addresses: executed instruction addresses.
        out: destination file.

    Returns:
        The number of bytes written.
    """
    page = _PAGE
    ranges = _readable_ranges()
    pages = sorted(
        {a & ~(page - 1) for a in addresses} | {(a + 15) & ~(page - 1) for a in addresses}
    )
    total = 0
    with open(out, "wb") as fh:
        for p in pages:
            if any(lo <= p and p + page <= hi for lo, hi in ranges):
                data = ctypes.string_at(p, page)
                fh.write(struct.pack("<QI", p, page))
                fh.write(data)
                total += page
    return total


def _elf_segments(data: mmap.mmap | bytes) -> list[tuple[int, int, int]]:
    """PT_LOAD segments ``(vaddr, file_offset, file_size)`` of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise MeasureError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            segments.append((p_vaddr, p_offset, p_filesz))
    return segments


def read_elf_bytes(path: str, addresses: list[int]) -> dict[int, bytes]:
    """Read up to 15 bytes at each virtual address of an ELF file.

    Args:
        path: the ELF file.
        addresses: virtual addresses (as in ``objdump -d`` of the file).

    Returns:
        Bytes for each address found in a loadable segment.

    Raises:
        MeasureError: if the file cannot be read or is not an ELF file.
    """
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                segments = _elf_segments(data)
            except MeasureError as exc:
                raise MeasureError(f"{path}: {exc}") from None
            out: dict[int, bytes] = {}
            for a in addresses:
                for vaddr, offset, size in segments:
                    if vaddr <= a < vaddr + size:
                        start = offset + a - vaddr
                        out[a] = bytes(data[start : min(start + MAX_INSN_BYTES, offset + size)])
                        break
            return out
    except OSError as exc:
        raise MeasureError(f"cannot read code of {path}: {exc}") from None


def read_captured(path: Path) -> list[tuple[int, bytes]]:
    """Read the chunks of memory captured by the child.

    Args:
        path: the capture file.

    Returns:
        ``(start address, bytes)`` chunks.
    """
    chunks: list[tuple[int, bytes]] = []
    if not path.exists():
        return chunks
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        start, length = struct.unpack_from("<QI", data, pos)
        pos += 12
        chunks.append((start, data[pos : pos + length]))
        pos += length
    return chunks


def _captured_bytes(chunks: list[tuple[int, bytes]], addresses: list[int]) -> dict[int, bytes]:
    pages = {start: blob for start, blob in chunks}
    out: dict[int, bytes] = {}
    for a in addresses:
        page = a & ~(_PAGE - 1)
        blob = pages.get(page)
        if blob is None:
            continue
        data = blob[a - page :]
        if len(data) < MAX_INSN_BYTES and page + _PAGE in pages:
            data += pages[page + _PAGE][: MAX_INSN_BYTES - len(data)]
        out[a] = data[:MAX_INSN_BYTES]
    return out


@dataclass
class Analysis:
    """FLOPs of the measured region, per precision, segment and instruction.

    Attributes:
        flops_by_precision: FLOPs per precision (``double``, ``single``, ...).
        segments: FLOPs per segment module path (``""`` = outside the listed modules).
        by_instruction: FLOPs per mnemonic.
        instructions_total: instructions executed in the region.
        instructions_undecoded: executed instructions whose bytes could not be read or decoded.
    """

    flops_by_precision: dict[str, int]
    segments: dict[str, int]
    by_instruction: dict[str, int]
    instructions_total: int
    instructions_undecoded: int


def analyze(dumps: list[CallgrindDump], captured: list[tuple[int, bytes]]) -> Analysis:
    """Disassemble and classify executed instructions; sum FLOPs per precision and segment.

    Args:
        dumps: the measured-region dumps (labels ``flopscope:seg:PATH``).
        captured: memory captured for code without a file.

    Returns:
        The totals.

    Raises:
        MeasureError: if disassembly fails.
    """
    by_object: dict[str, set[int]] = defaultdict(set)
    for d in dumps:
        for ob, addr in d.counts:
            by_object[ob].add(addr)
    # One objdump run over all objects: give each object its own address space above bit 48.
    code: dict[int, bytes] = {}
    objects = sorted(by_object)
    for idx, ob in enumerate(objects):
        addrs = sorted(by_object[ob])
        if ob == NO_FILE:
            found = _captured_bytes(captured, addrs)
        elif os.path.isfile(ob):
            found = read_elf_bytes(ob, addrs)
        else:
            found = {}
        base = (idx + 1) << 48
        for a, b in found.items():
            code[base + a] = b
    decoded = disassemble(code)
    flops_by_precision: dict[str, int] = defaultdict(int)
    segments: dict[str, int] = defaultdict(int)
    by_instruction: dict[str, int] = defaultdict(int)
    total = undecoded = 0
    obj_index = {ob: idx for idx, ob in enumerate(objects)}
    cache: dict[int, tuple[str, str, int] | None] = {}
    for d in dumps:
        path = d.label[len(SEGMENT_PREFIX) :]
        seg_flops = 0
        for (ob, addr), n in d.counts.items():
            total += n
            key = ((obj_index[ob] + 1) << 48) + addr
            if key not in cache:
                insn = decoded.get(key)
                if insn is None:
                    cache[key] = None
                else:
                    fp = classify(insn.mnemonic, insn.operands)
                    cache[key] = (fp.mnemonic, fp.precision.value, fp.flops) if fp else ("", "", 0)
            entry = cache[key]
            if entry is None:
                undecoded += n
                continue
            mnemonic, precision, flops = entry
            if flops:
                f = n * flops
                flops_by_precision[precision] += f
                by_instruction[mnemonic] += f
                seg_flops += f
        segments[path] += seg_flops
    return Analysis(
        dict(flops_by_precision), dict(segments), dict(by_instruction), total, undecoded
    )


