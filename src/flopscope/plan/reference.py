"""What screening reads of a reference's small runs (:class:`Reference`; see
:mod:`flopscope.plan.screen`).

A role without stages is screened from two runs of it without stages, at 3 and at 4 decoder
layers (:data:`REFERENCE_LAYERS`). A pipeline stage is screened from two-stage pipelines of its
tensor-parallel degree, micro-batch, checkpointing and precision, one layer per stage (the
first and the last stage at :data:`PIPELINE_MICROBATCHES` microbatches, the last stage with one
more too, the first stage with two layers per stage too), and the middle stage of a three-stage
pipeline of one layer per stage at :data:`PIPELINE_MICROBATCHES` (what a middle stage holds, for
its peak memory; what each microbatch of the step adds to it is measured once per
tensor-parallel degree and precision: :class:`flopscope.plan.screen.Screen`): what a layer adds to a stage per step is the first stage of two layers less
that of one, what the stage outside its layers does is the rest, and what a microbatch adds is
the last stage at one microbatch more less the last stage (:meth:`Reference.stage_rows`,
:meth:`Reference.parameters`, :meth:`Reference.activations`, :meth:`Reference.received`; the
pipelines' collectives in :mod:`flopscope.plan.screen`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from flopscope.cost import Phase
from flopscope.distributed.repeat import NotRepeating
from flopscope.distributed.repeat_peak import Point
from flopscope.estimate.bound import Row
from flopscope.plan.layers import Small
from flopscope.plan.microbatches import extend_points

__all__ = ["EMBEDDING", "PER_STEP", "PIPELINE_MICROBATCHES", "REFERENCE_LAYERS", "Reference",
           "ACCUMULATE", "STORE", "accumulated", "gather_share", "lin", "once_a_step"]

#: the layer counts of a reference's two runs without stages
REFERENCE_LAYERS = (3, 4)
#: the microbatches of a reference pipeline's stages (and one more on the last stage)
PIPELINE_MICROBATCHES = 3
#: FSDP2's own operators (its gathers' copy in and out, the gradients' concatenation, the
#: gathered buffers' allocation): run per gather or reduction, not per microbatch's work
PER_STEP = ("fsdp.", "aten.empty.memory_format")
#: the module that runs on the first stage only (:class:`flopscope.distributed.pipeline.
#: DecoderStage`); the layers' parent's other modules and the root's run on the last
EMBEDDING = "model.embed_tokens"


def gather_share(phase: str, m: int, warmup: int) -> Fraction:
    """FSDP2's all-gathers of a layer in ``phase`` of a pipeline stage at ``m`` microbatches
    that runs ``warmup`` forwards before its first backward (1F1B: ``pp - stage``), over those
    of the reference pipeline's first stage (:data:`PIPELINE_MICROBATCHES` ``= M``, 2 forwards
    first).

    A layer's parameters are resharded after each forward and kept through a backward (the
    last excepted), so each of the first ``w = min(m, warmup)`` forwards gathers and a
    backward gathers when a forward ran since the backward before: ``w`` gathers in the
    forward, ``m + 1 - w`` in the backward, ``m + 1`` a step (the first stage of two at 8
    microbatches: 2 and 7; the last: 1 and 8). Another phase (recomputation) keeps the step's
    ``(m + 1) / (M + 1)``.

    Args:
        phase: the phase's name.
        m: the stage's microbatches.
        warmup: the forwards it runs before its first backward (``pp - stage``).

    Returns:
        The stage's gathers per layer over the reference first stage's.
    """
    big_m = PIPELINE_MICROBATCHES
    w, ref_w = min(m, warmup), min(big_m, 2)
    if phase == Phase.FORWARD.value:
        return Fraction(w, ref_w)
    if phase == Phase.BACKWARD.value:
        return Fraction(m + 1 - w, big_m + 1 - ref_w)
    return Fraction(m + 1, big_m + 1)


def lin(terms: Iterable[tuple[float, Row]]) -> Row:
    """``sum(c * row)`` field by field (integer fields rounded)."""
    sums: dict[str, float] = {}
    for c, row in terms:
        for f in dataclasses.fields(Row):
            sums[f.name] = sums.get(f.name, 0.0) + c * getattr(row, f.name)
    zero = Row()
    values: dict[str, Any] = {
        f.name: (round(sums.get(f.name, 0.0)) if isinstance(getattr(zero, f.name), int)
                 else sums.get(f.name, 0.0)) for f in dataclasses.fields(Row)}
    return Row(**values)


def _in_layers(module: str, layers: str) -> bool:
    return module.split("|")[-1].startswith(layers + ".")


def _before_head(points: Sequence[Point], layers: str) -> Mapping[str, int]:
    """Live bytes at the first forward call after the last layer's forward (the final norm)."""
    last = max((i for i, p in enumerate(points)
                if p[1] == Phase.FORWARD.value and p[0].startswith(layers + ".")), default=-1)
    for _, phase, _, live in points[last + 1:]:
        if phase == Phase.FORWARD.value:
            return live
    return points[-1][3] if points else {}


