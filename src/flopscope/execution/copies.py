"""Stand-ins for a model's tensors: ``meta`` copies (no memory) and fake CPU tensors, made one way
for every driver.

- :func:`meta_input`: an input as a ``meta`` tensor of the same metadata;
- :func:`swap_to_meta` / :func:`put_back`: a real model's parameters and buffers swapped for meta
  copies in place while a shape-only forward runs (no deep copy; copies reused across counts);
- :func:`converted_copy` / :func:`meta_twin`: a deep copy whose tensors are converted (tied weights
  stay tied, parameters stay parameters), for a training step an optimizer can step, or a
  monitor's shadow count;
- :func:`to_fake` / :func:`fake_mode_for`: fake CPU tensors of a fake mode (a ``meta`` model's
  parameters too).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from flopscope.execution.meta import (
    ShapeOnlyFakeMode,
    constant_input,
    holds_sizes,
    is_sparse,
    meta_sparse,
    sparse_fake,
)

__all__ = ["converted_copy", "fake_input", "fake_mode_for", "meta_input", "meta_twin", "put_back",
           "swap_to_meta", "to_empty_tied", "to_fake"]

_CPU = torch.device("cpu")


def meta_input(t: torch.Tensor) -> torch.Tensor:
    """An input for a model on ``meta``: the same metadata on ``meta`` (a leaf that requires grad
    where the input does; no memory).

    Args:
        t: the input.

    Returns:
        ``t`` itself when it is on ``meta`` already, else its meta twin.
    """
    if t.is_meta:
        return t
    if is_sparse(t):  # its stored entries kept
        return meta_sparse(t.detach())
    return t.detach().to("meta").requires_grad_(t.requires_grad)


def swap_to_meta(modules: list[nn.Module]) -> list[tuple[dict[str, Any], str, torch.Tensor]]:
    """Put meta copies (same shapes, strides and dtypes; no memory) in place of the modules'
    parameters and buffers, as ``torch.func.functional_call`` does (it swaps the same entries),
    in one pass; :func:`put_back` restores them (and :func:`count` checks every slot again).
    A tensor registered under several names (tied weights) gets one copy; a trainable
    parameter's copy requires grad; tensors already on ``meta`` stay.

    Returns:
        (table, name, original) of every entry swapped.
    """
    copies: dict[int, torch.Tensor] = {}
    swapped: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    keep = swapped.append
    for m in modules:
        tables: tuple[dict[str, Any], ...] = (m._parameters, m._buffers)
        for table in tables:
            if not table or type(table) is not dict:  # nothing, or a TorchScript module
                continue
            for name, t in table.items():
                if t is None or t.is_meta:
                    continue
                copy = copies.get(id(t))
                if copy is None:
                    copy = copies[id(t)] = _meta_copy(t)
                table[name] = copy  # (a value replaced, not a key added: iteration goes on)
                keep((table, name, t))
    return swapped


# id(tensor) -> (weak reference to it, its meta copy, the metadata both had): copies are made
# again only for tensors not seen before, or whose (or whose copy's) metadata changed since
_COPIES: dict[int, tuple[Any, torch.Tensor, tuple[Any, ...]]] = {}


def _meta_copy(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor like ``t`` (a trainable parameter's copy requires grad), reused across
    counts while neither changed."""
    grad = t.requires_grad and isinstance(t, nn.Parameter)  # (isinstance is Python code here)
    if is_sparse(t):  # no strides; its stored entries kept
        return meta_sparse(t.detach()).requires_grad_(grad)
    facts = (t.shape, t.stride(), t.dtype, grad)
    entry = _COPIES.get(id(t))
    if entry is not None and entry[0]() is t and entry[2] == facts:
        copy = entry[1]
        if (copy.shape, copy.stride(), copy.dtype, copy.requires_grad) == facts and copy.is_leaf:
            return copy
    copy = torch.empty_like(t, device="meta")
    if grad:
        copy.requires_grad_(True)
    if len(_COPIES) > 100_000:
        _COPIES.clear()
    _COPIES[id(t)] = (weakref.ref(t), copy, facts)
    return copy


def put_back(swapped: list[tuple[dict[str, Any], str, torch.Tensor]]) -> None:
    """Undo :func:`swap_to_meta`."""
    for table, name, t in swapped:
        table[name] = t


