"""``flopscope count SOURCE --symbolic batch,seq_len``: costs as formulas of named input sizes.

The names match the options that set those sizes: ``batch`` (``--batch``: the first dimension of
every input), ``seq_len`` (``--seq-len``: the second dimension of token-id inputs of ``hf:``
sources), ``height`` / ``width`` (the last two dimensions of image inputs, ``--input``) or
``resolution`` (both, one symbol: a square image).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from flopscope.cli._options import (
    EXIT_OK,
    check_page_output,
    load_source,
    one_line,
    usage_error,
    write_output,
)

__all__ = ["NAMES", "run_symbolic", "symbol_places"]

NAMES = ("batch", "seq_len", "height", "width", "resolution")


def symbol_places(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> dict[str, list[tuple[int | str, int]]]:
    """Where each named size is among a model's inputs.

    Args:
        names: symbol names, a subset of :data:`NAMES`.
        args: the model's positional inputs.
        kwargs: the model's keyword inputs.

    Returns:
        name -> list of (argument index or keyword, dimension).

    Raises:
        UsageError: an unknown name, or a name no input has.
    """
    places: dict[str, list[tuple[int | str, int]]] = {n: [] for n in names}
    tensors: list[tuple[int | str, torch.Tensor]]
    tensors = [(i, t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)]
    tensors += [(k, t) for k, t in kwargs.items() if isinstance(t, torch.Tensor)]
    for name in names:
        if name not in NAMES:
            raise usage_error(f"--symbolic: unknown size {name!r}; choose from {', '.join(NAMES)}")
    if "resolution" in names and ("height" in names or "width" in names):
        raise usage_error("--symbolic: resolution is height and width at once; give one or the other")
    for where, t in tensors:
        images = t.dim() == 4 and t.is_floating_point()
        if "batch" in names and t.dim() >= 1:
            places["batch"].append((where, 0))
        if "seq_len" in names and t.dim() == 2 and not t.is_floating_point():
            places["seq_len"].append((where, 1))
        if images:
            for name, dims in (("height", (2,)), ("width", (3,)), ("resolution", (2, 3))):
                if name in names:
                    places[name] += [(where, d) for d in dims]
    for name, found in places.items():
        if not found:
            raise usage_error(f"--symbolic {name}: no input of this model has that size "
                              "(seq_len: 2-D token ids; height/width/resolution: 4-D images)")
    return places


def run_symbolic(args: argparse.Namespace) -> int:
    """``flopscope count SOURCE --symbolic NAMES``: count once with those sizes symbolic and print
    the formulas (table, markdown or json), the domain, derived figures, and a plot with
    ``--plot``.

    Args:
        args: the parsed ``count`` arguments.

    Returns:
        The exit code.

    Raises:
        UsageError: a bad name, an option that does not combine with ``--symbolic``, or a model
            that cannot run with symbolic sizes.
    """
    import flopscope
    from flopscope.render.formulas import pretty
    from flopscope.symbolic.count import count_symbolic, plot_symbolic

    check_page_output(args.format, args.output)
    for flag in ("hardware", "memory", "roofline_plot"):
        if getattr(args, flag, None):
            raise usage_error(f"--{flag.replace('_', '-')} does not combine with --symbolic")
    if args.format == "csv":
        raise usage_error("--symbolic writes table, markdown, json or html")
    names = [n.strip() for n in args.symbolic.split(",") if n.strip()]
    loaded = load_source(args, shape_only=True)
    places = symbol_places(names, loaded.args, loaded.kwargs)
    hints = {}
    if "batch" in names:
        hints["batch"] = max(2, args.batch or 1)
    try:
        report = count_symbolic(loaded.model, *loaded.args, symbolic=places, hints=hints,
                                backward=args.backward, strict=args.strict, warn=False,
                                **loaded.kwargs)
    except flopscope.ForwardError as e:
        raise usage_error(f"{args.source} with --symbolic {args.symbolic}: {one_line(e, 400)}") from e
    except flopscope.StrictModeError as e:
        from flopscope.cli._options import CheckFailed

        raise CheckFailed(f"--strict: {e}") from e
    depth = args.depth if args.depth is not None else 2
    derived = []
    if "seq_len" in names:
        per_token = report.flops_per_token("seq_len")
        derived.append(f"FLOPs per token (d/d seq_len, per sample): {pretty(per_token)}")
        cross = report.crossover("seq_len")
        derived.append(f"attention (terms in seq_len² and above) overtakes the rest at seq_len = {cross}"
                       if cross is not None else "no term grows faster than seq_len")
    if args.format == "json":
        data = report.to_dict()
        data["source"] = args.source
        write_output(json.dumps(data, indent=2) + "\n", args.output)
    elif args.format == "html":
        write_output(report.to_html(), args.output)
    elif args.format == "markdown":
        write_output(report.markdown(depth) + "\n" + "".join(f"\n- {d}" for d in derived) + "\n",
                     args.output)
    else:
        write_output(report.table(depth) + "\n" + "".join(f"{d}\n" for d in derived), args.output)
    if args.plot:
        symbol = next(n for n in ("seq_len", "resolution", "height", "width", "batch") if n in names)
        plot_symbolic(report, args.plot, symbol=symbol)
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK
