"""Reading callgrind output and mapping addresses to ELF file bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from flopscope.errors import MeasureError
from flopscope.measure.disasm import objdump_path
from flopscope.measure.valgrind.callgrind import parse_callgrind
from flopscope.measure.valgrind.code import analyze, read_captured, read_elf_bytes

DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 42
cmd:  python x.py
part: 3

desc: Trigger: Client Request: flopscope:seg:layer1

positions: instr
events: Ir
summary: 1000

ob=/lib/libfoo.so
fl=foo.c
fn=kernel
0x1000 10
0x1004 10
cob=/lib/libbar.so
cfi=bar.c
cfn=helper
calls=10 0x2000
0x1008 999999
0x100c 10
ob=???
fl=???
fn=0x5000
0x5000 7
fn=0x5000'2
0x5000 3

totals: 1000
"""


def test_parse_skips_inclusive_call_cost(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.42.3"
    path.write_text(DUMP)
    dump = parse_callgrind(path)
    assert dump.label == "flopscope:seg:layer1"
    assert dump.part == 3
    assert dump.counts == {
        ("/lib/libfoo.so", 0x1000): 10,
        ("/lib/libfoo.so", 0x1004): 10,
        ("/lib/libfoo.so", 0x100C): 10,
        ("???", 0x5000): 10,  # same address in two contexts: summed
    }


def test_parse_rejects_compressed_positions(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.1"
    path.write_text("positions: instr\nevents: Ir\nfn=x\n0x10 1\n+3 1\n")
    with pytest.raises(MeasureError, match="compressed positions"):
        parse_callgrind(path)


def _tiny_elf(code: bytes, vaddr: int, file_offset: int) -> bytes:
    """A minimal 64-bit ELF with one PT_LOAD segment holding ``code``."""
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5], header[6] = 2, 1, 1
    struct.pack_into("<Q", header, 0x20, 64)  # e_phoff
    struct.pack_into("<HH", header, 0x36, 56, 1)  # e_phentsize, e_phnum
    phdr = struct.pack("<IIQQQQQQ", 1, 5, file_offset, vaddr, vaddr, len(code), len(code), 4096)
    body = bytes(header) + phdr
    return body + b"\0" * (file_offset - len(body)) + code


def test_read_elf_bytes_maps_vaddr_to_file_offset(tmp_path: Path) -> None:
    code = bytes.fromhex("c4e2f5b8c2f20f58c1c3")
    path = tmp_path / "lib.so"
    path.write_bytes(_tiny_elf(code, vaddr=0x401000, file_offset=0x200))
    got = read_elf_bytes(str(path), [0x401000, 0x401005, 0x401009, 0x999999])
    assert got[0x401000][:5] == bytes.fromhex("c4e2f5b8c2")
    assert got[0x401005][:4] == bytes.fromhex("f20f58c1")
    assert got[0x401009] == b"\xc3"  # clipped at the end of the segment
    assert 0x999999 not in got


def test_read_elf_bytes_rejects_non_elf(tmp_path: Path) -> None:
    path = tmp_path / "not-elf"
    path.write_bytes(b"hello world, not an ELF file at all" * 4)
    with pytest.raises(MeasureError, match="not a 64-bit little-endian ELF"):
        read_elf_bytes(str(path), [0])


@pytest.mark.skipif(objdump_path() is None, reason="objdump not installed")
def test_analyze_sums_flops_per_segment(tmp_path: Path) -> None:
    """Executions x FLOPs per instruction, with file-backed and captured (JIT) code."""
    code = bytes.fromhex("c4e2f5b8c2f20f58c1c3")  # vfmadd231pd ymm (8), addsd (1), ret
    lib = tmp_path / "lib.so"
    lib.write_bytes(_tiny_elf(code, vaddr=0x1000, file_offset=0x100))
    jit_page = 0x7F0000000000
    jit = bytes.fromhex("c5f459c2") + b"\xc3"  # vmulps ymm: 8 single-precision FLOPs
    capture = tmp_path / "captured.bin"
    capture.write_bytes(struct.pack("<QI", jit_page, 4096) + jit + b"\0" * (4096 - len(jit)))
    dumps = []
    for part, (label, n) in enumerate([("flopscope:seg:a", 3), ("flopscope:seg:", 1)], 1):
        text = (
            f"part: {part}\ndesc: Trigger: Client Request: {label}\npositions: instr\n"
            f"events: Ir\nob={lib}\nfn=f\n0x1000 {n}\n0x1005 {10 * n}\n0x1009 {n}\n"
            f"ob=???\nfn=0x{jit_page:x}\n0x{jit_page:x} {2 * n}\n"
        )
        (tmp_path / f"cg.{part}").write_text(text)
        dumps.append(parse_callgrind(tmp_path / f"cg.{part}"))
    res = analyze(dumps, read_captured(capture))
    assert res.segments == {"a": 3 * 8 + 30 + 6 * 8, "": 8 + 10 + 2 * 8}
    assert res.flops_by_precision == {"double": 4 * 8 + 40, "single": 8 * 8}
    assert res.by_instruction == {"vfmadd231pd": 32, "addsd": 40, "vmulps": 64}
    assert res.instructions_undecoded == 0


def test_parse_keeps_only_the_objects_asked_for(tmp_path: Path) -> None:
    """What the child reads: only code without a file (``ob=???``), to capture its bytes."""
    path = tmp_path / "callgrind.out.42.3"
    path.write_text(DUMP)
    dump = parse_callgrind(path, {"???"})
    assert dump.counts == {("???", 0x5000): 10}
    assert dump.label == "flopscope:seg:layer1"
