"""``flopscope plan SOURCE --gpus N --hardware NAME``: which layout to train with on N devices,
and what MFU to expect (:mod:`flopscope.plan`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flopscope.cli._options import (
    EXIT_OK,
    add_format,
    add_output,
    add_source_options,
    check_page_output,
    usage_error,
    write_output,
)
from flopscope.cli.types import memory_size, positive_int

__all__ = ["add_subcommands", "run_plan"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``plan`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    p = subparsers.add_parser(
        "plan", help="which layout to train a model with on N GPUs, and its MFU",
        description="Enumerate the tensor x pipeline x FSDP layouts, micro-batches and "
                    "activation checkpointing of a training step on N devices; per layout the "
                    "per-device peak memory, step time, tokens/s per device and MFU, from each "
                    "rank role simulated once (shape-only, fake process group). Layouts that do "
                    "not fit are dropped with the reason.")
    add_source_options(p, dtype_default="bfloat16",
                       source_help="a transformers decoder: hf:llama, hf:ORG/NAME (config only)")
    p.add_argument("--gpus", type=positive_int, required=True, metavar="N", help="devices")
    p.add_argument("--hardware", default="h100-sxm", metavar="NAME",
                   help="device profile with link figures (default h100-sxm)")
    p.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="N",
                   help="devices per node (default 8)")
    p.add_argument("--global-batch", type=positive_int, metavar="B",
                   help="sequences per step (default: one per device)")
    p.add_argument("--memory-budget", type=memory_size, metavar="SIZE",
                   help="memory per device, e.g. 80GiB (default: the profile's capacity)")
    p.add_argument("--checkpointing", default="none,block", metavar="none,block",
                   help="activation checkpointing choices to try (default none,block)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="layouts the table lists, fitting and dropped (default 10; JSON has all)")
    add_format(p, choices=("table", "json", "html"))
    add_output(p)
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """``flopscope plan``: check the options, plan, write the table or JSON.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code.

    Raises:
        UsageError: a bad option (exit 2).
    """
    from flopscope import sources
    from flopscope.cli import progress
    from flopscope.estimate import get_hardware
    from flopscope.plan import plan
    from flopscope.plan.display import plan_html, plan_text
    from flopscope.plan.planner import Plan
    from flopscope.plan.space import CHECKPOINTING
    from flopscope.plan.timing import Links
    from flopscope.render.html import render_plan_html

    check_page_output(args.format, args.output)
    if not args.source.startswith("hf:"):
        raise usage_error(f"plan takes a transformers decoder (hf:llama, hf:ORG/NAME), not "
                          f"{args.source!r}: this version plans decoders only")
    if args.input or args.batch is not None:
        raise usage_error(f"{'--input' if args.input else '--batch'} does not apply to plan: "
                          "it takes the model's token ids; give --global-batch (sequences per "
                          "step) and --seq-len, and plan chooses the micro-batch")
    choices = [c.strip() for c in args.checkpointing.split(",") if c.strip()]
    bad = [c for c in choices if c not in CHECKPOINTING]
    if bad or not choices:
        raise usage_error(f"--checkpointing {args.checkpointing!r}: use none, block or "
                          "none,block")
    hardware = get_hardware(args.hardware)
    Links.of(hardware, args.gpus_per_node, args.gpus)  # a profile without link figures fails here
    config = sources.parse_config(args.config, what="--config")
    with progress.shown():
        progress.say(f"planning {args.source} on {args.gpus} GPUs")
        result = plan(args.source, gpus=args.gpus, hardware=hardware,
                      gpus_per_node=args.gpus_per_node, global_batch=args.global_batch,
                      seq_len=args.seq_len, memory_budget=args.memory_budget, dtype=args.dtype,
                      config=config, checkpointing=choices)
    if args.format == "json":
        text = json.dumps(result.to_dict(), indent=2) + "\n"  # every layout
    elif args.format == "html":  # every layout; a training plan with its table's words
        text = (plan_html(result) if isinstance(result, Plan)
                else render_plan_html(result.to_dict()))
    else:
        text = plan_text(result, top=args.top)
    write_output(text, args.output)
    return EXIT_OK
