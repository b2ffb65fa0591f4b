"""``flopscope plan SOURCE --gpus N --hardware NAME``: which layout to train with on N devices,
and what MFU to expect; with ``--serve``, which layout to serve with, its tokens/s and latency
(:mod:`flopscope.plan`)."""

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
from flopscope.cli.types import dtype_name, memory_size, positive_int, positive_int_list

__all__ = ["add_subcommands", "run_plan"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``plan`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    p = subparsers.add_parser(
        "plan", help="which layout to train (or serve) a model with on N GPUs",
        conflict_handler="resolve",  # --batch: a list of sizes here
        description="Enumerate the tensor x pipeline x FSDP layouts, micro-batches and "
                    "activation checkpointing of a training step on N devices; per layout the "
                    "per-device peak memory, step time, tokens/s per device and MFU, from each "
                    "rank role simulated once (shape-only, fake process group). Layouts that do "
                    "not fit are dropped with the reason. With --serve: tensor x pipeline "
                    "layouts and replicas of a decode loop, prefill and decode step times, "
                    "weights and KV cache per device, the largest batch that fits, tokens/s "
                    "and latency per token.")
    add_source_options(p, dtype_default="bfloat16",
                       source_help="a transformers decoder (hf:llama, hf:ORG/NAME, "
                                   "hf:path/to/config.json) or a torchvision/timm model (data "
                                   "parallel only); "
                                   "several, comma-separated, for a sweep")
    p.add_argument("--param-dtype", type=dtype_name, metavar="DTYPE",
                   help="training: the parameters', gradients' and AdamW moments' dtype, e.g. "
                        "float32 with --dtype bfloat16: mixed precision, FSDP2's "
                        "MixedPrecisionPolicy (default: --dtype)")
    p.add_argument("--reduce-dtype", type=dtype_name, metavar="DTYPE",
                   help="training: the dtype gradients are reduced in (default: --param-dtype)")
    # the choices are flopscope.plan.space.SEQUENCE_PARALLEL (not imported here: the package
    # loads torch; tests/plan/test_sequence_parallel.py holds them equal)
    p.add_argument("--sequence-parallel", nargs="?", const="on", choices=("off", "on", "search"),
                   metavar="on|off|search",
                   help="training: tensor-parallel layouts without pipeline stages run sequence "
                        "parallelism (norms on sequence shards), as torchtitan and Megatron-LM do; "
                        "'search': plan each such layout with it (SP in the label) and without, "
                        "and rank both (default off)")
    p.add_argument("--loss-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="training: tensor-parallel layouts shard the head over the vocabulary "
                        "(with pipeline stages, the last stage's) and compute the cross-entropy "
                        "on the shards "
                        "(torch's loss_parallel), as torchtitan and Megatron-LM do (the default; "
                        "--no-loss-parallel: the head whole on every tensor-parallel rank)")
    # the choices are flopscope.plan.space.DATA_PARALLEL and "search" (held equal by
    # tests/plan/test_ddp.py)
    p.add_argument("--data-parallel", choices=("fsdp", "ddp", "zero1", "zero2", "search"),
                   metavar="fsdp|ddp|zero1|zero2|search",
                   help="training: how the data-parallel ranks hold the model: fsdp (FSDP2: "
                        "parameters, gradients and AdamW's state sharded), ddp "
                        "(DistributedDataParallel: whole replicas, gradients all-reduced once a "
                        "step; DDP in the label), zero1 (DDP with AdamW's state sharded: "
                        "Megatron-LM's distributed optimizer; DDP4 Z1), zero2 (FSDP2 keeping "
                        "each layer's gathered parameters from forward to backward: no "
                        "all-gather in backward; DP4 Z2) or search (every one, ranked "
                        "together); default: fsdp for a decoder, fsdp and ddp for a vision "
                        "model")
    p.add_argument("--batch", type=positive_int_list, metavar="N[,N...]",
                   help="--serve: batch sizes per replica to evaluate besides the largest "
                        "that fits (default 1); a training plan takes --global-batch")
    p.add_argument("--seq-len", type=positive_int_list, metavar="N[,N...]",
                   help="tokens per sequence (the prompt with --serve; default: the "
                        "source's, 128); several for a sweep")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="mode", action="store_const", const="train",
                      help="plan a training step (the default)")
    mode.add_argument("--serve", dest="mode", action="store_const", const="serve",
                      help="plan serving: prefill and decode with a KV cache")
    p.set_defaults(mode="train")
    p.add_argument("--max-new-tokens", type=positive_int, metavar="T",
                   help="--serve: tokens generated per sequence (default 128)")
    p.add_argument("--batching", choices=("static", "continuous"),
                   help="--serve: how the server batches its sequences: static (a batch from "
                        "its prompts to its last tokens, as transformers' generate runs it; "
                        "continuous batching's tokens/s beside; the default) or continuous "
                        "(continuous batching with chunked prefill, as vLLM and SGLang run "
                        "it: each row's memory, largest batch, times and rank are its steady "
                        "state's)")
    p.add_argument("--gpus", type=positive_int_list, required=True, metavar="N[,N...]",
                   help="devices; several for a sweep")
    p.add_argument("--hardware", default="h100-sxm", metavar="NAME",
                   help="device profile with link figures (default h100-sxm)")
    p.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="N",
                   help="devices per node (default 8)")
    p.add_argument("--global-batch", type=positive_int, metavar="B",
                   help="sequences per step (default: one per device)")
    p.add_argument("--memory-budget", type=memory_size, metavar="SIZE",
                   help="memory per device, e.g. 80GiB (default: the profile's capacity)")
    p.add_argument("--checkpointing", default="none,block", metavar="LIST",
                   help="activation checkpointing choices to try, comma-separated: none, block "
                        "(every decoder block recomputed), selective (inside each block all but "
                        "matrix products, attention and tensor-parallel reductions recomputed), "
                        "selective-half (the same, every other matrix product kept); default "
                        "none,block")
    p.add_argument("--tp", type=positive_int, metavar="N",
                   help="only layouts of this tensor-parallel degree (default: every one)")
    p.add_argument("--pp", type=positive_int, metavar="N",
                   help="only layouts of this many pipeline stages (default: every one)")
    p.add_argument("--ep", type=positive_int, metavar="N",
                   help="only layouts of this expert-parallel degree (a mixture of experts; "
                        "1: none; default: every one that divides the experts)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="layouts the table lists, fitting and dropped (default 10; JSON has all)")
    p.add_argument("--screen", action="store_true",
                   help="training: estimate every layout from a few small reference runs, then "
                        "simulate only those that could win (rows marked ~ are estimates; the "
                        "screen's error on the simulated ones is in the notes): a large model "
                        "on many devices in minutes instead of hours")
    p.add_argument("--confirm", type=positive_int, metavar="N",
                   help="--screen: simulated layouts that fit to reach before stopping "
                        "(default 3)")
    p.add_argument("--compiled", action="store_true",
                   help="predict compiled steps (CUDA graphs, torch.compile; a serving "
                        "engine's graphs): no host time per call, DTensor's dispatch included; "
                        "the kernels as eager's (no fusion modelled)")
    p.add_argument("--jobs", "-j", type=positive_int, metavar="N",
                   help="simulate the rank roles in N local worker processes (default: in this "
                        "process); with --ray alone, the local Ray cluster's CPUs")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="simulate each rank role as a Ray task: on the cluster at ADDRESS "
                        "(auto, HOST:6379, ray://HOST:10001) or, without one, on a local "
                        "cluster started for the run (pip install 'flopscope[ray]')")
    add_format(p, choices=("table", "json", "html"))
    add_output(p)
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """``flopscope plan``: check the options, plan (or sweep), write the table or JSON.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code.

    Raises:
        UsageError: a bad option (exit 2).
    """
    from flopscope import sources as source_forms
    from flopscope.estimate import get_hardware
    from flopscope.plan.timing import Links

    check_page_output(args.format, args.output)
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    options = _check(args, sources)
    hardware = get_hardware(args.hardware)
    for gpus in args.gpus:  # a profile without the link figures it needs fails here
        Links.of(hardware, args.gpus_per_node, gpus)
    options["config"] = source_forms.parse_config(args.config, what="--config")
    seq_lens: list[int | None] = list(args.seq_len or [None])
    points = len(sources) * len(args.gpus) * len(seq_lens)
    if points == 1 and args.jobs is None and args.ray is None:
        return _one(args, sources[0], args.gpus[0], seq_lens[0], hardware, options)
    return _sweep(args, sources, seq_lens, hardware, options, points)


def _check(args: argparse.Namespace, sources: list[str]) -> dict[str, Any]:
    """Refuse options that do not go together (exit 2), and sources that name no model; the
    plan's options."""
    from flopscope import sources as source_forms
    from flopscope.plan.checkpointing import CHECKPOINTING, KNOWN

    serve = args.mode == "serve"
    if not sources:
        raise usage_error("plan needs a SOURCE")
    for source in sources:
        if not source.startswith(("hf:", "torchvision:", "timm:")):
            raise usage_error(f"plan takes a transformers decoder (hf:llama, hf:ORG/NAME, "
                              f"hf:path/to/config.json) or a vision model, torchvision:NAME or "
                              f"timm:NAME (data parallel only), not {source!r}")
        source_forms.check_source(source)  # an unknown model: before the hardware
        if not source.startswith("hf:") and serve:
            raise usage_error(f"--serve plans a transformers decoder's generation, not "
                              f"{source!r}: plan a vision model for training (data parallel)")
    if args.input or (args.batch is not None and not serve):
        raise usage_error(f"{'--input' if args.input else '--batch'} does not apply to a "
                          "training plan: it takes the model's token ids; give --global-batch "
                          "(sequences per step) and --seq-len, and plan chooses the micro-batch "
                          "(--batch is for --serve)")
    if serve and (args.global_batch is not None or args.checkpointing != "none,block"):
        given = "--global-batch" if args.global_batch is not None else "--checkpointing"
        raise usage_error(f"{given} does not apply to --serve: a serving plan takes --batch "
                          "(sizes per replica) and --max-new-tokens")
    sequence_parallel = args.sequence_parallel not in (None, "off")
    if serve and (args.param_dtype or args.reduce_dtype or sequence_parallel
                  or args.loss_parallel is not None or args.data_parallel is not None):
        given = ("--param-dtype" if args.param_dtype else "--reduce-dtype" if args.reduce_dtype
                 else "--sequence-parallel" if sequence_parallel
                 else "--data-parallel" if args.data_parallel is not None
                 else "--loss-parallel")
        raise usage_error(f"{given} applies to a training plan: serving keeps the weights in "
                          "--dtype and runs plain tensor parallelism")
    if not serve and (args.max_new_tokens is not None or args.batching is not None):
        given = "--max-new-tokens" if args.max_new_tokens is not None else "--batching"
        raise usage_error(f"{given} applies to --serve only")
    if args.confirm is not None and not args.screen:
        raise usage_error("--confirm applies to --screen (how many simulated layouts to reach)")
    if args.screen and serve:
        raise usage_error("--screen applies to a training plan: a serving plan simulates its "
                          "roles")
    if args.screen and (args.jobs is not None or args.ray is not None):
        raise usage_error("--screen runs in this process (a few small reference runs); drop "
                          f"{'--jobs' if args.jobs is not None else '--ray'}, which simulates "
                          "every role")
    choices = [c.strip() for c in args.checkpointing.split(",") if c.strip()]
    bad = [c for c in choices if c not in KNOWN]
    if bad or not choices:
        raise usage_error(f"--checkpointing {args.checkpointing!r}: give a comma-separated "
                          f"list of {', '.join(KNOWN)} (e.g. none,block,selective)")
    options: dict[str, Any] = dict(gpus_per_node=args.gpus_per_node,
                                   memory_budget=args.memory_budget, dtype=args.dtype,
                                   tp=args.tp, pp=args.pp, ep=args.ep,
                                   **({"compiled": True} if args.compiled else {}))
    if serve:
        options.update(mode="serve", max_new_tokens=args.max_new_tokens, batches=args.batch,
                       batching=args.batching)
    else:
        options.update(global_batch=args.global_batch, param_dtype=args.param_dtype,
                       reduce_dtype=args.reduce_dtype,
                       sequence_parallel=args.sequence_parallel or "off",
                       **({} if args.loss_parallel is None
                          else {"loss_parallel": args.loss_parallel}),
                       **({} if args.data_parallel is None
                          else {"data_parallel": args.data_parallel}),
                       checkpointing=(CHECKPOINTING if args.checkpointing == "none,block"
                                      else tuple(choices)),
                       **({"screen": True, "confirm": args.confirm or 3} if args.screen
                          else {}))
    return options


def _one(args: argparse.Namespace, source: str, gpus: int, seq_len: int | None,
         hardware: Any, options: dict[str, Any]) -> int:
    """One plan, in this process: its table or JSON."""
    from flopscope.cli import progress
    from flopscope.plan import plan

    with progress.shown():
        progress.say(f"planning {'serving ' if args.mode == 'serve' else ''}{source} on "
                     f"{gpus} GPUs")
        result = plan(source, gpus=gpus, hardware=hardware, seq_len=seq_len, **options)
    write_output(_plan_text(args, result), args.output)
    return EXIT_OK


def _plan_text(args: argparse.Namespace, result: Any) -> str:
    from flopscope.plan.display import plan_html, plan_text, serve_text
    from flopscope.plan.serve import ServePlan

    if args.format == "json":
        return json.dumps(result.to_dict(), indent=2) + "\n"  # every layout
    if args.format == "html":  # every layout, with the table's words (why the best wins)
        return plan_html(result)
    if isinstance(result, ServePlan):
        return serve_text(result, top=args.top)
    return plan_text(result, top=args.top)


def _sweep(args: argparse.Namespace, sources: list[str], seq_lens: list[int | None],
           hardware: Any, options: dict[str, Any], points: int) -> int:
    """Several plans (or one with workers): roles in worker processes or on Ray; the rows
    stream into the table as plans complete."""
    import sys

    from flopscope.cli import progress
    from flopscope.plan.display import sweep_header, sweep_line
    from flopscope.plan.sweeps import sweep
    from flopscope.zoo import default_jobs

    jobs = args.jobs or (default_jobs() if args.ray is not None else 1)
    streaming = args.format == "table" and args.output in (None, "-") and points > 1
    lines: list[str] = []
    rows = []

    def emit(line: str) -> None:
        if streaming:
            progress.stop()
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        else:
            lines.append(line)

    def on_task(task: Any, done: int, total: int) -> None:
        progress.say(f"{done}/{total} rank roles simulated: {task.label}")

    with progress.shown():
        progress.say(f"planning {points} point(s): listing their rank roles")
        if points > 1 and args.format == "table":
            for line in sweep_header(args.mode, hardware):
                emit(line)
        for row in sweep(sources, gpus=args.gpus, seq_lens=seq_lens, hardware=hardware,
                         jobs=jobs, ray=args.ray, on_task=on_task, **options):
            rows.append(row)
            if points > 1 and args.format == "table":
                emit(sweep_line(row))
    if args.format == "json":
        data: Any = [r.to_dict() for r in rows] if points > 1 else (
            rows[0].plan.to_dict() if rows[0].plan is not None else None)
        if data is None:
            raise usage_error(rows[0].error or "the plan failed")
        write_output(json.dumps(data, indent=2) + "\n", args.output)
    elif args.format == "html" and points > 1:  # the sweep's points, a click draws one plan
        from flopscope.plan.display import page_data
        from flopscope.render.html import render_plan_html

        drawn = [{**r.to_dict(), "plan": None if r.plan is None else page_data(r.plan)}
                 for r in rows]
        write_output(render_plan_html(drawn), args.output)
    elif points == 1:
        if rows[0].plan is None:
            raise usage_error(rows[0].error or "the plan failed")
        write_output(_plan_text(args, rows[0].plan), args.output)
    elif not streaming:
        write_output("\n".join(lines) + "\n", args.output)
    return EXIT_OK
