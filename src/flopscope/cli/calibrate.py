"""``flopscope calibrate``: run the calibration microbenchmarks on this machine and write a
hardware profile file with them (:func:`flopscope.estimate.calibrate.calibrate`), which
``--hardware FILE`` then uses for predictions beside the bound."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from flopscope.cli._options import EXIT_OK, usage_error, write_output
from flopscope.cli.types import named_file, positive_int, profile

__all__ = ["add_subcommands", "run_calibrate"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``calibrate`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    p = subparsers.add_parser(
        "calibrate", help="time microbenchmarks here and write a calibrated hardware profile",
        description="Time microbenchmarks on this machine (matrix products by shape, "
                    "convolutions, element-wise, reductions, normalisations and special "
                    "functions by size, attention, and the host time of an eager call per "
                    "operator family) and write them, raw, with the date and versions, into a "
                    "hardware profile file. --hardware FILE then predicts time beside the "
                    "roofline bound. About 15-60 s on one CPU core.",
        epilog="Example: flopscope calibrate --threads 1 --output cpu.json; flopscope count "
               "torchvision:resnet18 --hardware cpu.json",
    )
    p.add_argument("--hardware", type=profile, default="this-machine",
                   metavar="NAME|FILE|this-machine",
                   help="the profile whose peaks the bound keeps (default this-machine: measured "
                        "first, about 15 s)")
    p.add_argument("--output", metavar="FILE", required=True, type=named_file,
                   help="the profile file to write (JSON)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch's intra-op threads during the calibration (default: as set)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where the microbenchmarks run (default cuda when available, else cpu)")
    p.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    """Run ``flopscope calibrate``.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code.

    Raises:
        UsageError: an unwritable output, an unknown profile, no CUDA device for ``--device
            cuda``.
    """
    import torch

    from flopscope.estimate.calibrate import calibrate
    from flopscope.estimate.hardware import get_hardware

    if args.device == "cuda" and not torch.cuda.is_available():
        raise usage_error("calibrate --device cuda: torch sees no CUDA device here; use "
                          "--device cpu")
    start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - start:5.1f} s] {msg}", file=sys.stderr, flush=True)

    before = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # the peaks of this-machine at the same setting
    try:
        hardware = get_hardware(args.hardware)
    finally:
        torch.set_num_threads(before)
    say(f"profile {hardware.name}; calibrating")
    calibrated = calibrate(hardware, device=args.device, threads=args.threads, progress=say)
    write_output(json.dumps(calibrated.to_dict(), indent=1) + "\n", args.output)
    return EXIT_OK
