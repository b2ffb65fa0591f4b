"""The peak of live bytes of a run at any layer count, from the calls of small runs
(:mod:`flopscope.distributed.repeat`).

At a call inside a middle layer ``j`` of a stack of ``n`` alike layers the live bytes are affine
in ``j`` and in ``n`` (``c + p j + q n``: the activations of the layers before it, the gradients
of those after it), elsewhere affine in ``n``; so the peak at ``N`` layers is the largest of
these affine functions, each at its best layer (an end of the middle range), ties going to the
earliest call as a memory tracker's own peak does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flopscope.distributed.repeat import Frame, NotRepeating, layer_class, layer_of, layer_path

__all__ = ["Peak", "Point", "extrapolate_peak"]


@dataclass(frozen=True)
class Peak:
    """The largest of a run's call points.

    Attributes:
        total: bytes live.
        module: the call's module path.
        phase: its phase.
        op: its operator.
        live: category -> bytes live then.
    """

    total: int
    module: str
    phase: str
    op: str
    live: dict[str, int]


#: a call point: (module path, phase, operator, category -> bytes live)
Point = tuple[str, str, str, Mapping[str, int]]
#: a call's place: (layer class, path below the layer or the path, phase, operator, occurrence)
_Key = tuple[tuple[str, int], str, str, str, int]


_Class = tuple[tuple[str, int], str, str, str]


def _points(points: Sequence[Point], frame: Frame, width: int, cats: Sequence[str]
            ) -> dict[_Class, list[tuple[int, tuple[int, ...]]]]:
    """Each kind of call (layer class, path below the layer, phase, operator) -> its calls in
    order: (the middle layer, -1 elsewhere; (time, total, bytes per category)).

    Only the calls at which the live bytes rose are kept: a call that holds no more than the
    one before it is never the first to reach the peak (a view, a detach, an in-place update;
    FSDP2 runs some of these at the root once per layer)."""
    out: dict[_Class, list[tuple[int, tuple[int, ...]]]] = {}
    before = -1
    for t, (module, phase, op, live) in enumerate(points):
        total = sum(live.values())
        rose, before = total > before, total
        if not rose:
            continue
        i, rest = layer_of(module, frame)
        place = layer_class(i, frame, width)
        layer = i if place[0] == "M" and i is not None else -1
        out.setdefault((place, rest, phase, op), []).append(
            (layer, (t, total, *(live.get(c, 0) for c in cats))))
    return out


def _keyed(runs: Sequence[tuple[Mapping[_Class, list[tuple[int, tuple[int, ...]]]], int]],
           width: int) -> list[dict[_Key, dict[int, tuple[int, ...]]]]:
    """Each call's place -> {middle layer (-1 elsewhere): figures}, in each run (``runs``: the
    kinds of calls and the layer count of each, one layer apart): the k-th call of its kind in
    its layer (in the run, outside the layers). A kind outside the layers with ``d`` more calls
    per layer (FSDP2's reduction of each layer's gradients at a pipeline stage's root) is split
    into a head, ``d`` calls per middle layer and a tail: the first split (shortest head) whose
    calls are affine in the layer and in the count in every run; with two runs that is
    under-determined, so it must be the only one, with three (the third has three middle
    layers) several may fit, as when the layers' calls and their neighbours' are all affine."""
    first = runs[0][0]
    if any(r.keys() != first.keys() for r, _ in runs):
        raise NotRepeating("the small runs' calls do not correspond")
    out: list[dict[_Key, dict[int, tuple[int, ...]]]] = [{} for _ in runs]
    for cls in first:
        calls = [r[cls] for r, _ in runs]
        extra = len(calls[1]) - len(calls[0])
        if any(len(y) - len(x) != extra for x, y in zip(calls[1:], calls[2:], strict=False)):
            raise NotRepeating(f"{cls[1]} {cls[3]}: calls not affine in the layer count")
        if cls[0][0] == "M" or extra == 0:
            for each, keyed in zip(calls, out, strict=True):
                seen: dict[int, int] = {}
                for layer, v in each:
                    k = seen[layer] = seen.get(layer, -1) + 1
                    keyed.setdefault((*cls, k), {})[layer] = v
            continue
        ends = len(calls[0]) - extra * (runs[0][1] - 2 * width)
        if extra < 0 or ends < 0:
            raise NotRepeating(f"{cls[1]} {cls[3]}: calls not repeated per layer")
        found = []
        for head in range(ends + 1):
            try:
                split = [_split(c, head, ends - head, extra, width) for c in calls]
                for key in split[0]:
                    fits = [_affine(split[i][key], split[i + 1][key], width)
                            for i in range(len(split) - 1)]
                    if any(f[1:] != fits[0][1:] for f in fits[1:]):  # slope, per layer
                        raise NotRepeating("not affine in the count")
            except (NotRepeating, KeyError):
                continue
            found.append(split)
        if not found or (len(runs) < 3 and len(found) > 1):
            raise NotRepeating(f"{cls[1]} {cls[3]}: no single split of the calls per layer")
        for sp, keyed in zip(found[0], out, strict=True):
            for (tag, k), values in sp.items():
                keyed[((tag, extra), cls[1], cls[2], cls[3], k)] = values
    return out


def _split(calls: Sequence[tuple[int, tuple[int, ...]]], head: int, tail: int, per: int,
           width: int) -> dict[tuple[str, int], dict[int, tuple[int, ...]]]:
    """A kind's calls as a head, ``per`` calls per middle layer (from ``width``) and a tail."""
    out: dict[tuple[str, int], dict[int, tuple[int, ...]]] = {}
    for k, (_, v) in enumerate(calls[:head]):
        out[("H", k)] = {-1: v}
    middle = calls[head:len(calls) - tail]
    for k, (_, v) in enumerate(middle):
        out.setdefault(("R", k % per), {})[width + k // per] = v
    for k, (_, v) in enumerate(calls[len(calls) - tail:]):
        out[("T", tail - k)] = {-1: v}
    return out


def _affine(a: Mapping[int, tuple[int, ...]], b: Mapping[int, tuple[int, ...]], width: int
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A call's figures as ``base + slope (j - width) + per_n (n - n_b)`` for middle layer
    ``j`` (``slope`` 0 outside the middle layers), from the runs at ``n_b - 1`` and ``n_b``
    layers; checked against every middle layer of both."""
    if -1 in b:
        base = b[-1]
        return base, (0,) * len(base), tuple(y - x for x, y in zip(a[-1], base, strict=True))
    if -1 in a or width not in a or not {width, width + 1} <= b.keys():
        raise NotRepeating("a call not in every middle layer")
    base, first_a = b[width], a[width]
    slope = tuple(y - x for x, y in zip(base, b[width + 1], strict=True))
    for start, run in ((base, b), (first_a, a)):
        for j, v in run.items():
            if v != tuple(x + (j - width) * s for x, s in zip(start, slope, strict=True)):
                raise NotRepeating("live bytes not affine in the layer")
    return base, slope, tuple(y - x for x, y in zip(first_a, base, strict=True))


def extrapolate_peak(a: Sequence[Point], fa: Frame, b: Sequence[Point], fb: Frame, to: Frame,
                     width: int, c: tuple[Sequence[Point], Frame] | None = None) -> Peak:
    """The peak of live bytes over the calls of a run at ``to.n`` layers, from the call points of
    runs at ``fa.n`` and ``fb.n = fa.n + 1`` (see the module's docstring); ties go to the
    earliest call, as a memory tracker's own peak does.

    Args:
        a: the call points at ``fa.n`` layers, in order.
        fa: where ``a``'s layers are.
        b: at ``fb.n``.
        fb: where ``b``'s layers are.
        to: the layer count (and place) to evaluate at.
        width: layers at each end of the stack that are not repeated.
        c: the call points of a third run (one layer more than ``b``) and its frame: where
            calls outside the layers repeat per layer, the split of them that all three runs
            agree on is taken (without it, such calls are refused).

    Returns:
        The :class:`Peak`.

    Raises:
        NotRepeating: the calls do not correspond, or their live bytes are not affine.
    """
    cats = sorted({c for p in (*a, *b) for c in p[3]})
    runs = [(_points(a, fa, width, cats), fa.n), (_points(b, fb, width, cats), fb.n)]
    if c is not None:
        runs.append((_points(c[0], c[1], width, cats), c[1].n))
    pa, pb = _keyed(runs, width)[:2]
    if pa.keys() != pb.keys() or not pb:
        raise NotRepeating("the small runs' calls do not correspond")
    best: tuple[tuple[int, int], _Key, int, tuple[int, ...]] | None = None
    for key, values in pb.items():
        base, slope, per_n = _affine(pa[key], values, width)
        at_n = tuple(x + (to.n - fb.n) * q for x, q in zip(base, per_n, strict=True))
        j = -1
        if -1 not in values:  # a middle layer: the best is at an end of the middle range
            up = slope[1] > 0 or (slope[1] == 0 and slope[0] < 0)  # higher, or as high sooner
            j = to.n - width - 1 if up else width
        v = tuple(x + (j - width) * s for x, s in zip(at_n, slope, strict=True)) if j >= 0 \
            else at_n
        if best is None or (v[1], -v[0]) > best[0]:
            best = ((v[1], -v[0]), key, j, v)
    assert best is not None
    _, (place, rest, phase, op, _), j, v = best
    if place[0] == "M":
        module = f"{to.prefix}.{to.first + j}{rest}"
    else:  # a boundary layer's call (renumbered from the end), or one outside the layers
        module = layer_path(place, rest, rest, to) if place[0] in ("S", "E") else rest
    return Peak(v[1], module, phase, op, dict(zip(cats, v[2:], strict=True)))
