"""Layers whose cost depends on the training flag, and the warning when a model that has them is
counted in training mode outside a training step.

A freshly built model is in training mode (``torchvision.models.resnet50()`` is): its batch norms
compute the statistics of the batch instead of using their running ones, its dropouts draw and
apply masks. A count of one forward of such a model is a training-mode forward (ResNet-50: 8.262
GFLOP where its eval-mode forward, what inference runs and what ``flopscope count`` reports for
library models, is 8.218). flopscope counts what the model would run, in the mode it is in, and
says so: :func:`flopscope.count` (without ``backward`` or ``train``) and a
:class:`~flopscope.Counter` that saw no backward warn once, naming the layers.

The layers are those of PyTorch, torchvision and timm whose computation differs between the two
modes, in the configurations where it does: batch norms that track running statistics (without
them eval mode uses the batch's statistics too), instance norms that track them, dropouts with
``p > 0``, ``RReLU`` with a range of slopes, ``MultiheadAttention`` with attention dropout, and
stochastic depth (torchvision's ``StochasticDepth``, timm's ``DropPath`` and ``DropBlock2d``) with
a positive rate.
"""

from __future__ import annotations

import warnings
from collections import Counter as Tally
from collections.abc import Callable, Collection

from torch import nn

from flopscope.errors import FlopscopeWarning

__all__ = ["TRAINING_ADVICE", "describe_layers", "mode_dependent", "warn_training_mode"]

TRAINING_ADVICE = (
    "Call model.eval() first to count an inference forward (as `flopscope count` does for "
    "library models), or pass train=False to count(); train=True, or a Counter around a "
    "training step with backward, counts training mode without this warning."
)
"""What the training-mode warning tells the user to do."""

_NORMS_WITH_STATS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    nn.LazyInstanceNorm1d, nn.LazyInstanceNorm2d, nn.LazyInstanceNorm3d,
)
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
             nn.FeatureAlphaDropout)
# third-party stochastic-depth layers, by (defining module prefix, class name) -> their rate
_STOCHASTIC_DEPTH: dict[tuple[str, str], Callable[[nn.Module], float]] = {
    ("torchvision.", "StochasticDepth"): lambda m: float(getattr(m, "p", 0.0) or 0.0),
    ("timm.", "DropPath"): lambda m: float(getattr(m, "drop_prob", 0.0) or 0.0),
    ("timm.", "DropBlock2d"): lambda m: float(getattr(m, "drop_prob", 0.0) or 0.0),
}


def _differs(m: nn.Module) -> bool:
    """Whether ``m`` computes differently in training mode than in eval mode (its own work, not
    its children's)."""
    if isinstance(m, _NORMS_WITH_STATS):
        return getattr(m, "running_mean", None) is not None
    if isinstance(m, _DROPOUTS):
        return float(m.p) > 0
    if isinstance(m, nn.RReLU):
        return m.lower != m.upper
    if isinstance(m, nn.MultiheadAttention):
        return float(m.dropout) > 0
    cls = type(m)
    for (package, name), rate in _STOCHASTIC_DEPTH.items():
        if cls.__name__ == name and cls.__module__.startswith(package):
            return rate(m) > 0
    return False


def mode_dependent(model: nn.Module, ran: Collection[str] | None = None) -> dict[str, int]:
    """The layers of ``model`` that are in training mode and compute differently there (see the
    module docstring), counted by class name.

    Args:
        model: the model.
        ran: module paths (as ``named_modules()`` gives them) that ran; ``None``: every module.
            A layer that did not run does not change a count.

    Returns:
        Class name -> how many, in model order; empty when nothing depends on the mode.
    """
    found: Tally[str] = Tally()
    seen: set[int] = set()
    for path, m in model.named_modules(remove_duplicate=False):  # a shared module: any path
        if id(m) in seen or not m.training or (ran is not None and path not in ran):
            continue
        seen.add(id(m))
        if _differs(m):
            found[type(m).__name__] += 1
    return dict(found)


def describe_layers(found: dict[str, int]) -> str:
    """``{"BatchNorm2d": 53, "Dropout": 1}`` as ``"BatchNorm2d x53, Dropout x1"``.

    Args:
        found: class name -> count, as :func:`mode_dependent` gives.

    Returns:
        The text.
    """
    return ", ".join(f"{name} x{n}" for name, n in found.items())


def warn_training_mode(found: dict[str, int], advice: str, *, stacklevel: int = 2) -> None:
    """Warn (a :class:`~flopscope.errors.FlopscopeWarning`) that a model with these layers was
    counted in training mode; nothing when ``found`` is empty.

    Args:
        found: the layers, as :func:`mode_dependent` gives.
        advice: what the caller can do instead (how to count eval mode, how to say training
            mode is meant).
        stacklevel: passed to :func:`warnings.warn`.
    """
    if not found:
        return
    warnings.warn(
        f"flopscope: the model was counted in training mode, and these layers compute differently "
        f"in training than in eval (batch statistics, dropout masks): {describe_layers(found)}. "
        f"{advice}",
        FlopscopeWarning,
        stacklevel=stacklevel + 1,
    )
