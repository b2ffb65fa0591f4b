"""The ``valgrind`` backend: executed floating-point instructions, without hardware counters.

The workload is built and run in a child process under ``valgrind --tool=callgrind
--dump-instr=yes``, which counts how many times each instruction executed.  Instrumentation is
switched on only around the measured region (client requests, see
:mod:`flopscope.measure.valgrind._client`), so start-up, ``import torch`` and building the model
cost nothing in the result.  Afterwards each executed instruction is read back (from its ELF
file, or from the bytes the child captured for run-time generated code), disassembled with
``objdump`` and classified by :func:`flopscope.measure.classify.classify`; FLOPs = sum over
instructions of executions x lanes x operations per lane (:mod:`.code`).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flopscope.errors import BackendUnavailableError, MeasureError, SourceError, UsageError
from flopscope.measure.backend import MeasuredRun, ProgressFn
from flopscope.measure.disasm import objdump_path
from flopscope.measure.result import Measurement
from flopscope.measure.valgrind.callgrind import dump_files, parse_callgrind
from flopscope.measure.valgrind.code import analyze, read_captured
from flopscope.measure.valgrind.contract import (
    CAPTURE_FILE,
    SEGMENT_PREFIX,
    ChildRequest,
    ChildResult,
)
from flopscope.measure.workload import Workload

__all__ = ["FAST_ISA_ENV", "ValgrindBackend", "ValgrindOptions", "unavailable_reason"]

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


@functools.cache
def unavailable_reason() -> str | None:
    """Why the valgrind backend cannot run here (checked once per process).

    Returns:
        ``None`` if it can, else a sentence naming what is missing.
    """
    if sys.platform != "linux":
        return f"valgrind backend needs Linux (this is {sys.platform})"
    if platform.machine() != "x86_64":
        return f"valgrind backend decodes x86-64 only (this is {platform.machine()})"
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    if objdump_path() is None:
        return "objdump is not installed (apt-get install binutils)"
    return None


def _stream(proc: subprocess.Popen[str], progress: ProgressFn | None, tail: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        del tail[:-40]
        if progress is not None and line.startswith("[flopscope child]"):
            progress(line[len("[flopscope child] ") :])


def _raise_child_error(error: Mapping[str, object]) -> None:
    message = f"{error.get('type')}: {error.get('message')}"
    if error.get("type") == "SourceError":
        raise SourceError(str(error.get("message")))
    if error.get("usage"):
        raise UsageError(str(error.get("message")))
    raise MeasureError(f"building the workload in the measured process failed: {message}")


class ValgrindBackend:
    """Per-instruction execution counts from callgrind, classified into FLOPs.

    Args:
        options: see :class:`ValgrindOptions`.
    """

    name = "valgrind"

    def __init__(self, options: ValgrindOptions | None = None) -> None:
        self.options = options or ValgrindOptions()

    def unavailable_reason(self) -> str | None:
        """Returns: ``None`` if valgrind and objdump are here on Linux x86-64, else why not."""
        return unavailable_reason()

    def measure(self, workload: Workload, *, progress: ProgressFn | None = None) -> MeasuredRun:
        """Build and run ``workload`` in a child under callgrind; classify what it executed.

        Args:
            workload: the workload (its spec must be sendable to a child process).
            progress: called with a short message at each stage.

        Returns:
            The measurement (per segment module when the workload has a model) and the count
            the child made of the same model, if any.

        Raises:
            BackendUnavailableError: if valgrind or objdump is missing.
            SourceError: the child could not load the workload's model source.
            MeasureError: if the child fails (its last output lines are included) or times out.
        """
        opts = self.options
        reason = self.unavailable_reason()
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
            request = ChildRequest(
                out_dir=str(out_dir),
                workload=workload.spec(out_dir),
                threads=opts.threads,
                warmup=opts.warmup,
                segment_depth=opts.segment_depth if opts.segments else 0,
            )
            request.write()
            child = self._run_child(out_dir, say)
            if child.error is not None:
                _raise_child_error(child.error)
            if not child.valgrind_layers:
                raise MeasureError(
                    "the child did not detect valgrind; client requests had no effect"
                )
            say("reading callgrind output")
            dumps = [parse_callgrind(p) for p in dump_files(out_dir, child.pid)]
            region = [d for d in dumps if d.label.startswith(SEGMENT_PREFIX)]
            if not region:
                raise MeasureError(f"no measured-region dump found in {out_dir}")
            captured = read_captured(out_dir / CAPTURE_FILE)
            say(f"disassembling executed instructions ({sum(len(d.counts) for d in region)} sites)")
            res = analyze(region, captured)
        finally:
            if tmp is not None:
                tmp.cleanup()
        notes = [
            f"valgrind/callgrind: {res.instructions_total:,} instructions executed in the region",
            (
                f"torch {child.torch_version}, {child.threads} thread(s), "
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
        say("done")
        measurement = Measurement(
            backend=self.name,
            flops=sum(res.flops_by_precision.values()),
            flops_by_precision=res.flops_by_precision,
            segments=res.segments if opts.segments and len(res.segments) > 1 else {},
            by_instruction=dict(sorted(res.by_instruction.items(), key=lambda kv: -kv[1])),
            region_seconds=child.region_seconds,
            wall_seconds=time.perf_counter() - t_start,
            notes=tuple(notes),
        )
        report = None
        if child.report is not None:
            from flopscope.report.report import Report

            report = Report.from_dict(child.report)
        return MeasuredRun(measurement, report)

    def _run_child(self, out_dir: Path, say: ProgressFn) -> ChildResult:
        opts = self.options
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[3])
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
            "flopscope.measure.valgrind._child",
            str(out_dir),
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
        if rc != 0:
            log = out_dir / "valgrind.log"
            vg_tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else []
            detail = "\n".join(tail[-15:] + vg_tail)
            raise MeasureError(f"the measured process failed (exit {rc}):\n{detail}")
        return ChildResult.read(out_dir)