def _after_first_forward(points: Sequence[Point], layers: str) -> int:
    """A pipeline stage's activations at the first call after its first microbatch's layers'
    forward (what that microbatch keeps for its backward, with what the stage holds anyway)."""
    seen = False
    for module, phase, _, live in points:
        if _in_layers(module, layers):
            seen = seen or phase == Phase.FORWARD.value
        elif seen:
            return live.get("activations", 0)
    return points[-1][3].get("activations", 0) if points else 0


def _before_layers(points: Sequence[Point], layers: str) -> tuple[int, int]:
    """The activations the forward adds before the first layer: (the embedding's, the rest's),
    leaving out the root's own calls (FSDP2 gathering the root's parameters, once a step)."""
    embed = rest = 0
    before = None
    for module, phase, _, live in points:
        if phase == Phase.FORWARD.value and module.startswith(layers + "."):
            break
        now = live.get("activations", 0)
        if before is not None and module and phase == Phase.FORWARD.value:
            if module == EMBEDDING or module.startswith(EMBEDDING + "."):
                embed += now - before
            else:
                rest += now - before
        before = now
    return max(0, embed), max(0, rest)


def _split(run: Small, phase: str) -> tuple[Row, Row]:
    """A run's phase row as (the work per microbatch, FSDP2's own operators: :data:`PER_STEP`)."""
    ops = run.estimate.by_phase_op.get(phase, {})
    fsdp = lin((1, row) for op, row in ops.items() if op.startswith(PER_STEP))
    return lin([(1, run.estimate.by_phase.get(phase, Row())), (-1, fsdp)]), fsdp


def once_a_step(run: Small, phase: str) -> dict[str, float]:
    """The share of each operator's calls in ``phase`` that run once a step: the calls after
    the step's last backward call (FSDP2's gradient reduction at the end of the pipeline's
    schedule, for each of the stage's units: the gradients' division, their concatenation,
    the reduce-scatter, the views and the profiler's markers around it), by calls; operator
    -> share of its row."""
    points = run.points
    last = max((i for i, p in enumerate(points) if p[1] == Phase.BACKWARD.value), default=-1)
    if last < 0:
        return {}
    ops = run.estimate.by_phase_op.get(phase, {})
    tail: dict[str, int] = {}
    for _, p, op, _ in points[last + 1:]:
        if p == phase and op in ops and ops[op].calls:
            tail[op] = tail.get(op, 0) + 1
    return {op: n / ops[op].calls for op, n in tail.items()}


#: autograd's gradient accumulation into a parameter's ``.grad`` (``AccumulateGrad``): the
#: first microbatch's gradient is stored (:data:`STORE`, the tensor taken as it is), each later
#: one added in place (:data:`ACCUMULATE`); the backward formulas and the engine's sums of a
#: tensor's gradients are out of place
ACCUMULATE, STORE = "aten.add_.Tensor", "aten.detach.default"


