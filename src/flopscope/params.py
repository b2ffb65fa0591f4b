"""Parameter and buffer counts of a model, per module: own and inclusive, each tensor once."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["ParamStats", "count_params"]


@dataclass(frozen=True, slots=True)
class ParamStats:
    """Parameter elements of one module.

    Attributes:
        own: elements of parameters registered directly on this module (a tied parameter is owned
            by the first module that registers it, in ``named_modules()`` order).
        inclusive: elements of the distinct parameters in this module's subtree.
        trainable: inclusive elements with ``requires_grad=True``.
        frozen: inclusive elements with ``requires_grad=False``.
        buffers: elements of the distinct buffers in this module's subtree.
    """

    own: int = 0
    inclusive: int = 0
    trainable: int = 0
    frozen: int = 0
    buffers: int = 0

    def to_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {
            "own": self.own,
            "inclusive": self.inclusive,
            "trainable": self.trainable,
            "frozen": self.frozen,
            "buffers": self.buffers,
        }


def count_params(model: nn.Module) -> dict[str, ParamStats]:
    """Parameter counts for every module of ``model``, by module path (the root is ``""``).

    Works for models on any device, ``meta`` included (only shapes are read).

    Args:
        model: the model.

    Returns:
        Module path -> :class:`ParamStats`, in ``named_modules()`` order.
    """
    owner: dict[int, str] = {}
    for path, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), path)
    stats: dict[str, ParamStats] = {}
    for path, module in model.named_modules():
        params = {id(p): p for p in module.parameters()}
        bufs = {id(b): b for b in module.buffers()}
        own = sum(p.numel() for p in module.parameters(recurse=False) if owner[id(p)] == path)
        trainable = sum(p.numel() for p in params.values() if p.requires_grad)
        frozen = sum(p.numel() for p in params.values() if not p.requires_grad)
        stats[path] = ParamStats(
            own=own,
            inclusive=trainable + frozen,
            trainable=trainable,
            frozen=frozen,
            buffers=sum(b.numel() for b in bufs.values()),
        )
    return stats
