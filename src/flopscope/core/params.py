"""Parameter and buffer counts of a model, per module: own and inclusive, each tensor once.

Quantized modules (``torch.ao.nn.quantized``: ``Conv2d``, ``Linear``, ``Embedding``, their
dynamic and fused forms) keep their weights and biases in packed-parameter objects
(``torch.classes.quantized.*PackedParamsBase``), not in ``nn.Parameter``s; those are unpacked and
counted as parameters of the module that holds the packed object (for ``Linear`` and
``Embedding``, their ``_packed_params`` child), as frozen (they do not train), each packed
object once however many modules hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

__all__ = ["ParamStats", "count_params", "packed_objects", "param_table", "uninitialized"]


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
    return param_table(model)[0]


def param_table(
    model: nn.Module, named: list[tuple[str, nn.Module]] | None = None
) -> tuple[dict[str, ParamStats], dict[int, str]]:
    """:func:`count_params`, and the path of every parameter's owner (by ``id`` of the parameter).

    Linear in the number of modules and tensors: in a plain tree (no module reachable twice, no
    tensor registered twice) a module's inclusive counts are its own plus its children's; where
    something is shared, each module's distinct tensors are gathered as id-keyed dicts instead.

    Args:
        model: the model.
        named: ``list(model.named_modules())`` if the caller already has it.
    """
    if named is None:
        named = list(model.named_modules())
    unpacked: dict[int, list[Tensor]] = {}  # id(packed object) -> its weight and bias, once
    owner: dict[int, str] = {}
    direct: dict[int, tuple[int, int, int]] = {}  # id(module) -> own trainable, frozen, buffers
    edges = 0
    shared = False
    own_of: list[int] = []
    seen_buffers: set[int] = set()
    for path, module in named:
        own = trainable = frozen = buffers = 0
        for p in module._parameters.values():
            if p is None:
                continue
            pid = id(p)
            if pid in owner:  # tied: the first module in named_modules() order owns it
                shared = True
                continue
            owner[pid] = path
            n = _size(p)
            own += n
            if p.requires_grad:
                trainable += n
            else:
                frozen += n
        for obj in packed_objects(module):
            pid = id(obj)
            if pid in owner:
                shared = True
                continue
            owner[pid] = path
            n = sum(t.numel() for t in _unpack(obj, unpacked))
            own += n
            frozen += n
        for b in module._buffers.values():
            if b is not None:
                if id(b) in seen_buffers:  # one buffer registered on two modules
                    shared = True
                seen_buffers.add(id(b))
                buffers += _size(b)
        direct[id(module)] = (trainable, frozen, buffers)
        own_of.append(own)
        edges += sum(1 for c in module._modules.values() if c is not None)
    if shared or edges != len(named) - 1:
        return _shared_table(named, own_of, unpacked), owner

    totals: dict[int, tuple[int, int, int]] = {}
    for _, module in reversed(named):  # children come after their parent in named_modules()
        t, f, nb = direct[id(module)]
        for c in module._modules.values():
            if c is not None:
                ct, cf, cb = totals[id(c)]
                t, f, nb = t + ct, f + cf, nb + cb
        totals[id(module)] = (t, f, nb)
    stats = {}
    for (path, module), own in zip(named, own_of, strict=True):
        t, f, nb = totals[id(module)]
        stats[path] = ParamStats(own=own, inclusive=t + f, trainable=t, frozen=f, buffers=nb)
    return stats, owner


_PACKED = "__torch__.torch.classes.quantized."
_CELL = "__torch__.torch.classes.rnn.CellParamsBase"


def packed_objects(module: nn.Module) -> list[Any]:
    """The quantized packed-parameter objects held directly by ``module``: attributes that are
    ``torch.classes.quantized`` script objects with an ``unpack`` method (linear, convolution,
    embedding packs), or a quantized recurrent layer's ``torch.classes.rnn.CellParamsBase`` (the
    ``param`` of a dynamic quantized LSTM/GRU's ``PackedParameter`` modules)."""
    found = []
    for value in module.__dict__.values():
        if isinstance(value, torch.ScriptObject):
            try:
                kind = value._type().qualified_name()
            except (AttributeError, RuntimeError):
                continue
            if (kind.startswith(_PACKED) and value._has_method("unpack")  # type: ignore[attr-defined]
                    or kind == _CELL):
                found.append(value)
    return found


def _unpack(obj: Any, cache: dict[int, list[Tensor]]) -> list[Tensor]:
    """The tensors of a packed-parameter object: ``unpack()`` gives (weight, bias) for convolution
    and linear packs, the weight alone for embeddings; a recurrent cell's parameters give its two
    weights and (when it has them) two biases. Unpacked once per object, with any dispatch mode
    (a running Counter) switched off, so unpacking is never counted as the model's work."""
    got = cache.get(id(obj))
    if got is None:
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            if obj._type().qualified_name() == _CELL:
                from flopscope.rules.quantized import cell_params

                value: Any = cell_params(obj)
            else:
                value = obj.unpack()
        items = value if isinstance(value, (tuple, list)) else (value,)
        got = cache[id(obj)] = [t for t in items if isinstance(t, Tensor)]
    return got


_Uninitialized = (UninitializedParameter, UninitializedBuffer)


def _size(t: Tensor) -> int:
    """Elements of a parameter or buffer; 0 for a lazy module's not yet initialised one (its
    size is known only after the first forward)."""
    return 0 if isinstance(t, _Uninitialized) else t.numel()


def uninitialized(model: nn.Module) -> list[str]:
    """Paths of the modules holding lazy parameters or buffers that are not initialised yet
    (``nn.LazyLinear`` and friends before their first forward)."""
    return [path for path, m in model.named_modules()
            if any(isinstance(t, _Uninitialized)
                   for t in (*m._parameters.values(), *m._buffers.values()))]


def _shared_table(
    named: list[tuple[str, nn.Module]], own_of: list[int], unpacked: dict[int, list[Tensor]]
) -> dict[str, ParamStats]:
    """Per-module counts where tensors or modules are shared: each subtree's distinct tensors."""
    subtree: dict[int, tuple[dict[int, Tensor], dict[int, Tensor]]] = {}

    def gather(module: nn.Module) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
        got = subtree.get(id(module))
        if got is None:
            params: dict[int, Tensor] = {
                id(p): p for p in module._parameters.values() if p is not None
            }
            for obj in packed_objects(module):
                params.update((id(t), t) for t in _unpack(obj, unpacked))
            bufs: dict[int, Tensor] = {id(b): b for b in module._buffers.values() if b is not None}
            for child in module._modules.values():
                if child is not None:
                    child_params, child_bufs = gather(child)
                    params.update(child_params)
                    bufs.update(child_bufs)
            got = subtree[id(module)] = (params, bufs)
        return got

    stats: dict[str, ParamStats] = {}
    for (path, module), own in zip(named, own_of, strict=True):
        params, bufs = gather(module)
        trainable = frozen = 0
        for p in params.values():
            if p.requires_grad:
                trainable += _size(p)
            else:
                frozen += _size(p)
        stats[path] = ParamStats(
            own=own,
            inclusive=trainable + frozen,
            trainable=trainable,
            frozen=frozen,
            buffers=sum(_size(b) for b in bufs.values()),
        )
    return stats
