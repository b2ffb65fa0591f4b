"""``flopscope generate SOURCE``: a prefill and decode steps, counted step by step."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flopscope.cli._options import (
    EXIT_OK,
    SOURCE_FORMS,
    add_compiled,
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
from flopscope.cli.types import positive_int, positive_number, profile
from flopscope.errors import UsageError

__all__ = ["add_subcommands", "estimate_lines", "estimate_summary", "run_generate"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``generate`` on an argparse subparsers object.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.
    """
    p = subparsers.add_parser(
        "generate", help="count a generation loop step by step (prefill, decode)",
        description="Count a causal language model generating --new-tokens after a "
                    "--prompt-len prompt: one row per forward (the prefill, then N - 1 decode "
                    "steps), with KV-cache bytes read and written.",
        epilog=f"SOURCE: {SOURCE_FORMS} (a causal LM; hf: sources build one). Example: "
               "flopscope generate hf:llama --shape-only --prompt-len 4096 --new-tokens 8",
    )
    add_source_options(p)
    p.add_argument("--prompt-len", type=positive_int, required=True, metavar="P",
                   help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=positive_int, required=True, metavar="N",
                   help="tokens to generate: 1 prefill + N - 1 decode steps")
    p.add_argument("--shape-only", action="store_true",
                   help="no arithmetic: the model on meta, a growing cache of meta tensors")
    util = p.add_argument_group("time on named hardware; utilization of a measured generation")
    util.add_argument("--hardware", type=profile, metavar="NAME|FILE|this-machine",
                      help="a shipped profile (h100-sxm, a100-80gb, ...), a JSON profile file or "
                           "this-machine: each step's roofline time (a lower bound), the prefill's "
                           "and a decode step's; with --step-time / --prefill-time also MFU and "
                           "MBU against its matrix peak and memory bandwidth")
    add_compiled(util)
    add_step_time(util, step_help="measured mean time of one decode step (time per output "
                                  "token); MBU = (weights + KV cache read and written) / "
                                  "SECONDS / bandwidth")
    util.add_argument("--prefill-time", type=positive_number, metavar="SECONDS",
                      help="measured time of the prefill (time to first token): its MFU")
    add_format(p, choices=("table", "json", "html"))
    add_output(p)
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """``flopscope generate``: load the model, count the loop, print one row per step.

    Args:
        args: the parsed arguments.

    Returns:
        The exit code (0; failures raise).

    Raises:
        UsageError: a bad option or source, or a model that cannot generate.
    """
    from flopscope.llm import count_generation
    from flopscope.llm.generate import StepLogs

    check_page_output(args.format, args.output)
    if args.input:
        raise usage_error("generate makes its own token ids: give --prompt-len and --batch, "
                          "not --input")
    if args.seq_len is not None:
        raise usage_error("generate takes --prompt-len, not --seq-len")
    if args.source.startswith("hf:"):
        args.seq_len = args.prompt_len  # the prompt of the default inputs (replaced in the loop)
    timed = args.step_time is not None or args.prefill_time is not None
    if args.step_time is not None and args.new_tokens < 2:
        raise usage_error("--step-time times a decode step, and --new-tokens 1 makes none: "
                          "give --new-tokens 2 or more, or time the prefill (--prefill-time)")
    check_source_options(args)  # an unknown model: before the hardware's probes
    args.hardware = resolve_hardware(args)  # once, before loading and counting
    if timed or args.peak_tflops is not None:
        check_step_time(args, timed=timed)  # before loading: fail fast
    loaded = load_source(args, shape_only=args.shape_only, require_inputs=False)
    peak = None
    if timed or args.peak_tflops is not None:
        peak = step_time_peak(args, loaded.model, timed=timed)
    logs = StepLogs() if args.hardware is not None else None
    try:
        result = count_generation(loaded.model, prompt_len=args.prompt_len,
                                  new_tokens=args.new_tokens, batch=args.batch or 1,
                                  shape_only=args.shape_only,
                                  observers=[logs] if logs is not None else ())
    except UsageError:  # flopscope's own: says what is wrong already
        raise
    except (TypeError, AttributeError, ValueError) as e:
        raise usage_error(f"{args.source} cannot generate step by step: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]} (a causal LM taking input_ids, "
                          "a key/value cache and logits_to_keep is needed)") from e
    utilization = []
    estimates = logs.estimates(args.hardware) if logs is not None else []
    expected = []
    if peak is not None:
        from flopscope.llm.generate import weight_bytes

        weights = weight_bytes(loaded.model)
        utilization = result.utilization(peak, prefill_seconds=args.prefill_time,
                                         decode_seconds=args.step_time, weights=weights)
        if utilization and estimates and estimates[0].calibrated:  # "what MFU to expect"
            prefill_s, decode_s = predicted_times(result, estimates)
            expected = result.utilization(
                peak, prefill_seconds=prefill_s if args.prefill_time is not None else None,
                decode_seconds=decode_s if args.step_time is not None else None,
                weights=weights)
    if args.format in ("json", "html"):
        data = result.to_dict()
        if utilization:
            data["utilization"] = [u.to_dict() for u in utilization]
        if expected:
            data["expected_utilization"] = [{**u.to_dict(), "from": "the calibrated prediction"}
                                            for u in expected]
        if estimates:
            for step, est in zip(data["steps"], estimates, strict=True):
                step["estimate"] = _step_estimate(est)
            data["estimate"] = estimate_summary(result, estimates)
        data["source"] = loaded.source
        data["prompt_len"], data["new_tokens"] = args.prompt_len, args.new_tokens
        data["batch"] = args.batch or 1
        if args.format == "html":
            from flopscope.render.html import render_generation_html

            write_output(render_generation_html(data), args.output)
        else:
            write_output(json.dumps(data, indent=2) + "\n", args.output)
    else:
        head = (f"{loaded.source} ({loaded.name}): batch {args.batch or 1}, prompt "
                f"{args.prompt_len}, {args.new_tokens} new tokens"
                f"{', shape-only' if args.shape_only else ''}\n")
        lines = [f"utilization: {u.line()}" for u in utilization]
        if expected:
            from flopscope.estimate.display import human_seconds

            lines += [f"expected from the prediction ({human_seconds(u.seconds)}, not "
                      f"measured): {u.line()}" for u in expected]
        columns: list[tuple[str, list[str]]] = []
        if estimates:
            from flopscope.estimate.display import human_seconds

            columns = [("est. time", [human_seconds(e.total.time_s) for e in estimates]),
                       ("bound", [e.total.bound for e in estimates])]
            if estimates[0].calibrated:
                columns.append(("predicted", [human_seconds(e.total.predicted_s)
                                              for e in estimates]))
            lines += estimate_lines(result, estimates)
        write_output(head + result.table(columns=columns) + "\n"
                     + "".join(f"{x}\n" for x in lines), args.output)
    return EXIT_OK