def accumulated(run: Small, phase: str, microbatches: int) -> tuple[dict[str, float],
                                                                    dict[str, float]]:
    """The gradient accumulation in a run of ``microbatches`` microbatches as shares of each
    operator's calls in ``phase``: (the first microbatch's stores, one a parameter, once a
    step; the later microbatches' additions, ``m - 1`` a step): operator -> share of its row.
    Empty where the additions are not as many for each microbatch after the first."""
    ops = run.estimate.by_phase_op.get(phase, {})
    adds = ops[ACCUMULATE].calls if phase == Phase.BACKWARD.value and ACCUMULATE in ops else 0
    params, left = divmod(adds, microbatches - 1) if microbatches > 1 else (0, 1)
    if not adds or left:
        return {}, {}
    stores = ops[STORE].calls if STORE in ops else 0
    return ({STORE: params / stores} if 0 < params <= stores else {}), {ACCUMULATE: 1.0}


def _split_step(run: Small, phase: str) -> tuple[Row, Row, Row, Row]:
    """A reference pipeline stage's phase row (:data:`PIPELINE_MICROBATCHES` microbatches) as
    (the work per microbatch, FSDP2's own operators per gather: :data:`PER_STEP`, what runs
    once a step: :func:`once_a_step` and the first microbatch's gradient stores, what each
    microbatch after the first adds to the gradients: :func:`accumulated`)."""
    ops = run.estimate.by_phase_op.get(phase, {})
    share = once_a_step(run, phase)
    first, later = accumulated(run, phase, PIPELINE_MICROBATCHES)
    for op, f in first.items():
        share[op] = share.get(op, 0.0) + f
    once = lin((f, ops[op]) for op, f in share.items())
    adds = lin((f, ops[op]) for op, f in later.items())
    fsdp = lin((1 - share.get(op, 0.0) - later.get(op, 0.0), row) for op, row in ops.items()
               if op.startswith(PER_STEP))
    whole = run.estimate.by_phase.get(phase, Row())
    return lin([(1, whole), (-1, fsdp), (-1, once), (-1, adds)]), fsdp, once, adds


