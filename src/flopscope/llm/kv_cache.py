"""A decode loop's key/value cache, recognised by what it is: the cache object a forward is given
or returns (a transformers ``Cache``, or per-layer (keys, values) tuples), whatever the keyword
(``past_key_values``, ``cache``); the positions of a forward's tokens; whether a forward continues
a cache (a decode step) or starts one (a prefill)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["cache_keyword", "cache_layers", "find_cache", "starts_with_cache", "tokens_of"]


def tokens_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    """(batch, new positions) of a forward call: from input_ids, inputs_embeds or the first
    tensor argument."""
    for name in ("input_ids", "inputs_embeds", "decoder_input_ids"):
        t = kwargs.get(name)
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            return int(t.shape[0]), int(t.shape[1])
    for t in args:
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            return int(t.shape[0]), int(t.shape[1])
    return 1, 0


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers Cache (``layers``, or the older
    ``key_cache``/``value_cache`` lists) or a legacy tuple cache; layers not yet filled are
    skipped."""
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    layers = getattr(cache, "layers", None)
    if layers is None and isinstance(getattr(cache, "key_cache", None), list):
        layers = [_KV(k, v) for k, v in zip(cache.key_cache, cache.value_cache, strict=False)]
    if isinstance(layers, (list, tuple)):
        for layer in layers:
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
                out.append((k, v))
        return out
    if isinstance(cache, (tuple, list)):
        for item in cache:
            if (isinstance(item, (tuple, list)) and len(item) >= 2
                    and isinstance(item[0], torch.Tensor) and isinstance(item[1], torch.Tensor)):
                out.append((item[0], item[1]))
    return out


@dataclass
class _KV:
    keys: Any
    values: Any


def _is_cache(obj: Any) -> bool:
    """A key/value cache, recognised by what it is, not by the keyword it came under
    (transformers called it ``past_key_values``; 5.24 calls it ``cache``): a transformers
    ``Cache`` (it has ``get_seq_length``), or a tuple of per-layer (keys, values) pairs."""
    if callable(getattr(obj, "get_seq_length", None)):
        return True
    return (isinstance(obj, (tuple, list)) and bool(obj) and bool(cache_layers(obj))
            and len(cache_layers(obj)) == len(obj))


def find_cache(*places: Any) -> Any:
    """The first key/value cache among ``places``, found by what it is (a transformers
    ``Cache``, or a tuple of per-layer (keys, values)); dicts, model outputs and tuples are
    searched by value, so the keyword or field it came under does not matter.

    Args:
        places: model outputs, keyword dicts, argument tuples, or caches.

    Returns:
        The cache, or ``None``.
    """
    for place in places:
        values = place.values() if isinstance(place, dict) else (
            place if isinstance(place, (tuple, list)) and not _is_cache(place) else (place,))
        for value in values:
            if value is not None and _is_cache(value):
                return value
    return None


# Names transformers has given the absolute positions of a forward's tokens.
_POSITION_KEYWORDS = ("cache_position", "position_ids")


def _first_position(kwargs: dict[str, Any]) -> int | None:
    """The smallest position a forward is given, where its values can be read (not on meta or
    fake tensors): 0 in a prefill (left padding included), the cache length after."""
    for name in _POSITION_KEYWORDS:
        t = kwargs.get(name)
        if isinstance(t, torch.Tensor) and t.numel() and not t.is_meta:
            try:
                return int(t.min())
            except (RuntimeError, NotImplementedError):  # a fake tensor has no values
                return None
    return None


def starts_with_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a forward continues from a cache that already holds entries (a decode step).

    Decided from the cache object the model is given and the positions of its tokens, whatever
    the keywords are called: with readable positions, the step continues a cache exactly when
    its first position is after 0 (a static cache is full-length from the start, so its
    shape says nothing); otherwise when any layer of the cache holds keys.
    """
    cache = find_cache(kwargs, args)
    if cache is None:
        return False
    start = _first_position(kwargs)
    if start is not None:
        return start > 0
    return any(k.shape[-2] > 0 for k, _ in cache_layers(cache))


def cache_keyword(model: nn.Module) -> str:
    """The keyword under which ``model``'s forward takes its key/value cache: ``cache``
    (transformers 5.24) or ``past_key_values`` (earlier releases, and models that do not
    say).

    Args:
        model: the model.

    Returns:
        The keyword.
    """

    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in names and "past_key_values" not in names else "past_key_values"
