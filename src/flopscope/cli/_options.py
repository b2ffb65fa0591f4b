"""The one grammar of the command line, shared by every subcommand.

Every subcommand adds its options through these helpers, so a flag means the same thing
everywhere: ``--format table|markdown|json|csv|html``, ``--output FILE``, ``--input SHAPE[:DTYPE]``,
``--batch N``, ``--seq-len N``, ``--dtype NAME``, ``--depth N``, ``--config KEY=VALUE``.

Errors: a subcommand raises :func:`usage_error` (exit 2) or :class:`CheckFailed` (exit 1);
:func:`flopscope.cli.main` prints them as one line on stderr (:func:`print_error`) and returns
the exit code. Argument-parser errors are usage errors too, with close matches suggested for an
unknown choice and for an option the subcommand does not have (:meth:`Parser.unrecognized`).

Exit codes: :data:`EXIT_OK` 0, :data:`EXIT_CHECK_FAILED` 1, :data:`EXIT_USAGE` 2,
:data:`EXIT_INTERRUPTED` 130 (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from flopscope._text import did_you_mean, one_line
from flopscope.cli import interrupt
from flopscope.cli.types import (
    dtype_name,
    non_negative_int,
    output_file,
    positive_int,
    positive_number,
)
from flopscope.errors import UsageError

if TYPE_CHECKING:
    from flopscope.sources import LoadedModel

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "FORMATS",
    "PROG",
    "SOURCE_FORMS",
    "CheckFailed",
    "Parser",
    "add_depth",
    "add_format",
    "add_output",
    "add_source_options",
    "check_page_output",
    "did_you_mean",
    "load_source",
    "one_line",
    "print_error",
    "print_traceback_if_asked",
    "usage_error",
    "write_output",
]

PROG = "flopscope"

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = interrupt.EXIT_INTERRUPTED  # 130

FORMATS = ("table", "markdown", "json", "csv", "html")

SOURCE_FORMS = (
    "torchvision:NAME, timm:NAME, hf:MODEL_TYPE, hf:path/to/config.json, "
    "path/to/file.py:factory or package.module:factory"
)


class CheckFailed(Exception):
    """A check the user asked for did not pass (exit 1): the message is printed as one line."""


#: options other tools (or another subcommand) spell differently: what a subcommand that has
#: the second and not the first suggests for the first
OPTION_ALIASES = {"--train": "--backward", "--training": "--backward"}


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`~flopscope.UsageError` (exit 2, one line),
    with close matches suggested for an invalid choice and for an unknown option.

    Attributes:
        options: the option strings added to it (``--batch``, ``-h``, ...).
        subcommands: subcommand name -> its parser (the top-level parser's; empty elsewhere).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[str] = []
        self.subcommands: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """:meth:`argparse.ArgumentParser.add_argument`, its option strings kept in
        :attr:`options`."""
        action = super().add_argument(*args, **kwargs)
        self.options.extend(action.option_strings)
        return action

    def unrecognized(self, command: str | None, extra: Sequence[str]) -> UsageError:
        """The usage error for arguments nothing took, with what the subcommand ``command``
        (or this parser) has that is close to the first unknown option.

        Args:
            command: the subcommand parsed (``None``: none).
            extra: the arguments left over.

        Returns:
            The error to raise.
        """
        parser = self.subcommands.get(command or "", self)
        names = [a.split("=", 1)[0] for a in extra if a.startswith("-")]
        hint = ""
        if names:
            alias = OPTION_ALIASES.get(names[0])
            hint = (f" (did you mean {alias}?)"
                    if alias in parser.options and names[0] not in parser.options
                    else did_you_mean(names[0], parser.options))
        return UsageError(f"unrecognized arguments: {' '.join(extra)}{hint} "
                          f"(see '{parser.prog} --help')")

    def error(self, message: str) -> NoReturn:
        """Raise the parser's complaint as a usage error.

        Args:
            message: argparse's message.

        Raises:
            UsageError: always.
        """
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(2))
            message += did_you_mean(found.group(1), choices)
        raise UsageError(f"{message} (see '{self.prog} --help')")


def usage_error(message: str) -> UsageError:
    """A usage error (exit 2) to raise: ``raise usage_error("what was wrong; what to do")``.

    Args:
        message: one sentence naming the flag and what to change.

    Returns:
        The exception.
    """
    return UsageError(message)


def print_error(message: str) -> None:
    """Print ``flopscope: MESSAGE`` as one line on stderr.

    Args:
        message: the text; newlines and runs of spaces are flattened, long text is cut.
    """
    print(f"{PROG}: {one_line(message)}", file=sys.stderr, flush=True)


def print_traceback_if_asked() -> None:
    """Print the current exception's traceback when ``FLOPSCOPE_TRACEBACK`` is set."""
    if os.environ.get("FLOPSCOPE_TRACEBACK"):
        traceback.print_exc()


