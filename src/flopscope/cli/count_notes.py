"""What ``flopscope count`` tells the user besides its results, on stderr: the words of the
progress line while it counts (:mod:`flopscope.cli.progress`), and the one-line warning when the
model it counted a forward of is in training mode."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["counting_what", "simulating_what", "warn_training_mode"]


def warn_training_mode(model: Any) -> None:
    """Say on stderr (one line) when a model is in training mode with layers whose cost depends
    on it: library models are built in eval mode, a factory's model is counted in the mode it
    returns (see :mod:`flopscope.core.training_mode`).

    Args:
        model: the loaded model.
    """
    from flopscope.core.training_mode import describe_layers, mode_dependent

    found = mode_dependent(model)
    if found:
        print(f"warning: the model is in training mode, and these layers compute differently in "
              f"training than in eval: {describe_layers(found)}; this counts a training-mode "
              "forward (call model.eval() in the factory to count inference, or add --backward "
              "to count a training step)", file=sys.stderr)


def counting_what(args: argparse.Namespace) -> str:
    """What ``count`` is doing while it counts, for the progress line.

    Args:
        args: the parsed arguments.

    Returns:
        A few words: ``"counting forward + backward (shape-only)"``.
    """
    if args.world_size is not None:
        return f"simulating rank {args.rank} of {args.world_size}"
    if args.memory and args.backward:
        what = "counting a training step (forward, backward, optimizer) for peak memory"
    elif args.memory:
        what = "counting forward for peak memory"
    else:
        what = "counting forward + backward" if args.backward else "counting forward"
    return what + (" (shape-only)" if args.shape_only else "")


def simulating_what(layout: Any, built: int) -> str:
    """The progress line of a simulated job when its model is built the ``built``-th time
    (from 0): every pipeline stage is a rank of its own; after the rank, :func:`simulate`
    builds the unsharded model for the logical figures.

    Args:
        layout: the :class:`~flopscope.distributed.Layout`.
        built: how many times the model was built before.

    Returns:
        A few words.
    """
    if layout.pp > 1:
        ranks = layout.stage_ranks()
        rank = ranks[built] if built < len(ranks) else layout.rank
        return (f"simulating pipeline stage {min(built + 1, layout.pp)} of {layout.pp} "
                f"(rank {rank} of {layout.world_size})")
    if built and layout.ep == 1:
        return "counting the unsharded model (the logical figures)"
    return f"simulating rank {layout.rank} of {layout.world_size}"
