"""Repeated decoder layers: a rank's figures at its full layer count from three small counts.

A decoder's layers are alike (the same modules, shapes and attributes but their own index), so a
simulated rank with ``n`` of them runs, per layer, the same operators on the same shapes: what
differs between ``n`` and ``n + 1`` layers is one more layer's worth of work in the middle of the
stack. The first and last ``width`` layers may differ from the rest (FSDP2's backward prefetch:
each layer's backward gathers the parameters of the one backward runs next; the first layer,
last in backward, gathers none, and the last is gathered from the head's backward), and some
figures outside the layers grow with the count (a root module's
parameters, the gradients' reduction).

So a rank is counted at three small layer counts ``n, n + 1, n + 2``, and its report at any
count ``N`` is built from the first two:

- every record (operator, collective, module, parameter table entry) of a *middle* layer (not
  among the first or last ``width``) must be the same in every middle layer, and the middle
  layers' records must come in one run per direction (forward in ascending order, backward in
  descending), so the report at ``N`` repeats them for the middle layers ``width .. N-width-1``
  in that order;
- every other record (the boundary layers', renumbered from the stack's end; those outside the
  layers) is affine in the count: ``v(N) = v(n+1) + (N - n - 1) (v(n+1) - v(n))``;
- the report built this way for ``n + 2`` must equal the one counted there, record for record and
  in order; otherwise :class:`NotRepeating` is raised and the caller counts every layer.

:func:`flopscope.distributed.repeat_peak.extrapolate_peak` does the same for the live bytes at every operator call (a memory
tracker's :class:`~flopscope.estimate.memory.CallPoint`): at a call inside a middle layer ``j``
they are affine in ``j`` and in the count (``c + p j + q N``), elsewhere affine in the count, so
the peak at ``N`` is the largest of these affine functions, each at its best layer (an end of the
middle range), ties going to the earliest call as the tracker's own peak does.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from flopscope.cost import Cost
from flopscope.report.records import CommRecord, RuleRecord
from flopscope.report.report import Report

__all__ = ["LAYER_PATHS", "SMALL", "WIDTH", "Frame", "NotRepeating", "alike", "cut_copy",
           "expand_report", "from_small", "layer_class", "layer_list", "layer_of", "layer_path",
           "layers_in", "line", "move_layers", "truncate"]

#: where a transformers model keeps its decoder layers, tried in order
LAYER_PATHS = ("model.layers", "layers", "model.decoder.layers", "transformer.h")

T = TypeVar("T")

#: layers at each end of a stack that are not taken as repeated (FSDP2's first and last)
WIDTH = 1
#: layer counts of the three small runs (two to build from, one to check)
SMALL = (2 * WIDTH + 1, 2 * WIDTH + 2, 2 * WIDTH + 3)

Build = Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]


class NotRepeating(ValueError):
    """The small counts do not show one repeated layer (a record that is not the same in every
    middle layer, a figure that is not affine in the layer count, or the check at the third
    count failed): count every layer instead."""


@dataclass(frozen=True)
class Frame:
    """Where a counted stack of layers sits in module paths.

    Attributes:
        prefix: the path of the layer container (``model.layers``).
        first: the index in paths of the stack's first layer (a pipeline stage's first layer).
        n: layers in the stack.
    """

    prefix: str
    first: int
    n: int


def line(a: int, b: int, n_b: int, n: int) -> int:
    """The affine value at ``n`` from ``a`` at ``n_b - 1`` and ``b`` at ``n_b``."""
    return b + (n - n_b) * (b - a)


def layers_in(container: nn.ModuleList | nn.ModuleDict) -> list[nn.Module]:
    """The layers of a :func:`layer_list` container, in order (a pipeline stage keeps its
    layers in a ``ModuleDict`` keyed by their indices)."""
    return list(container.values() if isinstance(container, nn.ModuleDict) else container)


def layer_list(model: nn.Module) -> tuple[str, nn.ModuleList | nn.ModuleDict] | None:
    """The model's decoder layers: (their container's path, the container), or ``None``.

    At one of :data:`LAYER_PATHS`; else the shallowest ``ModuleList`` (or ``ModuleDict``, a
    pipeline stage's) holding as many modules as the config's ``num_hidden_layers`` (of the
    model's config or its text config: GPT-NeoX's ``gpt_neox.layers``, MPT's
    ``transformer.blocks``), so a decoder is found by its structure, not its attribute names.
    """
    for path in LAYER_PATHS:
        try:
            found = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(found, (nn.ModuleList, nn.ModuleDict)):
            return path, found
    config = getattr(model, "config", None)
    count = getattr(config, "num_hidden_layers", None) or getattr(
        getattr(config, "text_config", None), "num_hidden_layers", None)
    if not isinstance(count, int) or count < 1:
        return None
    lists = [(path, m) for path, m in model.named_modules()
             if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m) == count]
    return min(lists, key=lambda pm: pm[0].count("."), default=None)


def _attributes(module: nn.Module) -> dict[str, Hashable]:
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None), tuple))}


def alike(layers: Sequence[nn.Module]) -> bool:
    """Whether the layers are alike: the same module types at the same paths, the same
    parameter and buffer shapes and dtypes, the same plain attributes, but for an attribute that
    holds each layer's own index in every layer (transformers' ``layer_idx``).

    Args:
        layers: the decoder layers, in order.

    Returns:
        ``True`` when they are alike.
    """
    def shape(layer: nn.Module) -> tuple[Any, ...]:
        return (tuple((n, type(m).__name__) for n, m in layer.named_modules()),
                tuple((n, tuple(p.shape), p.dtype, p.requires_grad)
                      for n, p in layer.named_parameters()),
                tuple((n, tuple(b.shape), b.dtype) for n, b in layer.named_buffers()))

    if len(layers) < 2:
        return True
    first = shape(layers[0])
    if any(shape(layer) != first for layer in layers[1:]):
        return False
    per_layer = [{n: _attributes(m) for n, m in layer.named_modules()} for layer in layers]
    for name, attrs in per_layer[0].items():
        for key in attrs:
            values = [p.get(name, {}).get(key) for p in per_layer]
            own_index = all(v == i for i, v in enumerate(values))
            if not own_index and any(v != values[0] for v in values):
                return False
    return True


def truncate(model: nn.Module, n: int) -> nn.Module:
    """Keep the model's first ``n`` decoder layers (in place; the config's layer count and
    per-layer lists follow).

    Args:
        model: a model with a layer container (:data:`LAYER_PATHS`).
        n: layers to keep.

    Returns:
        ``model``.

    Raises:
        NotRepeating: no layer container, or fewer than ``n`` layers.
    """
    found = layer_list(model)
    if found is None or len(found[1]) < n:
        raise NotRepeating("no decoder layer list of that length")
    path, layers = found
    kept = layers_in(layers)[:n]
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, nn.ModuleList(kept))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "num_hidden_layers"):
        config.num_hidden_layers = n
        for key in ("layer_types", "sliding_window_pattern_list"):
            value = getattr(config, key, None)
            if isinstance(value, list):
                setattr(config, key, value[:n])
    return model


def cut_copy(model: nn.Module, n: int) -> nn.Module:
    """A deep copy of ``model`` with its first ``n`` decoder layers (:func:`truncate`); the
    model itself is left as it was, and its other layers are not copied.

    Args:
        model: a model with a layer container (:data:`LAYER_PATHS`).
        n: layers to keep.

    Returns:
        The copy.

    Raises:
        NotRepeating: no layer container, or fewer than ``n`` layers.
    """
    found = layer_list(model)
    if found is None or len(found[1]) < n:
        raise NotRepeating("no decoder layer list of that length")
    skipped = list(found[1].children())[n:]
    memo: dict[int, Any] = {id(layer): nn.Identity() for layer in skipped}
    return truncate(copy.deepcopy(model, memo), n)


# -- reports ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    """How to take one kind of report item apart and put it back together."""

    path: Callable[[Any], str]
    key: Callable[[Any], Hashable]
    values: Callable[[Any], tuple[int, ...]]
    make: Callable[[Any, str, tuple[int, ...]], Any]


def _cost(c: Cost) -> tuple[int, ...]:
    return (c.macs, c.flops, c.bytes_read, c.bytes_written)


_OP = _Kind(lambda r: r.module, lambda r: (r.op, r.phase, r.counted, r.decomposed),
            lambda r: (r.calls, *_cost(r.cost)),
            lambda r, p, v: dataclasses.replace(r, module=p, calls=v[0], cost=Cost(*v[1:])))
_COMM = _Kind(lambda r: r.module, lambda r: (r.phase, r.kind, r.group_size, r.group),
              lambda r: (r.calls, r.payload_bytes, r.bus_bytes),
              lambda r, p, v: CommRecord(p, r.phase, r.kind, r.group_size, v[0], v[1], v[2],
                                         r.group))
_RULE = _Kind(lambda r: r.module, lambda r: (r.rule, r.macs_only),
              lambda r: (r.calls, *_cost(r.cost), *_cost(r.shadowed)),
              lambda r, p, v: RuleRecord(p, r.rule, v[0], Cost(*v[1:5]), Cost(*v[5:]),
                                         r.macs_only))
_PATH = _Kind(lambda p: p, lambda p: None, lambda p: (), lambda p, q, v: q)
_MODULE = _Kind(lambda kv: kv[0], lambda kv: kv[1][0], lambda kv: (kv[1][1],),
                lambda kv, p, v: (p, (kv[1][0], v[0])))
_PARAMS = _Kind(lambda kv: kv[0], lambda kv: None,
                lambda kv: tuple(getattr(kv[1], f.name) for f in dataclasses.fields(kv[1])),
                lambda kv, p, v: (p, type(kv[1])(*v)))


def layer_of(path: str, frame: Frame) -> tuple[int | None, str]:
    """Where a module path is in a stack of layers.

    Args:
        path: a module path.
        frame: the stack.

    Returns:
        (the layer's index in the stack, the path below it), or (``None``, the path).
    """
    head = frame.prefix + "."
    if not path.startswith(head):
        return None, path
    index, dot, rest = path[len(head):].partition(".")
    if not index.isdigit() or not 0 <= int(index) - frame.first < frame.n:
        return None, path
    return int(index) - frame.first, dot + rest


def layer_class(i: int | None, frame: Frame, width: int) -> tuple[str, int]:
    """A layer's class.

    Args:
        i: its index in the stack (``None``: not a layer).
        frame: the stack.
        width: layers at each end of the stack that are not repeated.

    Returns:
        ``("S", k)`` (k-th from the start), ``("E", k)`` (k-th from the end), ``("M", 0)`` (a
        middle layer), ``("-", 0)`` (not a layer).
    """
    if i is None:
        return "-", 0
    if i < width:
        return "S", i
    if i >= frame.n - width:
        return "E", frame.n - 1 - i
    return "M", 0


def layer_path(place: tuple[str, int], rest: str, path: str, frame: Frame, j: int = 0) -> str:
    """The module path of a layer's module in another stack.

    Args:
        place: the layer's class (:func:`layer_class`).
        rest: the path below the layer.
        path: the path itself (returned for ``-``: not a layer).
        frame: the stack.
        j: the index of a middle layer.

    Returns:
        The path.
    """
    kind, k = place
    if kind == "-":
        return path
    i = k if kind == "S" else frame.n - 1 - k if kind == "E" else j
    return f"{frame.prefix}.{frame.first + i}{rest}"


def _normal(items: Sequence[T], kind: _Kind, frame: Frame, width: int
            ) -> dict[Hashable, tuple[int, ...]]:
    """Normalised key -> values; the middle layers' items must agree."""
    out: dict[Hashable, tuple[int, ...]] = {}
    for item in items:
        i, rest = layer_of(kind.path(item), frame)
        place = layer_class(i, frame, width)
        key = (place, rest, kind.key(item))
        values = kind.values(item)
        if out.setdefault(key, values) != values:
            raise NotRepeating(f"{kind.path(item)}: not the same in every middle layer")
    return out


def _expand(a: Sequence[T], fa: Frame, b: Sequence[T], fb: Frame, to: Frame, width: int,
            kind: _Kind) -> list[T]:
    """``b``'s items at ``to.n`` layers (see the module's docstring)."""
    na, nb = _normal(a, kind, fa, width), _normal(b, kind, fb, width)
    if na.keys() != nb.keys():
        raise NotRepeating("the small counts have different records")
    groups: list[tuple[int | None, list[T]]] = []
    for item in b:
        i, _ = layer_of(kind.path(item), fb)
        if groups and groups[-1][0] == i:
            groups[-1][1].append(item)
        else:
            groups.append((i, [item]))
    middle = list(range(width, fb.n - width))
    out: list[T] = []
    g = 0
    while g < len(groups):
        i, items = groups[g]
        if i is None or not width <= i < fb.n - width:
            for item in items:
                j, rest = layer_of(kind.path(item), fb)
                place = layer_class(j, fb, width)
                vb = kind.values(item)
                va = na[(place, rest, kind.key(item))]
                v = tuple(line(x, y, fb.n, to.n) for x, y in zip(va, vb, strict=True))
                if any(x < 0 for x in v):
                    raise NotRepeating(f"{kind.path(item)}: a figure that shrinks per layer")
                out.append(kind.make(item, layer_path(place, rest, kind.path(item), to), v))
            g += 1
            continue
        run = [x[0] for x in groups[g:g + len(middle)]]
        if run == middle:
            order = range(width, to.n - width)
        elif run == middle[::-1]:
            order = range(to.n - width - 1, width - 1, -1)
        else:
            raise NotRepeating("the middle layers' records are not one run per direction")
        template = [(layer_of(kind.path(x), fb)[1], x) for x in items]
        for _, other in groups[g + 1:g + len(middle)]:
            if [(layer_of(kind.path(x), fb)[1], kind.key(x), kind.values(x)) for x in other] != \
                    [(r, kind.key(x), kind.values(x)) for r, x in template]:
                raise NotRepeating("the middle layers' records differ")
        for j in order:
            out += [kind.make(x, f"{to.prefix}.{to.first + j}{r}", kind.values(x))
                    for r, x in template]
        g += len(middle)
    return out


def expand_report(a: Report, fa: Frame, b: Report, fb: Frame, to: Frame, width: int) -> Report:
    """``b`` at ``to.n`` layers: its middle layers repeated, the rest extrapolated from ``a``
    (one layer fewer) and ``b`` (see the module's docstring).

    Args:
        a: the report at ``fa.n`` layers.
        fa: where ``a``'s layers are.
        b: the report at ``fb.n = fa.n + 1`` layers (at least two middle layers).
        fb: where ``b``'s layers are.
        to: the layer count (and place) to build.
        width: layers at each end of the stack that are not repeated.

    Returns:
        The report.

    Raises:
        NotRepeating: the two reports do not show one repeated layer.
    """
    if fb.n != fa.n + 1 or fa.n < 2 * width + 1 or fb.n < 2 * width + 2 or to.n < 2 * width + 1:
        raise NotRepeating("layer counts too small for the boundary width")
    if a.sections or b.sections:
        raise NotRepeating("reports with sections are not extrapolated")

    def each(x: Iterable[T], y: Iterable[T], kind: _Kind) -> list[T]:
        return _expand(list(x), fa, list(y), fb, to, width, kind)

    return dataclasses.replace(
        b,
        modules=dict(each(a.modules.items(), b.modules.items(), _MODULE)),
        module_params=dict(each(a.module_params.items(), b.module_params.items(), _PARAMS)),
        records=tuple(each(a.records, b.records, _OP)),
        rules=tuple(each(a.rules, b.rules, _RULE)),
        opaque=tuple(each(a.opaque, b.opaque, _PATH)),
        communication=tuple(each(a.communication, b.communication, _COMM)),
        logical=tuple(each(a.logical, b.logical, _OP)),
        replicated=tuple(each(a.replicated, b.replicated, _OP)),
    )


def move_layers(report: Report, frm: Frame, to: Frame) -> Report:
    """The report with its stack of layers renumbered: layer ``frm.first + i`` becomes
    ``to.first + i`` in every module path (a pipeline stage counted at another place).

    Args:
        report: the report.
        frm: where its layers are.
        to: where they go (as many layers).

    Returns:
        The report, renamed.
    """
    def each(items: Iterable[T], kind: _Kind) -> list[T]:
        out = []
        for item in items:
            i, rest = layer_of(kind.path(item), frm)
            out.append(item if i is None else kind.make(item, f"{to.prefix}.{to.first + i}{rest}",
                                                        kind.values(item)))
        return out

    return dataclasses.replace(
        report, modules=dict(each(report.modules.items(), _MODULE)),
        module_params=dict(each(report.module_params.items(), _PARAMS)),
        records=tuple(each(report.records, _OP)), rules=tuple(each(report.rules, _RULE)),
        opaque=tuple(each(report.opaque, _PATH)),
        communication=tuple(each(report.communication, _COMM)),
        logical=tuple(each(report.logical, _OP)), replicated=tuple(each(report.replicated, _OP)))


def from_small(build: Build, run: Callable[[Build], Report]) -> Report:
    """A rank's report from three runs of its model cut to :data:`SMALL` layers: the first two
    put together at the model's own layer count, the third the check (see the module's
    docstring).

    Args:
        build: returns ``(model, args, kwargs)``, the whole model (on ``meta``).
        run: counts the rank from a build function.

    Returns:
        The report at the model's layer count.

    Raises:
        NotRepeating: the layers are not alike, too few to gain from it, or the small runs do
            not show one repeated layer.
    """
    model, args, kwargs = build()
    found = layer_list(model)
    if found is None or len(found[1]) <= sum(SMALL) or not alike(list(found[1].children())):
        raise NotRepeating("no long stack of alike decoder layers")
    prefix, total = found[0], len(found[1])
    # built once: each small run takes a copy of the model cut to the largest small count
    template = (cut_copy(model, SMALL[-1]), args, kwargs)
    reports = []
    for n in SMALL:
        def small(n: int = n) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
            m, a, k = copy.deepcopy(template)
            return truncate(m, n), a, k
        reports.append(run(small))
    a, b, c = reports
    fa, fb, fc = (Frame(prefix, 0, n) for n in SMALL)
    if expand_report(a, fa, b, fb, fc, WIDTH) != c:
        raise NotRepeating("the put-together report differs from the simulated one")
    return expand_report(a, fa, b, fb, Frame(prefix, 0, total), WIDTH)
