"""A transformers decoder's forward run as a serving engine (vLLM, SGLang) runs a step:
:func:`engine_step`. Its cache's new positions are written into room kept for them, as a
paged cache writes them (a ``DynamicCache`` appends by ``cat``, a copy of a layer's whole cache
per forward), and its attention is a kernel's: every query against its sequence's keys, each
key/value head read once for the query heads that share it, no mask (transformers attends
several tokens on top of a cache through a materialised causal mask, which makes its SDPA path
copy every layer's keys and values per query group, ``repeat_kv``; without the mask several
new tokens of a sequence see each other: the step's cost is what is kept, not its values, which
are transformers' own for one new token per sequence). The serving planner's mixed
step of continuous batching (:mod:`flopscope.plan.serving`) and its validation
(``benchmarks/mixed_step_validation.py``) run it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["ENGINE_ATTENTION", "engine_step"]


#: the attention a serving engine's step runs (:func:`_engine_attention`), by this name in
#: transformers' attention and mask registries
ENGINE_ATTENTION = "flopscope_engine"


def _engine_attention_call(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
                           scaling: float | None = None, **kwargs: Any
                           ) -> tuple[torch.Tensor, None]:
    """A step's attention as a serving engine's kernel runs it (vLLM's, SGLang's): every
    query against its sequence's keys and values, each key/value head read once for the
    query heads that share it (no mask materialised, no copies of the cache)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if int(getattr(module, "num_key_value_groups", 1)) == 1:
        out = sdpa(query, key, value, scale=scaling)
    else:  # torch 2.4 has no enable_gqa: its key/value heads repeated (copies)
        try:
            out = sdpa(query, key, value, scale=scaling, enable_gqa=True)
        except TypeError:
            groups = query.shape[1] // key.shape[1]
            out = sdpa(query, key.repeat_interleave(groups, 1),
                       value.repeat_interleave(groups, 1), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def _engine_attention(model: nn.Module) -> Iterator[None]:
    """Within: ``model``'s attention is :func:`_engine_attention_call` and builds no mask.

    transformers attends a forward of several tokens per sequence on top of a cache through
    a materialised causal mask, which makes its SDPA path copy every layer's cache once per
    query group (``repeat_kv``); a serving engine's kernel does neither. A model whose config
    does not name its attention (no ``_attn_implementation``) is left as it is."""
    config: Any = getattr(model, "config", None)
    was = getattr(config, "_attn_implementation", None)
    try:  # transformers before 4.53 has no registry of mask functions: its own path
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        was = None
    if was is None:
        yield
        return
    AttentionInterface.register(ENGINE_ATTENTION, _engine_attention_call)
    AttentionMaskInterface.register(ENGINE_ATTENTION, lambda *args, **kwargs: None)
    config._attn_implementation = ENGINE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = was


@contextmanager
def _engine_cache(cache: Any, chunk: int, keep: int) -> Iterator[None]:
    """Within: each layer of ``cache`` (a ``DynamicCache`` of ``DynamicLayer``s) holds its
    first ``keep`` positions and writes the ``chunk`` new positions of a forward into room kept
    for them, as a serving engine's paged cache does, where a ``DynamicLayer`` appends by
    ``cat`` (a copy of the layer's whole cache per forward). The room is made before (its copy
    outside the forward), the layer keeps a view of what it holds (its length the cache's);
    after, the layer holds the buffer. Other caches and layer kinds are left as they are (their
    whole length)."""
    layers = list(getattr(cache, "layers", None) or ())
    if not layers or any(type(layer).__name__ != "DynamicLayer" or not layer.is_initialized
                         or layer.keys is None or layer.keys.dim() != 4 for layer in layers):
        yield
        return
    try:
        for layer in layers:
            _make_room(layer, chunk, keep)
        yield
    finally:
        for layer in layers:
            vars(layer).pop("update", None)  # the class's again


def _make_room(layer: Any, chunk: int, keep: int) -> None:
    """``layer`` (a ``DynamicLayer``) holds its first ``keep`` positions in room for ``chunk``
    more, and its ``update`` writes there (an instance attribute over the class's ``cat``)."""
    held = min(keep, layer.keys.shape[2])
    full = []
    for t in (layer.keys, layer.values):
        room = t.new_empty(*t.shape[:2], held + chunk, t.shape[3])
        room[:, :, :held].copy_(t[:, :, :held])
        full.append(room)
    layer.keys, layer.values = full[0][:, :, :held], full[1][:, :, :held]

    def update(key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[2]
        full[0][:, :, held:held + new].copy_(key_states)
        full[1][:, :, held:held + new].copy_(value_states)
        layer.keys, layer.values = full[0][:, :, :held + new], full[1][:, :, :held + new]
        return layer.keys, layer.values

    layer.update = update


@contextmanager
def engine_step(model: nn.Module, cache: Any, chunk: int, keep: int) -> Iterator[None]:
    """Within: a forward of ``model`` on ``cache`` runs as a serving engine's step (vLLM's,
    SGLang's): ``cache`` holds its first ``keep`` positions per layer and writes the forward's
    ``chunk`` new ones into room kept for them (:func:`_engine_cache`: a paged cache's
    writes, where a ``DynamicCache`` appends by ``cat``), and the attention is a kernel's, no
    mask and no copies of the cache (:func:`_engine_attention`). The serving role's mixed
    step; ``benchmarks/mixed_step_validation.py`` runs the same for real.

    Args:
        model: a transformers decoder.
        cache: its ``DynamicCache``.
        chunk: the positions the forward adds per sequence.
        keep: the positions of ``cache`` the step starts from.
    """
    with _engine_cache(cache, chunk, keep), _engine_attention(model):
        yield
