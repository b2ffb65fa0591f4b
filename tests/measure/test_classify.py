"""The instruction classifier, on real x86-64 encodings decoded by objdump.

Encodings were produced with GNU as (Intel syntax) and are decoded back by
:func:`flopscope.measure.disasm.disassemble`, so these tests check the disassembler plumbing and
the classification rules together.  FLOPs per instruction = lanes x operations per lane.
"""

from __future__ import annotations

import pytest

from flopscope.measure.classify import Precision, classify
from flopscope.measure.disasm import disassemble, objdump_path

D, S, H, B, X = (
    Precision.DOUBLE,
    Precision.SINGLE,
    Precision.HALF,
    Precision.BFLOAT16,
    Precision.X87,
)

# (hex encoding, mnemonic objdump prints, precision, register width, FLOPs per execution)
ARITHMETIC = [
    ("f20f58c1", "addsd", D, 0, 1),  # scalar double: 1 lane
    ("f30f58c1", "addss", S, 0, 1),  # scalar single: 1 lane
    ("660f58c1", "addpd", D, 128, 2),  # 128 / 64 = 2 lanes
    ("0f58c1", "addps", S, 128, 4),  # 128 / 32 = 4 lanes
    ("660f5910", "mulpd", D, 128, 2),  # memory source operand
    ("c5f558c2", "vaddpd", D, 256, 4),  # 256 / 64
    ("c5f459c2", "vmulps", S, 256, 8),  # 256 / 32
    ("62f1f54858c2", "vaddpd", D, 512, 8),  # EVEX zmm: 512 / 64
    ("62f174c959c2", "vmulps", S, 512, 16),  # masked {k1}{z}: all lanes counted (upper bound)
    ("c4e2f5b8c2", "vfmadd231pd", D, 256, 8),  # FMA: 4 lanes x 2
    ("62f27558b800", "vfmadd231ps", S, 512, 32),  # FMA with {1to16} broadcast: 16 lanes x 2
    ("c4e2f1a9c2", "vfmadd213sd", D, 0, 2),  # scalar FMA: 1 lane x 2
    ("c4e271bcc2", "vfnmadd231ps", S, 128, 8),  # negated FMA: 4 lanes x 2
    ("f20f5ec1", "divsd", D, 0, 1),
    ("660f51c1", "sqrtpd", D, 128, 2),
    ("c5f45fc2", "vmaxps", S, 256, 8),
    ("f20f5dc1", "minsd", D, 0, 1),
    ("c5f45ec2", "vdivps", S, 256, 8),
    ("660f7cc1", "haddpd", D, 128, 2),
    ("c5dd5c5c2420", "vsubpd", D, 256, 4),
    ("62f5744858c2", "vaddph", H, 512, 32),  # AVX512-FP16: 512 / 16
    ("62f2764852c2", "vdpbf16ps", B, 512, 64),  # 16 float32 lanes x (2 mul + 2 add)
    ("d8c1", "fadd", X, 0, 1),  # x87
    ("dec9", "fmulp", X, 0, 1),
]

NOT_ARITHMETIC = [
    ("660f28c1", "movapd"),
    ("c5fd1000", "vmovupd"),
    ("0f57c0", "xorps"),  # zeroing idiom
    ("c5fd57c0", "vxorpd"),
    ("c4e27d19c1", "vbroadcastsd"),
    ("f20f2ac0", "cvtsi2sd"),
    ("c5fc5ac1", "vcvtps2pd"),
    ("660f2ec1", "ucomisd"),
    ("c5f5c2c201", "vcmpltpd"),
    ("660f54c1", "andpd"),
    ("c5f5fec2", "vpaddd"),  # integer SIMD
    ("c5f5f5c2", "vpmaddwd"),
    ("0fc6c100", "shufps"),
    ("660f3a0bc104", "roundsd"),
    ("c4e3754bc230", "vblendvpd"),
    ("c4e2e3f6c1", "mulx"),  # integer (BMI2)
    ("0fafc3", "imul"),
    ("4801d8", "add"),
    ("c4e27539c2", "vpminsd"),
]

needs_objdump = pytest.mark.skipif(objdump_path() is None, reason="objdump not installed")


@needs_objdump
@pytest.mark.parametrize(("hexcode", "mnemonic", "precision", "width", "flops"), ARITHMETIC)
def test_arithmetic_encodings(
    hexcode: str, mnemonic: str, precision: Precision, width: int, flops: int
) -> None:
    insn = disassemble({0x1000: bytes.fromhex(hexcode)})[0x1000]
    assert insn.mnemonic == mnemonic
    fp = classify(insn.mnemonic, insn.operands)
    assert fp is not None
    assert (fp.precision, fp.width_bits, fp.flops) == (precision, width, flops)


@needs_objdump
@pytest.mark.parametrize(("hexcode", "mnemonic"), NOT_ARITHMETIC)
def test_non_arithmetic_encodings(hexcode: str, mnemonic: str) -> None:
    insn = disassemble({0x1000: bytes.fromhex(hexcode)})[0x1000]
    assert insn.mnemonic == mnemonic
    assert classify(insn.mnemonic, insn.operands) is None


@needs_objdump
def test_many_instructions_in_one_run() -> None:
    """All encodings at once, back to back and far apart: every address decodes correctly."""
    code: dict[int, bytes] = {}
    expected: dict[int, str] = {}
    addr = 0x400000
    pairs = [(h, m) for h, m, *_rest in ARITHMETIC] + NOT_ARITHMETIC
    for i, (hexcode, mnemonic) in enumerate(pairs):
        raw = bytes.fromhex(hexcode)
        code[addr] = raw
        expected[addr] = mnemonic
        addr += len(raw) if i % 3 else 4096  # runs of adjacent instructions, then a gap
    decoded = disassemble(code)
    assert {a: d.mnemonic for a, d in decoded.items()} == expected


@needs_objdump
def test_misaligned_neighbour_is_decoded_alone() -> None:
    # 0x10 is inside the 6-byte vaddpd at 0x0c, so a linear decode of the run never starts an
    # instruction there; the address is decoded on its own in a second pass.
    evex = bytes.fromhex("62f1f54858c2")
    code = {0x0C: evex, 0x10: bytes.fromhex("58c2")}
    decoded = disassemble(code)
    assert decoded[0x0C].mnemonic == "vaddpd"
    assert 0x10 in decoded


def test_classify_text_forms() -> None:
    fp = classify("vfmadd231pd", "ymm0,ymm1,YMMWORD PTR [rax]")
    assert fp is not None and fp.flops == 8 and fp.precision is Precision.DOUBLE
    fp = classify("{vex} vfmadd231ps", "xmm0,xmm1,xmm2")
    assert fp is not None and fp.flops == 8
    masked = classify("vaddpd", "zmm0{k1},zmm1,zmm2")
    assert masked is not None and masked.masked and masked.flops == 8
    assert classify("vfmaddps", "xmm0,xmm1,xmm2,xmm3") is not None  # FMA4 (AMD)
    assert classify("", "") is None
    assert classify("nop", "") is None
