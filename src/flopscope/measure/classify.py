"""Classify x86-64 instructions as floating-point arithmetic and count their FLOPs.

The rules follow what Intel's ``FP_ARITH_INST_RETIRED.*`` events count (Intel 64 and IA-32
Architectures Optimization Reference Manual, "Floating-point arithmetic" performance events):
ADD, SUB, MUL, DIV, MIN, MAX, SQRT, RCP, RSQRT, HADD, HSUB, ADDSUB, DPP and FMA instructions, scalar
or packed, single or double precision, one operation per lane, FMA (and its variants) two per
lane.  Moves, logic (``xorps`` zeroing, ``andps`` masking), broadcasts, shuffles, blends,
conversions, compares and rounding perform no floating-point arithmetic and count zero.

The input is a mnemonic and its operands in Intel syntax, as printed by ``objdump -M intel``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["FpInstruction", "Precision", "classify"]


class Precision(str, enum.Enum):
    """Floating-point precision of an arithmetic instruction."""

    DOUBLE = "double"
    SINGLE = "single"
    HALF = "half"
    BFLOAT16 = "bfloat16"
    X87 = "x87"


@dataclass(frozen=True)
class FpInstruction:
    """One floating-point arithmetic instruction, as classified.

    Attributes:
        mnemonic: the instruction mnemonic (lower case, prefixes removed).
        precision: the precision of the arithmetic.
        width_bits: vector register width (0 for scalar and x87).
        lanes: number of elements operated on.
        flops_per_lane: operations per element (2 for fused multiply-add).
        masked: True if an AVX-512 write mask is applied; the mask's value is unknown statically,
            so all lanes are counted (an upper bound).
    """

    mnemonic: str
    precision: Precision
    width_bits: int
    lanes: int
    flops_per_lane: int
    masked: bool = False

    @property
    def flops(self) -> int:
        """FLOPs performed by one execution of the instruction."""
        return self.lanes * self.flops_per_lane


_ELEMENT_BITS = {"d": 64, "s": 32, "h": 16}
_PRECISION = {"d": Precision.DOUBLE, "s": Precision.SINGLE, "h": Precision.HALF}

# One operation per lane (suffix ss/sd/sh = scalar, ps/pd/ph = packed).
_ONE_PER_LANE = re.compile(
    r"^v?(add|sub|mul|div|min|max|sqrt|rcp|rsqrt|rcp14|rsqrt14|rcp28|rsqrt28|scalef|"
    r"addsub|hadd|hsub)(?P<kind>[sp])(?P<elem>[sdh])$"
)
# Fused multiply-add family (FMA3: 132/213/231 operand orders; FMA4 without): 2 per lane.
_FMA = re.compile(r"^vf(n?madd|n?msub|maddsub|msubadd)(132|213|231)?(?P<kind>[sp])(?P<elem>[sdh])$")
# Dot product with a selection mask (dpps/dppd): a multiply and an add per lane.
_DPP = re.compile(r"^v?dpp(?P<elem>[sd])$")
# bfloat16 pair dot products accumulated into float32: 2 multiplies + 2 adds per float32 lane.
_BF16_DOT = re.compile(r"^vdpbf16ps$")
# x87 arithmetic (long double and legacy code).
_X87 = re.compile(
    r"^f(i?add|addp|i?sub|subp|i?subr|subrp|i?mul|mulp|i?div|divp|i?divr|divrp|sqrt)$"
)

_PREFIXES = {"lock", "rep", "repz", "repnz", "repe", "repne", "bnd", "notrack", "data16", "addr32"}
_REGISTER_WIDTH = (("zmm", 512), ("ymm", 256), ("xmm", 128))
_MEMORY_WIDTH = (("zmmword", 512), ("ymmword", 256), ("xmmword", 128))


def _strip_prefixes(mnemonic: str) -> str:
    parts = [p for p in mnemonic.lower().split() if p not in _PREFIXES and not p.startswith("{")]
    return parts[0] if parts else ""


def _vector_width(operands: str) -> int:
    """Width of the destination register, else the widest register or memory operand."""
    ops = operands.lower()
    first = ops.split(",", 1)[0]
    for name, bits in _REGISTER_WIDTH:
        if name in first:
            return bits
    for name, bits in _REGISTER_WIDTH + _MEMORY_WIDTH:
        if name in ops:
            return bits
    return 128  # legacy SSE with a memory destination cannot occur for arithmetic; xmm default


def _is_masked(operands: str) -> bool:
    return re.search(r"\{k[1-7]\}", operands) is not None


def classify(mnemonic: str, operands: str = "") -> FpInstruction | None:
    """Classify one instruction.

    Args:
        mnemonic: the mnemonic as printed by the disassembler (prefixes such as ``lock`` or
            ``{vex}`` are ignored).
        operands: the operand text in Intel syntax (``ymm0,ymm1,YMMWORD PTR [rax]``).

    Returns:
        An :class:`FpInstruction` for floating-point arithmetic, or ``None`` for anything else
        (integer, move, logic, shuffle, conversion, compare, ...).
    """
    m = _strip_prefixes(mnemonic)
    if not m:
        return None
    masked = _is_masked(operands)
    match = _FMA.match(m)
    if match is not None:
        return _vector(m, match.group("kind"), match.group("elem"), operands, 2, masked)
    match = _ONE_PER_LANE.match(m)
    if match is not None:
        return _vector(m, match.group("kind"), match.group("elem"), operands, 1, masked)
    match = _DPP.match(m)
    if match is not None:
        return _vector(m, "p", match.group("elem"), operands, 2, masked)
    if _BF16_DOT.match(m):
        width = _vector_width(operands)
        return FpInstruction(m, Precision.BFLOAT16, width, width // 32, 4, masked)
    if _X87.match(m):
        return FpInstruction(m, Precision.X87, 0, 1, 1, False)
    return None


def _vector(
    mnemonic: str, kind: str, elem: str, operands: str, per_lane: int, masked: bool
) -> FpInstruction:
    precision = _PRECISION[elem]
    if kind == "s":
        return FpInstruction(mnemonic, precision, 0, 1, per_lane, masked)
    width = _vector_width(operands)
    return FpInstruction(mnemonic, precision, width, width // _ELEMENT_BITS[elem], per_lane, masked)
