"""``flopscope count SOURCE``: count one forward (and backward) pass and print the report."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopscope.cli import progress
from flopscope.cli._options import (
    EXIT_OK,
    SOURCE_FORMS,
    CheckFailed,
    add_compiled,
    add_depth,
    add_format,
    add_output,
    add_source_options,
    add_step_time,
    check_page_output,
    check_source_options,
    check_step_time,
    load_source,
    resolve_hardware,
    step_time_peak,
    usage_error,
    write_output,
)
from flopscope.cli.count_notes import counting_what, simulating_what, warn_training_mode
from flopscope.cli.types import plot_file, positive_int, profile, unit_prefix

__all__ = ["add_subcommands", "run_count"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``count`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    count = subparsers.add_parser(
        "count", help="count a model and print the report",
        description="Count one forward (and with --backward, backward) pass of a model.",
        epilog=f"SOURCE: {SOURCE_FORMS}. Example: flopscope count hf:llama --shape-only "
               "--config num_hidden_layers=2 --seq-len 512",
    )
    add_source_options(count)
    count.add_argument("--backward", action="store_true", help="count forward + backward")
    count.add_argument("--shape-only", action="store_true",
                       help="no arithmetic: fake/meta tensors, same counts, little memory")
    add_depth(count, help="levels of the module tree to show (table default 2, plot default 1)")
    count.add_argument("--by", choices=["module", "op"], default="module",
                       help="break down by module tree or by operator")
    add_format(count)
    add_output(count)
    count.add_argument("--plot", metavar="FILE", type=plot_file,
                       help="also write a chart (.png, .svg or .pdf; its folder must exist)")
    count.add_argument("--strict", action="store_true",
                       help="fail (exit 1) when an operator has no rule")
    count.add_argument("--unit", type=unit_prefix, default=None, metavar="auto|k|M|G|T|P|E",
                       help="fixed SI prefix for MACs and FLOPs: k, M, G, T, P, E, Z, Y, R or Q "
                            "(default auto; bytes always take binary prefixes, KiB, MiB, ...)")
    count.add_argument("--symbolic", metavar="NAMES",
                       help="costs as formulas of these sizes, comma-separated: batch, seq_len "
                            "(hf: token ids), height, width or resolution (images); see "
                            "docs/symbolic.md")
    count.add_argument("--rules", metavar="FILE.py",
                       help="a Python file defining RULES, a dict of extra rules")
    est = count.add_argument_group("time and memory estimates")
    est.add_argument("--hardware", type=profile, metavar="NAME|FILE|this-machine",
                     help="add a roofline estimate (lower bound on time) on this hardware: a "
                          "shipped profile (h100-sxm, h100-pcie, h200, a100-40gb, a100-80gb, l4, "
                          "l40s, mi300x, epyc-9654, xeon-8480, graviton3), a JSON profile file, "
                          "or this-machine (measured now)")
    add_compiled(est)
    est.add_argument("--tf32", action="store_true",
                     help="with --hardware: float32 matrix products run as TF32 (convolutions: as "
                          "cuDNN is set, TF32 by default)")
    est.add_argument("--roofline-plot", metavar="FILE", type=plot_file,
                     help="with --hardware: write a roofline chart (.png, .svg or .pdf)")
    est.add_argument("--memory", action="store_true",
                     help="add peak memory: of an inference forward (counted under no_grad), or "
                          "with --backward of a training step with --optimizer")
    est.add_argument("--optimizer", choices=["sgd", "adam", "adamw", "none"], default=None,
                     help="with --memory --backward: the optimizer whose step is included "
                          "(default adamw)")
    add_step_time(est, step_help="measured wall time of what is counted (a forward, or with "
                                 "--backward forward + backward)")
    par = count.add_argument_group(
        "sharded models (one rank, simulated on torch's fake process group; hf: decoders)")
    par.add_argument("--world-size", type=int, metavar="N",
                     help="simulate a job of N ranks and count one rank: the standard tensor-"
                          "parallel plan (--tp) and FSDP2 (--fsdp) over a 2-D device mesh")
    par.add_argument("--tp", type=int, default=1, metavar="N",
                     help="tensor-parallel degree (colwise q/k/v/gate/up, rowwise o/down)")
    par.add_argument("--fsdp", type=int, metavar="N",
                     help="FSDP2 degree (default: world size / tp)")
    par.add_argument("--rank", type=int, default=0, metavar="R", help="the rank to count")
    par.add_argument("--sequence-parallel", action="store_true",
                     help="with --tp: the norms on sequence shards (SequenceParallel)")
    par.add_argument("--loss-parallel", action="store_true",
                     help="with --tp (no --pp or --ep): the head column-wise over the "
                          "vocabulary, its logits left as vocabulary shards; with --backward "
                          "from the causal LM's cross-entropy on the shards (torch's "
                          "loss_parallel), as flopscope plan runs tensor parallelism")
    par.add_argument("--pp", type=int, default=1, metavar="N",
                     help="pipeline stages (torch.distributed.pipelining): every stage is "
                          "counted; the table shows --rank's stage")
    par.add_argument("--microbatches", type=int, metavar="M",
                     help="with --pp: microbatches per step (default: --pp; divides the batch)")
    par.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b",
                     help="with --pp: the pipeline schedule (default 1f1b)")
    par.add_argument("--gpus-per-node", type=positive_int, metavar="N",
                     help="with --hardware: ranks per node, for the collectives' links "
                          "(default 8)")
    par.add_argument("--ep", type=int, default=1, metavar="N",
                     help="expert-parallel degree: --world-size (the rest replicated unless "
                          "--fsdp; with --tp, shape-only, attention tensor-parallel) or a "
                          "divisor of it with --fsdp = --world-size (experts FSDP-sharded over "
                          "their copies); tokens dispatched with all-to-all as the router "
                          "assigns them, with --shape-only routing is assumed balanced")
    count.set_defaults(func=run_count)


def check_plot(path: str) -> None:
    """Fail early when a chart cannot be drawn: matplotlib missing. Call before counting (the
    path itself was checked as the command line was parsed: :func:`flopscope.cli.types.plot_file`).

    Args:
        path: the user's ``--plot`` or ``--roofline-plot`` file name.

    Raises:
        ImportError: matplotlib is not installed (the message says what to install).
    """
    from flopscope.render.plot import require_matplotlib

    require_matplotlib()


def load_rules_file(path: str) -> Mapping[Any, Any]:
    """Read a user rules file: a Python file that defines ``RULES``, a mapping for ``rules=``.

    Args:
        path: the file given to ``--rules``.

    Returns:
        Its ``RULES``.

    Raises:
        UsageError: the file is missing, does not import, or defines no mapping ``RULES``.
    """
    from flopscope.rules import RuleSet

    file = Path(path)
    if not file.is_file():
        raise usage_error(f"--rules file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"flopscope_user_rules_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise usage_error(f"--rules {path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise usage_error(f"importing --rules {path!r} raised {type(e).__name__}: {e}") from e
    rules = getattr(module, "RULES", None)
    if not isinstance(rules, (Mapping, RuleSet)):
        raise usage_error(
            f"--rules {path!r} must define RULES, a dict of operator name, module class or "
            "module path -> rule (found "
            f"{'nothing' if rules is None else type(rules).__name__})"
        )
    return rules


def _simulated(args: argparse.Namespace, rules: Any, log: Any = None) -> tuple[Any, Any]:
    """Count one rank of ``args.source`` sharded as ``--world-size/--tp/--fsdp/--pp/--ep`` say;
    ``log`` (a :class:`~flopscope.estimate.CallLog`, with ``--hardware``) sees the rank's calls.

    Returns:
        The rank's report, and with ``--pp`` the :class:`PipelineReport` of its pipeline group
        (``None`` without).

    Raises:
        UsageError: a bad layout or a source that is not a Llama-style decoder.
    """
    from flopscope.distributed import simulate, simulate_pipeline

    layout = _layout(args)
    loss = _loss(args)

    builds = [0]

    def build() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        progress.say(simulating_what(layout, builds[0]))
        builds[0] += 1
        loaded = load_source(args, shape_only=args.shape_only)
        return loaded.model, tuple(loaded.inputs.args), dict(loaded.inputs.kwargs)

    options = dict(rules=rules, strict=args.strict, warn=False)
    observed = dict(options, observers=[log]) if log is not None else options
    if layout.pp > 1:
        pipeline = simulate_pipeline(build, layout, microbatches=args.microbatches,
                                     schedule=args.schedule, backward=args.backward,
                                     shape_only=args.shape_only, **options)  # the sum of the logits
        if log is not None:  # the rank's own stage again, its calls logged (the one run that is)
            simulate(build, layout, backward=args.backward, shape_only=args.shape_only,
                     logical=False, microbatches=args.microbatches, schedule=args.schedule,
                     loss=loss or "sum", **observed)
        return pipeline.stages[layout.stage], pipeline
    return simulate(build, layout, backward=args.backward, shape_only=args.shape_only,
                    loss=loss or "sum", **observed), None


def _layout(args: argparse.Namespace) -> Any:
    """The :class:`~flopscope.distributed.Layout` that ``--world-size/--tp/--fsdp/--rank/--pp/
    --ep/--sequence-parallel/--loss-parallel`` say.

    Raises:
        UsageError: a bad layout.
    """
    from flopscope.distributed import Layout

    return Layout(args.world_size, tp=args.tp, fsdp=args.fsdp, rank=args.rank, pp=args.pp,
                  ep=args.ep, sequence_parallel=args.sequence_parallel,
                  loss_parallel=args.loss_parallel)


def _loss(args: argparse.Namespace) -> str | None:
    """What a simulated rank's backward runs from: the causal LM's cross-entropy with
    ``--loss-parallel`` (the loss computed on the logits' vocabulary shards), else the sum of
    the outputs; ``None`` without ``--backward``."""
    if not args.backward:
        return None
    return "cross_entropy" if args.loss_parallel else "sum"


def _rank_step(args: argparse.Namespace, report: Any, estimate: Any, pipeline: Any) -> Any:
    """The simulated rank's predicted step time section (compute + exposed communication)."""
    from flopscope.distributed.display import rank_step_section

    layout = _layout(args)
    bubble = float(pipeline.stage_bubbles[layout.stage]) if pipeline is not None else 0.0
    return rank_step_section(report, estimate, layout, args.hardware, args.gpus_per_node,
                             bubble)


def _check_options(args: argparse.Namespace) -> Any:
    """Every check on ``count``'s options that needs no model, before anything is loaded; the
    hardware profile resolved once (``this-machine`` measures this machine: once), and put back
    in ``args.hardware`` for every later use.

    Returns:
        The :class:`~flopscope.estimate.Hardware`, or ``None`` without ``--hardware``.

    Raises:
        UsageError: a bad combination of options, a bad path, an unknown profile, a bad layout.
    """
    check_page_output(args.format, args.output)
    if args.plot:
        check_plot(args.plot)
    if args.roofline_plot:
        if not args.hardware:
            raise usage_error("--roofline-plot needs --hardware (the roofline's roofs)")
        check_plot(args.roofline_plot)
    if args.tf32 and not args.hardware:
        raise usage_error("--tf32 says how float32 matrix products run on the --hardware "
                          "profile: give --hardware NAME too")
    if args.optimizer is not None and not (args.memory and args.backward):
        raise usage_error("--optimizer sizes a training step's optimizer state: it needs "
                          "--memory --backward")
    timed = args.step_time is not None or args.peak_tflops is not None
    if args.gpus_per_node is not None and not (args.world_size and args.hardware):
        raise usage_error("--gpus-per-node places a simulated job's ranks on nodes for its "
                          "communication time: it needs --world-size and --hardware")
    if args.world_size is None:
        if args.tp != 1 or args.fsdp:
            raise usage_error("--tp and --fsdp need --world-size")
        if (args.pp != 1 or args.ep != 1 or args.sequence_parallel or args.loss_parallel
                or args.microbatches):
            raise usage_error("--pp, --ep, --sequence-parallel, --loss-parallel and "
                              "--microbatches need --world-size")
    else:
        if args.memory:
            raise usage_error("--world-size does not combine with --memory yet")
        if timed:
            raise usage_error("--step-time does not combine with --world-size yet")
        _layout(args)  # a bad layout fails here
    check_source_options(args)  # a malformed --input or an unknown model: before any probe
    hardware = args.hardware = resolve_hardware(args)
    if timed:
        check_step_time(args, timed=args.step_time is not None)
    return hardware


def run_count(args: argparse.Namespace) -> int:
    """``flopscope count SOURCE``: every check on the options first, then load, count, render.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code (0; failures raise).

    Raises:
        UsageError: a bad option or source, the model rejected its input, or its forward
            raised (:func:`flopscope.cli.failures.forward_failure` tells them apart).
        CheckFailed: ``--strict`` and an operator had no rule.
    """
    import flopscope
    from flopscope.render import By, Format, RenderOptions, render
    from flopscope.render.common import report_warnings
    from flopscope.render.text import rich_report, table_width
    from flopscope.report.sections import DataSection

    if getattr(args, "symbolic", None):
        from flopscope.cli.symbolic import run_symbolic

        if args.plot:
            check_plot(args.plot)
        return run_symbolic(args)
    hardware = _check_options(args)
    rules = load_rules_file(args.rules) if args.rules else None
    progress.say(f"loading {args.source}")
    loaded = load_source(args, shape_only=args.shape_only)
    log = memory = None
    pipeline = None
    util_observers: list[Any] = []
    if args.step_time is not None or args.peak_tflops is not None:
        from flopscope.llm.attention import AttentionFigures
        from flopscope.llm.flops import assumed_mask

        peak = step_time_peak(args, loaded.model, timed=args.step_time is not None)
        util_observers = [AttentionFigures(assume_mask=assumed_mask(loaded.model))]
    progress.say(counting_what(args))
    try:
        from flopscope.estimate import CallLog, peak_memory

        log = CallLog() if hardware is not None else None
        if args.world_size is not None:
            report, pipeline = _simulated(args, rules, log)
        else:
            observers = [log, *util_observers] if log is not None else util_observers
            if args.memory:
                step: dict[str, Any] = {}  # a training step's optimizer (none for inference)
                if args.backward:
                    step["optimizer"] = (None if args.optimizer == "none"
                                         else args.optimizer or "adamw")
                report, memory = peak_memory(
                    loaded.model, loaded.inputs, train=args.backward, shape_only=args.shape_only,
                    strict=args.strict, rules=rules, observers=observers, source=loaded.meta,
                    **step,
                )
            else:
                report = flopscope.count(
                    loaded.model, loaded.inputs, shape_only=args.shape_only,
                    backward=args.backward, strict=args.strict, rules=rules, warn=False,
                    observers=observers, source=loaded.meta,
                )
    except flopscope.ForwardError as e:  # the model's own bug, or an input it rejected
        from flopscope.cli.failures import forward_failure

        shapes = ", ".join(loaded.meta.inputs) or "the default input"
        raise forward_failure(e, args.source, shapes) from e
    except flopscope.StrictModeError as e:
        raise CheckFailed(f"--strict: {e}") from e
    if args.world_size is not None:  # a simulated rank's report: where the model came from
        report = dataclasses.replace(report, meta=report.meta.merged(loaded.meta))
    if not (args.backward or args.memory or args.world_size):  # a forward, in the model's mode
        warn_training_mode(loaded.model)
    estimate = log.estimate(hardware, tf32=args.tf32 or None) if log and hardware else None
    sections: list[Any] = []
    if report.communication or report.rank is not None:
        from flopscope.distributed.display import CommunicationSection, PipelineSection

        sections.append(CommunicationSection(report))
        if args.world_size is not None and args.tp > 1:
            from flopscope.distributed.display import loss_parallel_section

            sections.append(loss_parallel_section(_layout(args), _loss(args)))
        if pipeline is not None:
            sections.append(PipelineSection(pipeline))
    if args.world_size is not None and args.ep > 1 and args.shape_only:
        from flopscope.distributed.experts import BalancedRouting

        routing = BalancedRouting(args.ep)  # the assumption a shape-only count makes
        sections.append(DataSection("expert_routing", routing.to_dict(), (routing.line(),)))
    if estimate is not None:
        from flopscope.estimate.display import EstimateSection

        sections.append(EstimateSection(estimate))
        if args.world_size is not None:
            sections.append(_rank_step(args, report, estimate, pipeline))
    if util_observers:
        from flopscope.llm.flops import report_utilization

        utilization = report_utilization(report, util_observers[0], loaded.inputs,
                                         seconds=args.step_time, peak=peak)
        data, lines = utilization.to_dict(), [f"utilization: {utilization.line()}"]
        if estimate is not None and estimate.calibrated:  # "what MFU should I expect"
            from flopscope.estimate.bound import predicted_step_s
            from flopscope.estimate.display import human_seconds

            expected = report_utilization(report, util_observers[0], loaded.inputs,
                                          seconds=predicted_step_s(estimate), peak=peak)
            data["expected"] = {**expected.to_dict(), "from": "the calibrated prediction"}
            lines.append(f"expected from the prediction ({human_seconds(expected.seconds)}, "
                         f"not measured): {expected.line()}")
        sections.append(DataSection("utilization", data, tuple(lines)))
    report = report.with_sections(*sections)
    options = RenderOptions(Format(args.format), depth=args.depth if args.depth is not None else 2,
                            by=By(args.by), unit=args.unit)
    progress.stop()  # before anything is written to stdout
    if options.format is Format.TABLE and args.output is None and sys.stdout.isatty():
        from rich.console import Console

        console = Console(width=max(Console().width, table_width(report)))
        console.print(rich_report(report, depth=options.depth, by=options.by, unit=args.unit))
    else:
        write_output(render(report, options), args.output)
    if options.format not in (Format.TABLE, Format.MARKDOWN):
        for w in report_warnings(report):
            print(f"warning: {w.title}: {', '.join(w.items)} ({w.advice})", file=sys.stderr)
    if args.plot:
        from flopscope.render.plot import plot_report

        progress.say(f"writing {args.plot}")
        plot_report(report, args.plot, by=options.by.value,
                    depth=args.depth if args.depth is not None else 1)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.roofline_plot and estimate is not None:
        from flopscope.estimate.display import plot_roofline

        progress.say(f"writing {args.roofline_plot}")
        plot_roofline(estimate, args.roofline_plot)
        print(f"wrote {args.roofline_plot}", file=sys.stderr)
    return EXIT_OK
