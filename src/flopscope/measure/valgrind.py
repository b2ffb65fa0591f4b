"""The ``valgrind`` backend: executed floating-point instructions, without hardware counters.

The workload runs in a child process under ``valgrind --tool=callgrind --dump-instr=yes``, which
counts how many times each instruction executed.  Instrumentation is switched on only around the
measured region (client requests, see :mod:`flopscope.measure._vgclient`), so start-up and
``import torch`` cost nothing in the result.  Afterwards each executed instruction is read back
(from its ELF file, or from the bytes the child captured for run-time generated code),
disassembled with ``objdump`` and classified by :func:`flopscope.measure.classify.classify`;
FLOPs = sum over instructions of executions x lanes x operations per lane.

Callgrind writes addresses of instructions in an object file as the file's own virtual addresses
(the load bias removed), which is what the ELF program headers map to file offsets.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flopscope.errors import BackendUnavailableError, MeasureError
from flopscope.measure import _child
from flopscope.measure.classify import classify
from flopscope.measure.disasm import MAX_INSN_BYTES, disassemble, objdump_path
from flopscope.measure.result import Measurement
from flopscope.measure.workload import WorkloadSpec

__all__ = [
    "CallgrindDump",
    "ValgrindOptions",
    "analyze",
    "measure_valgrind",
    "parse_callgrind",
    "read_elf_bytes",
    "unavailable_reason",
]

ProgressFn = Callable[[str], None]

# Under valgrind, FMA instructions are emulated by a helper call and run ~600x slower than other
# vector arithmetic.  These variables make MKL and oneDNN pick SSE code paths instead (no FMA);
# the arithmetic performed is the same (an FMA is one multiply and one add either way).
FAST_ISA_ENV = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}


@dataclass(frozen=True)
class ValgrindOptions:
    """Options of a valgrind measurement.

    Attributes:
        threads: torch intra-op threads in the child (valgrind serialises threads anyway).
        warmup: unmeasured runs before the measured one (oneDNN generates kernels on first use).
        segments: split the result per module of the workload's model.
        segment_depth: module depth of the split (1 = top-level children; deeper levels give
            finer attribution at the cost of one callgrind dump per module call).
        fast_isa: restrict MKL/oneDNN to SSE code paths (see ``FAST_ISA_ENV``).
        timeout_s: give up after this many seconds.
        keep_dir: keep the callgrind files in this directory instead of a temporary one.
        extra_env: more environment variables for the child.
    """

    threads: int = 1
    warmup: int = 1
    segments: bool = True
    segment_depth: int = 1
    fast_isa: bool = True
    timeout_s: float = 3600.0
    keep_dir: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


def unavailable_reason() -> str | None:
    """Why the valgrind backend cannot run here.

    Returns:
        ``None`` if it can, else a sentence naming what is missing.
    """
    if sys.platform != "linux":
        return f"valgrind backend needs Linux (this is {sys.platform})"
    import platform

    if platform.machine() != "x86_64":
        return f"valgrind backend decodes x86-64 only (this is {platform.machine()})"
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    if objdump_path() is None:
        return "objdump is not installed (apt-get install binutils)"
    return None


@dataclass
class CallgrindDump:
    """One callgrind output file.

    Attributes:
        label: the client-request label that triggered the dump (``""`` for the final dump).
        part: the dump's part number (order within the run).
        counts: executions per ``(object, address)``; ``"???"`` is code without a file.
    """

    label: str
    part: int
    counts: dict[tuple[str, int], int]


def parse_callgrind(path: Path) -> CallgrindDump:
    """Parse a callgrind file written with ``--dump-instr=yes --dump-line=no --compress-pos=no
    --compress-strings=no`` and the single event ``Ir``.

    A ``calls=`` line is followed by a line carrying the *inclusive* cost of that call, which is
    skipped: self costs alone add up to the executed instructions.

    Args:
        path: the file.

    Returns:
        The parsed dump.

    Raises:
        MeasureError: if the file is not in the expected format.
    """
    label = ""
    part = 0
    counts: dict[tuple[str, int], int] = defaultdict(int)
    ob = ""
    skip = False
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if skip:
                skip = False
                continue
            c = line[:1]
            if c == "0":
                fields = line.split()
                if len(fields) >= 2:
                    counts[(ob, int(fields[0], 16))] += int(fields[1])
            elif line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("calls="):
                skip = True
            elif line.startswith("desc: Trigger: Client Request: "):
                label = line[len("desc: Trigger: Client Request: ") :].rstrip("\n")
            elif line.startswith("part:"):
                part = int(line.split(":", 1)[1])
            elif line.startswith("positions:") and line.split(":", 1)[1].split() != ["instr"]:
                raise MeasureError(f"{path}: unexpected callgrind positions line {line.strip()!r}")
            elif c in "+-*":
                raise MeasureError(f"{path}: compressed positions are not supported")
    return CallgrindDump(label, part, dict(counts))


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
        page = a & ~4095
        blob = pages.get(page)
        if blob is None:
            continue
        data = blob[a - page :]
        if len(data) < MAX_INSN_BYTES and page + 4096 in pages:
            data += pages[page + 4096][: MAX_INSN_BYTES - len(data)]
        out[a] = data[:MAX_INSN_BYTES]
    return out


@dataclass
class _Analysis:
    flops_by_precision: dict[str, int]
    segments: dict[str, int]
    by_instruction: dict[str, int]
    instructions_total: int
    instructions_undecoded: int


def analyze(dumps: list[CallgrindDump], captured: list[tuple[int, bytes]]) -> _Analysis:
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
        if ob == "???":
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
        path = d.label[len(_child.SEGMENT_PREFIX) :]
        seg_flops = 0
        for (ob, addr), n in d.counts.items():
            total += n
            key = ((obj_index[ob] + 1) << 48) + addr
            if key not in cache:
                insn = decoded.get(key)
                if insn is None:
                    cache[key] = None
                    undecoded_marker = True
                else:
                    undecoded_marker = False
                    fp = classify(insn.mnemonic, insn.operands)
                    cache[key] = (fp.mnemonic, fp.precision.value, fp.flops) if fp else ("", "", 0)
                if undecoded_marker:
                    undecoded += n
                    continue
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
    return _Analysis(
        dict(flops_by_precision), dict(segments), dict(by_instruction), total, undecoded
    )


def _stream(proc: subprocess.Popen[str], progress: ProgressFn | None, tail: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        del tail[:-40]
        if progress is not None and line.startswith("[flopscope child]"):
            progress(line[len("[flopscope child] ") :])


def measure_valgrind(
    spec: WorkloadSpec,
    options: ValgrindOptions | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Measure a workload under callgrind.

    Args:
        spec: how the child rebuilds the workload.
        options: see :class:`ValgrindOptions`.
        progress: called with a short message at each stage.

    Returns:
        The measurement, with per-module segments when the workload has a model.

    Raises:
        BackendUnavailableError: if valgrind or objdump is missing.
        MeasureError: if the child fails (its last output lines are included) or times out.
    """
    opts = options or ValgrindOptions()
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        if progress is not None:
            progress(f"{msg} [{time.perf_counter() - t_start:.0f} s]")

    tmp: tempfile.TemporaryDirectory[str] | None = None
    if opts.keep_dir is not None:
        out_dir = Path(opts.keep_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("callgrind.out.*"):
            old.unlink()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="flopscope-valgrind-")
        out_dir = Path(tmp.name)
    try:
        cfg = {
            "out_dir": str(out_dir),
            "workload": spec.to_json(),
            "threads": opts.threads,
            "warmup": opts.warmup,
            "segments": opts.segments,
            "segment_depth": opts.segment_depth,
        }
        spec_file = out_dir / "spec.json"
        spec_file.write_text(json.dumps(cfg))
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["OMP_NUM_THREADS"] = str(opts.threads)
        if opts.fast_isa:
            env.update(FAST_ISA_ENV)
        env.update(opts.extra_env)
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--dump-instr=yes",
            "--dump-line=no",
            "--compress-pos=no",
            "--compress-strings=no",
            f"--callgrind-out-file={out_dir}/callgrind.out.%p",
            f"--log-file={out_dir}/valgrind.log",
            sys.executable,
            "-m",
            "flopscope.measure._child",
            str(spec_file),
        ]
        say("starting python under valgrind (start-up and import torch are not measured)")
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        tail: list[str] = []
        reader = threading.Thread(target=_stream, args=(proc, say, tail), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=opts.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise MeasureError(f"valgrind run timed out after {opts.timeout_s:.0f} s") from None
        reader.join(timeout=5)
        result_file = out_dir / _child.RESULT_FILE
        if rc != 0 or not result_file.exists():
            log = out_dir / "valgrind.log"
            vg_tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else []
            detail = "\n".join(tail[-15:] + vg_tail)
            raise MeasureError(f"the measured process failed (exit {rc}):\n{detail}")
        child = json.loads(result_file.read_text())
        if not child.get("valgrind_layers"):
            raise MeasureError("the child did not detect valgrind; client requests had no effect")
        say("reading callgrind output")
        dumps = [parse_callgrind(p) for p in _dump_files(out_dir, int(child["pid"]))]
        region = [d for d in dumps if d.label.startswith(_child.SEGMENT_PREFIX)]
        if not region:
            raise MeasureError(f"no measured-region dump found in {out_dir}")
        captured = read_captured(out_dir / _child.CAPTURE_FILE)
        say(f"disassembling executed instructions ({sum(len(d.counts) for d in region)} sites)")
        res = analyze(region, captured)
        notes = [
            f"valgrind/callgrind: {res.instructions_total:,} instructions executed in the region",
            (
                f"torch {child.get('torch_version')}, {child.get('threads')} thread(s), "
                f"{opts.warmup} unmeasured warm-up run(s)"
            ),
        ]
        if opts.fast_isa:
            notes.append(
                "MKL/oneDNN limited to SSE code paths for speed under valgrind "
                + ", ".join(f"{k}={v}" for k, v in FAST_ISA_ENV.items())
            )
        if res.instructions_undecoded:
            notes.append(
                f"{res.instructions_undecoded:,} executed instructions could not be "
                "read or decoded and were not classified"
            )
        flops = sum(res.flops_by_precision.values())
        segments = res.segments if opts.segments and len(res.segments) > 1 else {}
        say("done")
        return Measurement(
            backend="valgrind",
            flops=flops,
            flops_by_precision=res.flops_by_precision,
            segments=segments,
            by_instruction=dict(sorted(res.by_instruction.items(), key=lambda kv: -kv[1])),
            region_seconds=float(child["region_seconds"]),
            wall_seconds=time.perf_counter() - t_start,
            notes=tuple(notes),
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


def _dump_files(out_dir: Path, pid: int) -> Iterator[Path]:
    yield from sorted(out_dir.glob(f"callgrind.out.{pid}.*"))