# -- argument types ----------------------------------------------------------------------------
def add_format(
    parser: argparse.ArgumentParser,
    *,
    choices: Sequence[str] = FORMATS,
    default: str = "table",
    help: str | None = None,  # noqa: A002  (argparse's own name)
) -> None:
    """Add ``--format`` (a subset of ``table|markdown|json|csv|html``, in that order).

    Args:
        parser: the subcommand's parser.
        choices: the formats this subcommand writes.
        default: the format without the flag.
        help: the help text (default: lists the choices).
    """
    parser.add_argument("--format", choices=list(choices), default=default,
                        help=help or f"output format (default {default})")


def add_output(parser: argparse.ArgumentParser, *, help: str | None = None) -> None:  # noqa: A002
    """Add ``--output FILE`` (``-`` or absent: stdout), checked as the command line is parsed
    (:func:`flopscope.cli.types.output_file`: its folder must exist); write with
    :func:`write_output`.

    Args:
        parser: the subcommand's parser.
        help: the help text.
    """
    parser.add_argument("--output", metavar="FILE", type=output_file,
                        help=help or "write the result to FILE instead of stdout")


def add_depth(
    parser: argparse.ArgumentParser,
    *,
    default: int | None = None,
    help: str | None = None,  # noqa: A002
) -> None:
    """Add ``--depth N`` (levels of the module tree, 0 or more).

    Args:
        parser: the subcommand's parser.
        default: the depth without the flag (``None``: the subcommand decides).
        help: the help text.
    """
    parser.add_argument("--depth", type=non_negative_int, default=default, metavar="N",
                        help=help or "levels of the module tree")


# -- output ------------------------------------------------------------------------------------
def write_output(text: str, path: str | None, *, flag: str = "--output") -> None:
    """Write ``text`` to stdout (``path`` ``None`` or ``-``) or to the file ``path``; a file
    written is announced on stderr. Directories are never created.

    Args:
        text: the whole result.
        path: the user's file name, or ``None``/``-`` for stdout.
        flag: the flag that named it, for the message.

    Raises:
        UsageError: the file cannot be written.
    """
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise usage_error(f"cannot write {flag} {path!r}: {e.strerror or e}") from None
    print(f"wrote {path}", file=sys.stderr)


def check_page_output(fmt: str, path: str | None) -> None:
    """Fail early (exit 2) when ``--format html`` would print a web page into a terminal; a
    file, or stdout sent to a pipe or a file, is fine.

    Args:
        fmt: the ``--format`` given.
        path: the ``--output`` given (``None`` or ``-``: stdout).

    Raises:
        UsageError: an HTML page would go to a terminal.
    """
    if fmt == "html" and path in (None, "-") and sys.stdout.isatty():
        raise usage_error("--format html writes a web page: give --output FILE.html (or send "
                          "stdout to a file)")


# -- SOURCE and its inputs ---------------------------------------------------------------------
def add_source_options(
    parser: argparse.ArgumentParser,
    *,
    dtype_default: str | None = None,
    source_help: str | None = None,
) -> None:
    """Add the positional ``SOURCE`` and every option that shapes what it loads: ``--input``,
    ``--batch``, ``--seq-len``, ``--dtype``, ``--config``. Every subcommand that takes a SOURCE
    calls this, so they all accept the same flags; read them back with :func:`load_source`.

    Args:
        parser: the subcommand's parser.
        dtype_default: the ``--dtype`` without the flag (``None``: what the source builds,
            float32 for every library model).
        source_help: the help of the positional argument.
    """
    parser.add_argument("source", metavar="SOURCE",
                        help=source_help or f"the model: {SOURCE_FORMS}")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="an input shape such as 1x3x224x224 or 1x128:int64; repeat for "
                             "several inputs (replaces the source's default inputs)")
    parser.add_argument("--batch", type=positive_int, metavar="N",
                        help="batch size (first dimension of inputs)")
    parser.add_argument("--seq-len", type=positive_int, metavar="N",
                        help="sequence length of hf: token inputs (default 128)")
    parser.add_argument("--dtype", type=dtype_name, default=dtype_default, metavar="DTYPE",
                        help="floating-point dtype of weights and floating inputs, e.g. float64 "
                             f"(default {dtype_default or 'as built, float32'})")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="override an hf: config setting (repeatable)")