def predicted_times(result: Any, estimates: list[Any]) -> tuple[float | None, float | None]:
    """The predicted time of a generation's prefill and of its mean decode step, each step's
    as :func:`flopscope.estimate.bound.predicted_step_s` gives it (on a GPU calibration the
    host and device overlapping).

    Args:
        result: the :class:`~flopscope.llm.GenerationReport`.
        estimates: one calibrated :class:`~flopscope.estimate.Estimate` per step.

    Returns:
        (prefill seconds, mean decode step seconds); ``None`` for a kind without steps.
    """
    from flopscope.estimate.bound import predicted_step_s

    steps = list(zip(result.steps, estimates, strict=True))
    prefill = [predicted_step_s(e) for s, e in steps if s.kind == "prefill"]
    decode = [predicted_step_s(e) for s, e in steps if s.kind == "decode"]
    return (sum(prefill) if prefill else None,
            sum(decode) / len(decode) if decode else None)


def _step_estimate(est: Any) -> dict[str, Any]:
    t = est.total
    out = {"time_s": t.time_s, "compute_s": t.compute_s, "memory_s": t.memory_s,
           "bound": t.bound, "kind": "lower bound"}
    if est.calibrated:
        out.update(predicted_s=t.predicted_s, host_s=t.host_s)
    return out


