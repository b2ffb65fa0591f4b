"""Disassemble executed instructions from their bytes, in one ``objdump`` run.

Each executed instruction is known by its address and the bytes at that address (read from the
ELF file, or captured from process memory for run-time generated code).  Consecutive executed
instructions are laid out as contiguous runs in one flat binary; runs are separated by 16
single-byte ``nop`` (0x90) so that a desynchronised decode at the end of a run (the bytes after the
last executed instruction of a run are not necessarily an instruction) realigns before the next
run: no x86 instruction is longer than 15 bytes.  An executed address that does not come out as an
instruction start is decoded again on its own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flopscope.errors import MeasureError

__all__ = ["Instruction", "disassemble", "objdump_path"]

MAX_INSN_BYTES = 15
_SLED = b"\x90" * 16
_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S.*)$")


@dataclass(frozen=True)
class Instruction:
    """A decoded instruction.

    Attributes:
        mnemonic: mnemonic, possibly with prefixes (``lock add``, ``{vex} vpdpbusd``).
        operands: operand text in Intel syntax.
    """

    mnemonic: str
    operands: str


def objdump_path() -> str | None:
    """Returns: the path of GNU objdump, or ``None`` if it is not installed."""
    return shutil.which("objdump")


def _split(text: str) -> Instruction:
    text = text.split("#", 1)[0].strip()
    tokens = text.split(None, 1)
    mnemonic = tokens[0]
    rest = tokens[1] if len(tokens) > 1 else ""
    # Prefixes printed as separate words ("lock", "rep", "{vex}", "bnd", "notrack", "data16").
    while rest and (
        mnemonic in {"lock", "rep", "repz", "repnz", "repe", "repne", "bnd", "notrack", "data16"}
        or mnemonic.startswith("{")
    ):
        tokens = rest.split(None, 1)
        mnemonic = f"{mnemonic} {tokens[0]}"
        rest = tokens[1] if len(tokens) > 1 else ""
    return Instruction(mnemonic, rest.strip())


def _run_objdump(blob: bytes) -> dict[int, Instruction]:
    exe = objdump_path()
    if exe is None:
        raise MeasureError("objdump (GNU binutils) is needed to disassemble; install binutils")
    with tempfile.TemporaryDirectory(prefix="flopscope-disasm-") as tmp:
        path = Path(tmp) / "code.bin"
        path.write_bytes(blob)
        proc = subprocess.run(
            [
                exe,
                "-D",
                "-z",
                "-b",
                "binary",
                "-m",
                "i386:x86-64",
                "-M",
                "intel",
                "--no-show-raw-insn",
                str(path),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise MeasureError(f"objdump failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}")
    out: dict[int, Instruction] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m is not None:
            out[int(m.group(1), 16)] = _split(m.group(2))
    return out


def disassemble(code: Mapping[int, bytes]) -> dict[int, Instruction]:
    """Decode the instruction at each address.

    Args:
        code: for each executed address, the bytes starting there (at least the instruction's
            length; 15 bytes is always enough).  Addresses are opaque keys: they only need to be
            consistent with each other within the same code object.

    Returns:
        The decoded instruction for each address that could be decoded.

    Raises:
        MeasureError: if objdump is missing or fails.
    """
    addresses = sorted(code)
    # Build runs of executed instructions lying within 15 bytes of each other.
    blob = bytearray()
    where: dict[int, int] = {}  # blob offset -> address
    i = 0
    while i < len(addresses):
        start = addresses[i]
        j = i
        while j + 1 < len(addresses) and addresses[j + 1] - addresses[j] <= MAX_INSN_BYTES:
            j += 1
        end = addresses[j]
        run = bytearray()
        for k in range(i, j + 1):
            a = addresses[k]
            data = code[a]
            off = a - start
            if len(run) < off:  # hole (should not happen for contiguous code); pad with nops
                run.extend(b"\x90" * (off - len(run)))
            if len(run) < off + len(data):
                run.extend(data[len(run) - off :])
        base = len(blob)
        for k in range(i, j + 1):
            where[base + addresses[k] - start] = addresses[k]
        blob.extend(run[: end - start + MAX_INSN_BYTES])
        blob.extend(_SLED)
        i = j + 1
    decoded = _run_objdump(bytes(blob)) if blob else {}
    result: dict[int, Instruction] = {}
    missing: list[int] = []
    for off, addr in where.items():
        insn = decoded.get(off)
        if insn is None:
            missing.append(addr)
        else:
            result[addr] = insn
    if missing:
        # Decode each missed address on its own (bytes + sled).
        blob2 = bytearray()
        where2: dict[int, int] = {}
        for addr in missing:
            where2[len(blob2)] = addr
            blob2.extend(code[addr][:MAX_INSN_BYTES])
            blob2.extend(_SLED)
        decoded2 = _run_objdump(bytes(blob2))
        for off, addr in where2.items():
            insn = decoded2.get(off)
            if insn is not None:
                result[addr] = insn
    return result
