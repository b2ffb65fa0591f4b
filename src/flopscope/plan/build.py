"""How a plan builds its model and names it: :func:`build_model` (on ``meta``, in train mode,
checkpointed as asked, optionally with its first decoder layers only) and :func:`model_identity`
(what the role caches key a model by). The planner, the sweeps and the worker processes that
simulate roles all build models this one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from flopscope.distributed.repeat import layer_list, truncate
from flopscope.plan.checkpointing import enable
from flopscope.plan.roles import Build

__all__ = ["build_model", "model_identity"]


def build_model(source: str, seq_len: int | None, dtype: str,
                config: Mapping[str, Any] | None) -> Build:
    """How a plan builds ``source``'s model for a role (:data:`~flopscope.plan.roles.Build`):
    on ``meta``, in train mode, its decoder blocks checkpointed as asked
    (:func:`flopscope.plan.checkpointing.enable`).

    Args:
        source: the SOURCE string.
        seq_len: tokens per sequence (``None``: the source's).
        dtype: the model's dtype.
        config: config overrides.

    Returns:
        ``build(batch, checkpoint, layers=None) -> (model, args, kwargs)``: with ``layers``, the
        model's first decoder layers only (an ``hf:`` model built with as many: a 70B-shaped
        Llama's 80 layers on ``meta`` take longer to make than a small run's count takes).
    """
    from flopscope import sources

    own: list[int] = []  # the model's decoder layers, once it was built whole

    def build(batch: int, checkpoint: str, layers: int | None = None
              ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        fewer = layers is not None and source.startswith("hf:") and own and layers <= own[0]
        loaded = sources.load_model(
            source, batch=batch, seq_len=seq_len, shape_only=True, dtype=dtype,
            config={**(config or {}), "num_hidden_layers": layers} if fewer else config)
        model = loaded.model
        if not fewer:
            found = layer_list(model)
            own[:] = [len(found[1])] if found is not None else []
        if layers is not None:
            truncate(model, layers)
        model.train()
        enable(model, checkpoint, source)
        return model, tuple(loaded.inputs.args), dict(loaded.inputs.kwargs)

    return build


def model_identity(source: str, seq_len: int | None, dtype: str,
                   config: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What a plan's model is, as the role caches key it (the roles of two plans with the
    same identity are shared).

    Args:
        source: the SOURCE string.
        seq_len: the sequence length asked for.
        dtype: the model's dtype.
        config: config overrides.

    Returns:
        A hashable identity.
    """
    return (source, seq_len, dtype, tuple(sorted((config or {}).items())))