def estimate_summary(result: Any, estimates: list[Any]) -> dict[str, Any]:
    """The roofline of a generation: the hardware, the prefill's lower bound, the decode steps'
    mean lower bound and the tokens per second it allows; with a calibrated profile the same
    predicted, and what the prediction was validated on (``validated_on``: the decode
    validation's figures for the calibration's device kind).

    Args:
        result: the :class:`~flopscope.llm.GenerationReport`.
        estimates: one :class:`~flopscope.estimate.Estimate` per step.

    Returns:
        JSON-ready data.
    """
    prefill = [e.total.time_s for s, e in zip(result.steps, estimates, strict=True)
               if s.kind == "prefill"]
    decode = [(s.tokens, e.total.time_s) for s, e in zip(result.steps, estimates, strict=True)
              if s.kind == "decode"]
    out: dict[str, Any] = {"hardware": estimates[0].hardware.name, "kind": "lower bound",
                           "prefill_s": sum(prefill)}
    if decode:
        seconds = sum(t for _, t in decode)
        out["decode_step_s"] = seconds / len(decode)
        out["decode_tokens_per_s"] = sum(n for n, _ in decode) / seconds if seconds else None
    cal = estimates[0].hardware.calibration
    if cal is not None:  # the calibrated prediction of the same steps (docs/prediction.md)
        steps = list(zip(result.steps, estimates, strict=True))
        predicted = {"calibrated": cal.date, "source": cal.source(), "prefill_s": sum(
            e.total.predicted_s for s, e in steps if s.kind == "prefill")}
        guesses = [(s.tokens, e.total.predicted_s) for s, e in steps if s.kind == "decode"]
        if guesses:
            seconds = sum(t for _, t in guesses)
            predicted["decode_step_s"] = seconds / len(guesses)
            predicted["decode_tokens_per_s"] = (sum(n for n, _ in guesses) / seconds
                                                if seconds else None)
        from flopscope.estimate.decode_validation import serving_validated_on

        predicted["validated_on"] = serving_validated_on(cal.device)
        out["prediction"] = predicted
    return out


def estimate_lines(result: Any, estimates: list[Any]) -> list[str]:
    """The roofline summary of a generation as text (see :func:`estimate_summary`).

    Args:
        result: the :class:`~flopscope.llm.GenerationReport`.
        estimates: one estimate per step.

    Returns:
        Lines of text.
    """
    from flopscope.estimate.display import human_seconds

    summary = estimate_summary(result, estimates)
    bounds = {s.kind: e.total.bound for s, e in zip(result.steps, estimates, strict=True)}
    lines = [f"roofline on {summary['hardware']} (a lower bound on time: no launch or "
             f"framework overhead): prefill {human_seconds(summary['prefill_s'])} "
             f"({bounds.get('prefill', '-')}-bound)"]
    if "decode_step_s" in summary:
        rate = summary["decode_tokens_per_s"]
        lines[0] += (f"; decode {human_seconds(summary['decode_step_s'])} per step "
                     f"({bounds.get('decode', '-')}-bound)")
        if rate:
            lines[0] += f", at most {rate:,.0f} tokens/s"
    guess = summary.get("prediction")
    if guess is not None:
        line = (f"prediction ({guess['source']}): prefill "
                f"{human_seconds(guess['prefill_s'])}")
        if "decode_step_s" in guess:
            line += f"; decode {human_seconds(guess['decode_step_s'])} per step"
            if guess["decode_tokens_per_s"]:
                line += f", {guess['decode_tokens_per_s']:,.0f} tokens/s"
        lines += [line, f"  its error bar: {guess['validated_on']}"]
    return lines
