"""Child process run under ``valgrind --tool=callgrind``: build the workload once, measure it.

Usage: ``python -m flopscope.measure.valgrind._child DIR`` (``DIR/request.json`` is a
:class:`~flopscope.measure.valgrind.contract.ChildRequest`).  Callgrind starts with
instrumentation off (``--instr-atstart=no``), so interpreter start-up, ``import torch``, building
(and, for a model source, counting) the workload and the warm-up runs are not measured.  Around the
region the child:

1. starts instrumentation and dumps once (label ``flopscope:setup``, discarded by the parent);
2. runs the region, dumping whenever the running segment changes (label ``flopscope:seg:PATH``,
   the segment whose code ran since the previous dump; ``""`` is code outside them), as
   :class:`~flopscope.measure.workload.SegmentMarks` follows module entries and exits;
3. stops instrumentation, then copies the bytes of executed code that has no file behind it
   (oneDNN generates its kernels at run time) from its own memory, because the parent can only
   read instructions from files;
4. writes a :class:`~flopscope.measure.valgrind.contract.ChildResult` (with the workload's
   flopscope count, if it made one).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from flopscope.measure.valgrind.contract import (
    CAPTURE_FILE,
    REQUEST_FILE,
    SEGMENT_PREFIX,
    SETUP_LABEL,
    ChildRequest,
    ChildResult,
)


def _say(msg: str) -> None:
    print(f"[flopscope child] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Entry point.

    Args:
        argv: ``[DIR]``.

    Returns:
        Exit status (0 also when the workload failed: the result file says how).
    """
    request = ChildRequest.read(Path(argv[0]) / REQUEST_FILE)
    out_dir = Path(request.out_dir)
    import torch

    from flopscope.errors import UsageError
    from flopscope.measure.valgrind._client import ClientRequests
    from flopscope.measure.valgrind.callgrind import NO_FILE, dump_files, parse_callgrind
    from flopscope.measure.valgrind.code import capture_code
    from flopscope.measure.workload import SegmentMarks

    torch.set_num_threads(request.threads)
    _say("python and torch started under valgrind; building (and counting) the workload")
    try:
        region = request.workload.build()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which re-raises it
        ChildResult(
            pid=os.getpid(),
            error={
                "type": type(exc).__name__,
                "message": str(exc),
                "usage": isinstance(exc, UsageError),
            },
        ).write(out_dir)
        _say(f"building the workload failed: {type(exc).__name__}: {exc}")
        return 0
    for i in range(request.warmup):
        _say(f"warm-up run {i + 1} (not measured)")
        region.run()
    client = ClientRequests()
    layers = client.running_on_valgrind()
    marks = None
    depth = request.segment_depth if region.depth is None else region.depth
    if request.segment_depth > 0 and depth > 0 and region.module is not None:
        marks = SegmentMarks(
            region.module, depth, lambda seg: client.dump_stats_at(SEGMENT_PREFIX + seg)
        )
        marks.install()
    _say("running the measured region (instrumented)")
    try:
        client.start_instrumentation()
        # the clock is read outside the measured dumps: perf_counter() divides nanoseconds by
        # 1e9 and the difference subtracts, 3 floating-point operations that are not the model's
        t0 = time.perf_counter()
        client.dump_stats_at(SETUP_LABEL)
        region.run()
        if marks is not None:
            marks.finish()
        else:
            client.dump_stats_at(SEGMENT_PREFIX)
        seconds = time.perf_counter() - t0
        client.stop_instrumentation()
    finally:
        if marks is not None:
            marks.remove()
    _say(f"measured region took {seconds:.1f} s; capturing run-time generated code")
    anonymous: set[int] = set()
    for path in dump_files(out_dir, os.getpid()):
        anonymous.update(addr for _ob, addr in parse_callgrind(path, {NO_FILE}).counts)
    captured = capture_code(anonymous, out_dir / CAPTURE_FILE)
    ChildResult(
        pid=os.getpid(),
        valgrind_layers=layers,
        region_seconds=seconds,
        captured_bytes=captured,
        torch_version=str(torch.__version__),
        threads=torch.get_num_threads(),
        report=None if region.report is None else region.report.to_dict(),
    ).write(out_dir)
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