def check_source_options(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """Every check of the options of :func:`add_source_options` that needs no model, for a
    subcommand to run before any long work (``--hardware this-machine``'s probes, a
    calibration): ``--input`` and ``--config`` parsed, the flags that apply to ``hf:`` only, and
    the source's form and name (:func:`flopscope.sources.check_source`). :func:`load_source`
    runs it again (it takes milliseconds once the libraries are imported).

    Args:
        args: the parsed arguments (``source``, ``input``, ``seq_len``, ``config``).

    Returns:
        The parsed inputs and config overrides.

    Raises:
        UsageError: a malformed flag, a flag that does not apply to this source, or a source
            that names no model.
    """
    from flopscope import sources

    source: str = args.source
    specs = [sources.parse_input(text, what="--input") for text in args.input]
    config = sources.parse_config(args.config, what="--config")
    is_hf = source.startswith("hf:")
    if config and not is_hf:
        raise usage_error("--config applies to hf: sources only; remove it or use an hf: source")
    if args.seq_len is not None and not is_hf and not specs:
        raise usage_error(
            "--seq-len applies to hf: sources only; give other models their shapes with --input"
        )
    sources.check_source(source)
    return specs, config


def load_source(
    args: argparse.Namespace,
    *,
    shape_only: bool = False,
    require_inputs: bool = True,
) -> LoadedModel:
    """Load the model named by the options of :func:`add_source_options`, with errors that name
    the flag to change.

    Args:
        args: the parsed arguments (``source``, ``input``, ``batch``, ``seq_len``, ``dtype``,
            ``config``).
        shape_only: build on the ``meta`` device where possible.
        require_inputs: fail (exit 2, naming ``--input``) when the source gives no inputs.

    Returns:
        The loaded model (see :func:`flopscope.sources.load_model`).

    Raises:
        UsageError: a malformed flag, a flag that does not apply to this source, or a bad source.
    """
    from flopscope import sources

    source: str = args.source
    specs, config = check_source_options(args)
    loaded = sources.load_model(
        source, inputs=specs, batch=args.batch, seq_len=args.seq_len, config=config,
        shape_only=shape_only, dtype=args.dtype, require_inputs=False,
    )
    if require_inputs and not loaded.args and not loaded.kwargs:
        raise usage_error(
            f"{source!r} gives no example inputs: pass their shapes with --input, e.g. "
            "--input 1x3x224x224, or return (model, inputs) from the factory"
        )
    return loaded


# -- utilization of a measured run (MFU) -------------------------------------------------------
def add_compiled(parser: Any) -> None:
    """``--compiled``: with ``--hardware``, predict a compiled step (count, generate)."""
    parser.add_argument("--compiled", action="store_true",
                        help="with --hardware: predict a compiled step (CUDA graphs, "
                             "torch.compile): no host time per call, the kernels as eager's "
                             "(no fusion modelled)")


def resolve_hardware(args: argparse.Namespace) -> Any:
    """``--hardware`` resolved once, before any long work (``this-machine``'s probes run
    here), as a compiled step's where ``--compiled``; ``None`` without ``--hardware``.

    Raises:
        UsageError: ``--compiled`` without ``--hardware``.
    """
    if args.compiled and not args.hardware:
        raise usage_error("--compiled predicts with a --hardware profile's calibration: add "
                          "--hardware NAME (e.g. h100-sxm)")
    if not args.hardware:
        return None
    from flopscope.estimate import get_hardware
    from flopscope.estimate.profile import compiled_hardware

    return compiled_hardware(get_hardware(args.hardware), args.compiled)


def add_step_time(parser: Any, *, step_help: str) -> None:
    """Add ``--step-time SECONDS`` (a measured wall time: MFU = model FLOPs / time / peak) and
    ``--peak-tflops X`` (a peak of one's own instead of the ``--hardware`` profile's).

    Args:
        parser: the subcommand's parser or one of its argument groups.
        step_help: what ``--step-time`` times, in this subcommand.
    """
    parser.add_argument("--step-time", type=positive_number, metavar="SECONDS",
                        help=step_help + "; with --hardware or --peak-tflops: MFU = model FLOPs "
                             "(attention as visible pairs) / SECONDS / peak, also HFU")
    parser.add_argument("--peak-tflops", type=positive_number, metavar="X",
                        help="with --step-time: the peak in dense TFLOP/s (instead of, or over, "
                             "the --hardware profile's matrix peak for the model's dtype)")


def check_step_time(args: argparse.Namespace, *, timed: bool) -> None:
    """Fail fast (before loading the model) when a peak comes without a measured time or a
    measured time without a peak.

    Args:
        args: the parsed arguments (``peak_tflops``, ``hardware``).
        timed: a measured time was given (``--step-time``, or another time flag).

    Raises:
        UsageError: what is missing, and the flag that gives it.
    """
    if not timed:
        raise usage_error("--peak-tflops needs a measured time to divide by: --step-time SECONDS")
    if args.hardware is None and args.peak_tflops is None:
        raise usage_error("MFU of a measured time needs a peak: --hardware NAME (e.g. h100-sxm) "
                          "or --peak-tflops X")


def step_time_peak(args: argparse.Namespace, model: Any, *,
                   timed: bool) -> tuple[float, str, float | None]:
    """The peak for ``--step-time``: ``--peak-tflops``, else the ``--hardware`` profile's matrix
    peak for the model's dtype (``--dtype``, else its first floating parameter's).

    Args:
        args: the parsed arguments (``peak_tflops``, ``hardware``, ``dtype``, ``tf32`` where
            the subcommand has it).
        model: the loaded model.
        timed: a measured time was given (``--step-time``, or another time flag).

    Returns:
        ``(peak FLOP/s, its name, memory bandwidth or None)``.

    Raises:
        UsageError: no peak given, or a peak without a measured time.
    """
    import torch

    from flopscope.llm.flops import resolve_peak

    check_step_time(args, timed=timed)
    dtype = getattr(torch, args.dtype) if args.dtype else next(
        (p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return resolve_peak(args.hardware, peak_tflops=args.peak_tflops, dtype=dtype,
                        tf32=bool(getattr(args, "tf32", False)))
