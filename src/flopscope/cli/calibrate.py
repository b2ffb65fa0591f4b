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
               "torchvision:resnet18 --hardware cpu.json. Links: flopscope calibrate --comm "
               "--ranks 4 --hardware cpu.json --output cpu.json",
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
    p.add_argument("--chains", action="store_true",
                   help="also time chains of layers over fresh outputs (at 2 or more threads) "
                        "and predict every call of their families at their measured / "
                        "predicted (off by default: docs/prediction.md, round 7)")
    comm = p.add_argument_group(
        "links (collectives)",
        "--comm times collectives on a real process group of --ranks local processes instead "
        "of the compute microbenchmarks, and fits the profile's link latency and bandwidth "
        "(alpha-beta) to them; the profile's other figures (a compute calibration block "
        "included, with --hardware FILE) are kept")
    comm.add_argument("--comm", action="store_true",
                      help="calibrate the links: all-reduce, all-gather, reduce-scatter, "
                           "broadcast and send/recv over 1 KiB-16 MiB (about 20-60 s here)")
    comm.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                      help="with --comm: processes in the probe (default 2; at least 2)")
    comm.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                      help="with --comm: the process group's backend (default gloo; nccl "
                           "takes one GPU per rank)")
    comm.add_argument("--link", choices=["intra", "inter"], default=None,
                      help="with --comm: which link the ranks share and the fit sets (default "
                           "intra: processes on one machine)")
    p.set_defaults(func=run_calibrate)


def _check_comm(args: argparse.Namespace) -> None:
    """The link options' checks, before anything runs."""
    import torch

    given = [f"--{n}" for n in ("ranks", "backend", "link") if getattr(args, n) is not None]
    if given and not args.comm:
        raise usage_error(f"{', '.join(given)} configure the collective probe: add --comm")
    if not args.comm:
        return
    if args.device is not None or args.threads is not None:
        raise usage_error("--comm times collectives (one thread per rank), not the compute "
                          "microbenchmarks: drop --device/--threads, or run calibrate twice")
    if args.ranks is not None and args.ranks < 2:
        raise usage_error(f"--ranks {args.ranks}: the collective probe needs at least 2 ranks")
    ranks = args.ranks or 2
    if args.backend == "nccl" and torch.cuda.device_count() < ranks:
        raise usage_error(f"--backend nccl with {ranks} ranks needs {ranks} GPUs; torch sees "
                          f"{torch.cuda.device_count()}: use --backend gloo")


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
    _check_comm(args)
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
    if args.comm:
        from flopscope.distributed.probe import calibrate_links

        ranks, backend = args.ranks or 2, args.backend or "gloo"
        say(f"profile {hardware.name}; timing collectives on {ranks} {backend} processes")
        calibrated = calibrate_links(hardware, ranks, backend=backend, link=args.link or "intra")
        fit = calibrated.link_calibration.fit if calibrated.link_calibration else None
        if fit is not None:
            say(f"{args.link or 'intra'}-node link: latency {fit.latency * 1e6:.0f} us, "
                f"bandwidth {fit.bandwidth / 1e9:.2f} GB/s (median error of the fit "
                f"{fit.error:.0%} over {fit.points} points)")
        write_output(json.dumps(calibrated.to_dict(), indent=1) + "\n", args.output)
        return EXIT_OK
    say(f"profile {hardware.name}; calibrating")
    calibrated = calibrate(hardware, device=args.device, threads=args.threads, progress=say,
                           chains=args.chains)
    write_output(json.dumps(calibrated.to_dict(), indent=1) + "\n", args.output)
    return EXIT_OK