def to_empty_tied(model: nn.Module, device: str) -> None:
    """``model.to_empty(device=device)`` in place, a parameter held under several names (tied
    weights) kept one parameter: ``to_empty`` makes a new parameter per name, so a tied
    embedding and head became two (a simulated rank counted the tied weight twice).

    Args:
        model: the model (on ``meta``).
        device: where its empty tensors go.
    """
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            places.setdefault(id(p), []).append((m, name))
    model.to_empty(device=device)
    for where in places.values():
        if len(where) > 1:
            kept = getattr(*where[0])
            for m, name in where[1:]:
                setattr(m, name, kept)


def converted_copy(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor],
                   keep: dict[int, Any] | None = None) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are ``convert`` of the model's (to
    ``meta``, or to fake CPU tensors with :func:`to_fake`): a model to run a training step on
    shape-only, which an optimizer can step (``torch.func.functional_call``, which
    :func:`flopscope.count` uses, gives it no parameter objects). A tensor held under several
    names (tied weights) stays one tensor, and parameters stay parameters with their
    ``requires_grad`` (``module.to("meta")`` unties weights: it makes a new parameter per name).
    No tensor memory is copied; the model itself is not changed."""
    memo: dict[int, Any] = dict(keep) if keep else {}
    for m in model.modules():
        for t in [*m._parameters.values(), *m._buffers.values()]:
            if t is None or id(t) in memo:
                continue
            made = convert(t.detach())
            if isinstance(t, nn.Parameter):
                made = nn.Parameter(made, requires_grad=t.requires_grad)
            memo[id(t)] = made
    return copy.deepcopy(model, memo)  # each tensor in ``memo`` is taken as its own copy


def meta_twin(model: nn.Module, keep: dict[int, Any] | None = None) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are ``meta`` tensors of the same
    shapes, strides, dtypes and ``requires_grad`` (tied weights stay tied); nothing of the
    model is touched.

    Args:
        model: the model.
        keep: ``id(object) -> object`` not to copy (an object the model refers to, such as a
            monitor hooked onto it, stays itself in the copy).

    Returns:
        The copy.
    """
    return converted_copy(model, lambda t: t.to("meta"), keep)


def to_fake(fake_mode: Any, t: torch.Tensor) -> torch.Tensor:
    """``t`` as a fake tensor of ``fake_mode``: a ``meta`` tensor as a fake CPU tensor of the same
    metadata, any other as itself (memoized by the mode's converter: the same fake each time). A
    sparse tensor keeps its number of stored entries (see :func:`meta_sparse`)."""
    if is_sparse(t):
        return sparse_fake(fake_mode, t)
    if t.is_meta:
        return fake_mode.fake_tensor_converter.from_meta_and_device(  # type: ignore[no-any-return]
            fake_mode, t, _CPU
        )
    return fake_mode.from_tensor(t)  # type: ignore[no-any-return]


def fake_input(fake_mode: Any, t: torch.Tensor) -> torch.Tensor:
    """An input of a shape-only run on fake tensors of ``fake_mode``: :func:`to_fake`, save a
    tensor that holds sizes (:func:`~flopscope.execution.meta.holds_sizes`), which stays itself
    (a C++ kernel reads its memory: the packed LSTM its batch sizes) and is a constant to the
    mode (where Python reads it: ``batch_sizes[0]``)."""
    if not holds_sizes(t):
        return to_fake(fake_mode, t)
    return constant_input(fake_mode, t)


def fake_mode_for(meta_model: nn.Module | None,
               given: Any = None) -> tuple[Any, dict[str, torch.Tensor] | None]:
    """A FakeTensorMode for shape-only counting, and for a model on ``meta`` its fake parameters.

    A ``meta`` model that holds a module with a device-chosen fast path (see ``flopscope.execution.meta``)
    is run as if it were on the CPU: it is called through ``torch.func.functional_call`` with fake
    CPU tensors in place of its meta parameters and buffers (put back on return; the model is not
    modified). Other ``meta`` models run on ``meta`` itself, which is faster.
    """
    fake_mode = given if given is not None else ShapeOnlyFakeMode(allow_non_fake_inputs=True)
    if meta_model is None:
        return fake_mode, None
    fake_params: dict[str, torch.Tensor] = {}
    for name, t in [*meta_model.named_parameters(remove_duplicate=False),
                    *meta_model.named_buffers(remove_duplicate=False)]:
        fake = to_fake(fake_mode, t)  # memoized: a tied weight stays one tensor
        if isinstance(t, nn.Parameter) and t.requires_grad and fake.is_leaf:
            fake.requires_grad_(True)
        fake_params[name] = fake
    return fake_mode, fake_params


