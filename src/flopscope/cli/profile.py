"""``flopscope profile SOURCE``: count a model, run it for real and show measured time beside
every count (:mod:`flopscope.timing`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flopscope.cli._options import (
    EXIT_OK,
    SOURCE_FORMS,
    add_depth,
    add_format,
    add_output,
    add_source_options,
    check_page_output,
    check_source_options,
    load_source,
    usage_error,
    write_output,
)
from flopscope.cli.types import named_file, non_negative_int, positive_int, profile

__all__ = ["add_subcommands", "run_profile"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``profile`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    p = subparsers.add_parser(
        "profile", help="count a model and measure it: time per operator and module",
        description="Count a model, run it for real under torch.profiler (warm-up runs, then "
                    "--repeat measured runs) and join every counted operator call to its "
                    "measured time: per module and operator the measured time, achieved FLOP/s, "
                    "and against --hardware the roofline bound, efficiency and time above the "
                    "roof; the time outside every operator is its own line.",
        epilog=f"SOURCE: {SOURCE_FORMS}. Example: flopscope profile torchvision:resnet18 "
               "--repeat 5 --trace run.json",
    )
    add_source_options(p)
    p.add_argument("--backward", action="store_true",
                   help="measure forward + backward (parameter gradients)")
    p.add_argument("--train", action="store_true",
                   help="measure a training step: train mode, forward, backward, the optimizer's "
                        "step (a warm-up step first)")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw", "none"], default=None,
                   help="with --train: the optimizer whose step is measured (default adamw)")
    p.add_argument("--warmup", type=non_negative_int, default=2, metavar="N",
                   help="unmeasured runs first (default 2)")
    p.add_argument("--repeat", type=positive_int, default=5, metavar="N",
                   help="measured runs; the figures are the median run's (default 5)")
    p.add_argument("--hardware", type=profile, default="this-machine",
                   metavar="NAME|FILE|this-machine|none",
                   help="the profile for each call's roofline bound and efficiency (default "
                        "this-machine: its peaks measured first, about 20 s; none: measured time "
                        "only)")
    p.add_argument("--tf32", action="store_true",
                   help="with --hardware: float32 matrix products run as TF32 (convolutions: as "
                        "cuDNN is set, TF32 by default)")
    p.add_argument("--trace", metavar="FILE", type=named_file,
                   help="write the median run as a Chrome/Perfetto trace (operators with their "
                        "counts, rates and bounds; module spans)")
    p.add_argument("--estimated-trace", metavar="FILE", type=named_file,
                   help="with --hardware: write each call's roofline time laid end to end, on the "
                        "same time axis")
    add_depth(p, help="levels of the module tree to show (default 2)")
    p.add_argument("--by", choices=["module", "op"], default="module",
                   help="break down by module tree or by operator")
    add_format(p, choices=("table", "markdown", "json", "html"))
    add_output(p)
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """``flopscope profile``: every check first, then load, count, measure, render.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code (0; failures raise).

    Raises:
        UsageError: a bad option or source.
    """
    from flopscope.estimate import get_hardware
    from flopscope.render import By, Format, RenderOptions, render
    from flopscope.timing import profile as measure_profile
    from flopscope.timing.trace import estimated_trace, measured_trace, write_trace

    check_page_output(args.format, args.output)
    if args.optimizer is not None and not args.train:
        raise usage_error("--optimizer is the optimizer of a measured training step: it needs "
                          "--train")
    if args.train and args.backward:
        raise usage_error("--train measures forward, backward and the optimizer's step: drop "
                          "--backward")
    no_hardware = args.hardware.strip().lower() == "none"
    if args.estimated_trace and no_hardware:
        raise usage_error("--estimated-trace lays out roofline times: it needs --hardware")
    if args.tf32 and no_hardware:
        raise usage_error("--tf32 says how float32 products run on --hardware: give a profile")
    check_source_options(args)  # a malformed --input or an unknown model: before the probes
    hardware = None
    if not no_hardware:
        if args.hardware.strip().lower() in ("this-machine", "this_machine", "local"):
            print("measuring this machine's peaks for the roofline (about 20 s; --hardware NAME "
                  "or none to skip)", file=sys.stderr)
        hardware = get_hardware(args.hardware)
    loaded = load_source(args)
    report, timing = measure_profile(
        loaded.model, loaded.inputs, backward=args.backward, train=args.train,
        optimizer=None if args.optimizer == "none" else args.optimizer or "adamw",
        warmup=args.warmup,
        repeat=args.repeat, hardware=hardware, tf32=args.tf32 or None, source=loaded.meta)
    options = RenderOptions(Format(args.format), depth=args.depth if args.depth is not None else 2,
                            by=By(args.by))
    write_output(render(report, options), args.output)
    if args.trace:
        write_trace(measured_trace(timing), args.trace)
        print(f"wrote {args.trace}", file=sys.stderr)
    if args.estimated_trace:
        write_trace(estimated_trace(timing), args.estimated_trace)
        print(f"wrote {args.estimated_trace}", file=sys.stderr)
    return EXIT_OK