@dataclass(frozen=True)
class Reference:
    """A screened role's small runs and what screening reads of them: a role without stages
    from its runs at 3 and 4 layers (``a``, ``b``), a pipeline stage from its reference
    pipeline (``first`` ... ``first_two``).

    Args:
        layers: the decoder layers' module path (``model.layers``).
        embedding_share: the embedding's share of the parameters outside the layers (by
            element count, unsharded).
        dp: the runs' FSDP2 degree.
        a: the run with 3 layers (``None`` for a pipeline stage).
        b: the run with 4 layers.
        first: a pipeline's first stage: two stages of one layer, :data:`PIPELINE_MICROBATCHES`
            microbatches (``None`` for a role without stages).
        last: that pipeline's last stage.
        last_more: its last stage with one microbatch more.
        first_two: its first stage with two layers per stage (what a layer adds to a stage
            under the pipeline: its work, activations, and FSDP2's gathered parameters and
            unreduced gradients, which a pipeline keeps between microbatches).
        middle: the middle stage of a three-stage pipeline of one layer per stage at
            :data:`PIPELINE_MICROBATCHES` microbatches (two in flight, as ``first``): what a
            middle stage holds (no embedding, its received hidden states and gradients).
        per_step: what each microbatch of the step adds to the stage screened (a middle
            stage, or the first) at its peak, by category (:meth:`received`; measured by
            :class:`flopscope.plan.screen.Screen`).

    What it reads of its runs is read once (:meth:`activations`, :meth:`received`,
    :meth:`last_points`: kept with it; the runs are not changed after they are made), so a
    reference shared by a plan's roles (:class:`flopscope.plan.screen.Screen` keeps them) scans
    its runs' call points once, not once per role.
    """

    layers: str
    embedding_share: float
    dp: int
    a: Small | None = None
    b: Small | None = None
    first: Small | None = None
    last: Small | None = None
    last_more: Small | None = None
    first_two: Small | None = None
    middle: Small | None = None
    per_step: Mapping[str, int] | None = None
    _read: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False,
                                       compare=False)

    def _once(self, key: Hashable, read: Callable[[], Any]) -> Any:
        """``read()``, the first time ``key`` is asked for (then kept)."""
        if key not in self._read:
            self._read[key] = read()
        return self._read[key]

    def base(self) -> Small:
        """A run the screened role's hardware and report come from."""
        run = self.a or self.first
        if run is None:
            raise ValueError("a reference needs its runs")
        return run

    def pipeline(self) -> tuple[Small, Small, Small, Small]:
        """The reference pipeline's runs (first, last, last with one more microbatch, first
        with two layers)."""
        if not (self.first and self.last and self.last_more and self.first_two):
            raise ValueError("a pipeline stage's reference needs its pipeline runs")
        return self.first, self.last, self.last_more, self.first_two

    def middle_run(self) -> Small:
        """The reference pipeline's middle stage (:attr:`middle`)."""
        if self.middle is None:
            raise ValueError("a middle stage's reference needs its middle-stage run")
        return self.middle

    def received(self) -> tuple[int, Mapping[str, int]]:
        """What the middle stage (:attr:`middle`) holds outside its layers: (per microbatch in
        flight: the hidden state it received, kept for its backward, the rotary tables and
        position ids it computed; per microbatch of the step, by category: :attr:`per_step`).
        The second is measured, not assumed, because torch's ``PipelineStage`` allocates its
        receive buffers differently from version to version: up to 2.14 every microbatch's
        receive buffers (its hidden state and its gradient) at the step's start, so each
        microbatch of the step adds two hidden states and its token ids; from 2.15 each just
        before its receive, taken by the microbatch's computation, so only the token ids. The
        first is the activations after the first microbatch's forward less one layer's
        (:meth:`activations`) and the :data:`PIPELINE_MICROBATCHES` microbatches' share of the
        second's activations."""
        mid = self.middle_run()
        per_step = self.per_step
        if per_step is None:
            raise ValueError("a middle stage's reference needs what a microbatch adds")
        kept: int = self._once("received", lambda: (
            _after_first_forward(mid.points, self.layers)
            - PIPELINE_MICROBATCHES * per_step.get("activations", 0) - self.activations()[0]))
        return kept, per_step

    def pair(self) -> tuple[Small, Small]:
        """The runs without stages at :data:`REFERENCE_LAYERS`."""
        if self.a is None or self.b is None:
            raise ValueError("a role without stages needs its runs of 3 and 4 layers")
        return self.a, self.b

    def phases(self) -> set[str]:
        """The phases the runs ran."""
        runs = [r for r in (self.a, self.b, self.first, self.last, self.last_more,
                            self.first_two) if r is not None]
        return {p for r in runs for p in r.estimate.by_phase}

    def rows(self, phase: str) -> tuple[Row, Row, Row, Row, Row]:
        """A role without stages' phase rows from ``a`` and ``b``: per microbatch (layer,
        embedding, rest), and FSDP2's (layer, outside the layers: :data:`PER_STEP`)."""
        a, b = self.pair()
        first = REFERENCE_LAYERS[0]
        (na, sa), (nb, sb) = _split(a, phase), _split(b, phase)
        step_layer = lin([(1, sb), (-1, sa)])
        step_rest = lin([(1, sa), (-first, step_layer)])
        layer = lin([(1, nb), (-1, na)])
        embed = a.estimate.by_phase_module.get(phase, {}).get(EMBEDDING, Row())
        rest = lin([(1, na), (-first, layer), (-1, embed)])
        return layer, embed, rest, step_layer, step_rest

    def stage_row(self, phase: str, k: int, m: int, first: bool, last: bool,
                  warmup: int) -> Row:
        """A pipeline stage's phase row (``k`` layers, ``m`` microbatches, ``warmup`` forwards
        before its first backward) from the reference pipeline (:data:`PIPELINE_MICROBATCHES`
        ``= M``): a layer's work ``(F2 - F1) / M`` per microbatch, its FSDP2 operators
        ``(F2 - F1)``'s as its gathers in the phase (:func:`gather_share`), its calls once a step
        (the gradients' reduction after the schedule's last backward, :func:`once_a_step`,
        and the first microbatch's gradient stores) once and its gradients' additions
        (:func:`accumulated`) at ``(m - 1) / (M - 1)``; the first stage's outside its layers
        ``F1 - (F2 - F1)`` (work and additions as a layer's, FSDP2's and the once-a-step
        calls once); the last
        stage's from its run at ``M`` and ``M + 1`` microbatches, on their line at ``m``, with
        ``k - 1`` more layers; a middle stage's layers only."""
        _, l1, l2, _ = self.pipeline()
        big_m = PIPELINE_MICROBATCHES
        one, layer = self._once(("split", phase), lambda: self._split_layer(phase))
        # a layer at m microbatches: its work per microbatch, its FSDP2 operators per gather
        # (in the phase: gather_share), its once-a-step calls, its gradients' additions
        coefs = (m / big_m, float(gather_share(phase, m, warmup)), 1.0, (m - 1) / (big_m - 1))
        if last:
            whole_l1, whole_l2 = (r.estimate.by_phase.get(phase, Row()) for r in (l1, l2))
            return lin([(1, whole_l1), (m - big_m, whole_l2), (big_m - m, whole_l1),
                        *(((k - 1) * c, r) for c, r in zip(coefs, layer, strict=True))])
        out = [(k * c, r) for c, r in zip(coefs, layer, strict=True)]
        if first:  # outside its layers, F1's less a layer's (FSDP2's operators once a step)
            outside = (coefs[0], 1.0, 1.0, coefs[3])
            for c, part, lay in zip(outside, one, layer, strict=True):
                out += [(c, part), (-c, lay)]
        return lin(out)

    def _split_layer(self, phase: str) -> tuple[tuple[Row, ...], list[Row]]:
        """``F1``'s phase row in :func:`_split_step`'s parts, and a layer's (``F2 - F1``)."""
        f1, _, _, f2 = self.pipeline()
        one, two = _split_step(f1, phase), _split_step(f2, phase)
        return one, [lin([(1, b), (-1, a)]) for a, b in zip(one, two, strict=True)]

    def parameters(self, k: int, first: bool, last: bool,
                   what: str = "parameter_bytes") -> int:
        """A stage's parameter shard bytes at :attr:`dp` (``what="parameter_tensors"``: how
        many shards, at any degree; ``"partial_tensors"``, ``"partial_elements"``: those with
        partial gradients, :class:`~flopscope.plan.roles.RoleRun`): ``k`` layers', the
        embedding's on the first stage, the rest (final norm, head) on the last."""
        if self.a is None:
            f1, l1, _, f2 = (getattr(r, what) for r in self.pipeline())
            layer = f2 - f1
            embed, rest = f1 - layer, l1 - layer
        else:
            a, b = (getattr(r, what) for r in self.pair())
            layer = b - a
            base = a - REFERENCE_LAYERS[0] * layer
            embed = round(base * self.embedding_share)
            rest = base - embed
        return int(k * layer + first * embed + last * rest)

    def activations(self) -> tuple[int, int, int]:
        """Saved activations of one microbatch: (per layer, the embedding's output, what every
        stage computes before its layers: the rotary tables, the mask); a pipeline's from its
        first stage's first microbatch (two layers' less one layer's)."""
        found: tuple[int, int, int] = self._once("activations", self._activations)
        return found

    def _activations(self) -> tuple[int, int, int]:
        if self.a is None:
            f1, _, _, f2 = self.pipeline()
            layer = (_after_first_forward(f2.points, self.layers)
                     - _after_first_forward(f1.points, self.layers))
            return (layer, *_before_layers(f1.points, self.layers))
        a, b = self.pair()
        act_a = _before_head(a.points, self.layers).get("activations", 0)
        act_b = _before_head(b.points, self.layers).get("activations", 0)
        return (act_b - act_a, *_before_layers(a.points, self.layers))

    def last_points(self, m: int) -> list[Point]:
        """The last stage's call points at ``m`` microbatches: :attr:`last`'s where ``m`` is
        its count, else :attr:`last_more`'s each carried along its line
        (:func:`~flopscope.plan.microbatches.extend_points`; where the two are not the same
        calls but for one more microbatch, the nearer run's as they are)."""
        _, last, more, _ = self.pipeline()
        mb = PIPELINE_MICROBATCHES + 1
        if m == mb - 1:
            return last.points

        def read() -> list[Point]:
            try:
                return extend_points(last.points, more.points, mb, m)
            except NotRepeating:
                return more.points if m > mb else last.points

        found: list[Point] = self._once(("last", m), read)
        return found
