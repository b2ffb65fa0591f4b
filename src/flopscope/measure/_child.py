"""Child process run under ``valgrind --tool=callgrind``: build the workload, measure one region.

Usage: ``python -m flopscope.measure._child SPEC.json``.  Callgrind starts with instrumentation
off (``--instr-atstart=no``), so interpreter start-up, ``import torch``, model construction and
warm-up runs are not counted.  Around the region the child:

1. starts instrumentation and dumps once (label ``flopscope:setup``, discarded by the parent);
2. runs the region, dumping at each top-level module boundary (label ``flopscope:seg:PATH``, the
   path of the module whose code ran since the previous dump; ``""`` is the root's own code);
3. stops instrumentation, then copies the bytes of executed code that has no file behind it
   (oneDNN generates its kernels at run time) from its own memory, because the parent can only
   read instructions from files.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

SETUP_LABEL = "flopscope:setup"
SEGMENT_PREFIX = "flopscope:seg:"
CAPTURE_FILE = "captured_code.bin"
RESULT_FILE = "child_result.json"


def _say(msg: str) -> None:
    print(f"[flopscope child] {msg}", file=sys.stderr, flush=True)


def _readable_ranges() -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if fields[1].startswith("r"):
                ranges.append((lo, hi))
    return ranges


def anonymous_addresses(dump_files: list[Path]) -> set[int]:
    """Executed addresses in callgrind dumps that belong to no object file (``ob=???``).

    Args:
        dump_files: callgrind output files.

    Returns:
        The addresses.
    """
    found: set[int] = set()
    for path in dump_files:
        ob = ""
        skip = False
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if skip:
                    skip = False
                    continue
                if line.startswith("ob="):
                    ob = line[3:].strip()
                elif line.startswith("calls="):
                    skip = True
                elif ob == "???" and line.startswith("0x"):
                    found.add(int(line.split(None, 1)[0], 16))
    return found


def capture_code(addresses: set[int], out: Path) -> int:
    """Write the bytes at ``addresses`` (whole pages, within readable mappings) to ``out``.

    Format: repeated records of ``<QI`` (start address, length) followed by the bytes.

    Args:
        addresses: executed instruction addresses.
        out: destination file.

    Returns:
        The number of bytes written.
    """
    page = 4096
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


def main(argv: list[str]) -> int:
    """Entry point.

    Args:
        argv: ``[SPEC.json]``.

    Returns:
        Exit status.
    """
    t_start = time.perf_counter()
    spec_path = Path(argv[0])
    cfg: dict[str, Any] = json.loads(spec_path.read_text())
    out_dir = Path(cfg["out_dir"])
    _say("python started under valgrind; importing torch")
    import torch

    from flopscope.measure._vgclient import ClientRequests
    from flopscope.measure.workload import WorkloadSpec, load_workload, segment_modules

    torch.set_num_threads(int(cfg.get("threads", 1)))
    _say(f"imported torch ({time.perf_counter() - t_start:.1f} s); building the workload")
    workload = load_workload(WorkloadSpec.from_json(cfg["workload"]))
    for i in range(int(cfg.get("warmup", 1))):
        _say(f"warm-up run {i + 1} (not measured)")
        workload.run()
    client = ClientRequests()
    layers = client.running_on_valgrind()
    current = [""]
    handles: list[Any] = []
    if cfg.get("segments", True) and workload.module is not None:

        def make_hooks(name: str) -> tuple[Any, Any]:
            def pre(_m: Any, _a: Any) -> None:
                client.dump_stats_at(SEGMENT_PREFIX + current[0])
                current[0] = name

            def post(_m: Any, _a: Any, _o: Any) -> None:
                client.dump_stats_at(SEGMENT_PREFIX + name)
                current[0] = ""

            return pre, post

        for name, child in segment_modules(workload.module, int(cfg.get("segment_depth", 1))):
            pre, post = make_hooks(name)
            handles.append(child.register_forward_pre_hook(pre))
            handles.append(child.register_forward_hook(post))
    _say("running the measured region (instrumented)")
    try:
        client.start_instrumentation()
        client.dump_stats_at(SETUP_LABEL)
        t0 = time.perf_counter()
        workload.run()
        region = time.perf_counter() - t0
        client.dump_stats_at(SEGMENT_PREFIX + current[0])
        client.stop_instrumentation()
    finally:
        for h in handles:
            h.remove()
    _say(f"measured region took {region:.1f} s; capturing run-time generated code")
    dumps = sorted(out_dir.glob(f"callgrind.out.{os.getpid()}.*"))
    captured = capture_code(anonymous_addresses(dumps), out_dir / CAPTURE_FILE)
    (out_dir / RESULT_FILE).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "valgrind_layers": layers,
                "region_seconds": region,
                "captured_bytes": captured,
                "torch_version": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
