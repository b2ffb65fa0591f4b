"""A screened pipeline stage's peak memory from its reference (:class:`flopscope.plan.reference.
Reference`): the first stage from the reference pipeline's first stage, a middle stage from the
reference's middle stage (of three), the last from its last stage carried to the step's
microbatches, a stage without stages from the runs of 3 and 4 layers carried to its layers
(see :mod:`flopscope.plan.screen`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flopscope.cost import Phase
from flopscope.distributed.repeat import WIDTH, Frame, NotRepeating
from flopscope.distributed.repeat_peak import Point, extrapolate_peak
from flopscope.estimate import MemoryProfile
from flopscope.plan.microbatches import peak_of
from flopscope.plan.reference import PIPELINE_MICROBATCHES, REFERENCE_LAYERS, Reference
from flopscope.plan.roles import RoleKey

__all__ = ["PIPELINE_MICROBATCHES", "REFERENCE_LAYERS", "stage_memory"]

_BACKWARD = (Phase.BACKWARD.value, Phase.RECOMPUTE.value)


def _in_layers(module: str, layers: str) -> bool:
    """Whether a call point's module is inside the decoder layers (a pipeline's points are
    prefixed with their microbatch: ``UNITS.i.F|model.layers.0.mlp``)."""
    return module.split("|")[-1].startswith(layers + ".")


def _affine(a: Mapping[str, int], b: Mapping[str, int], n: int) -> dict[str, int]:
    """Per category, ``a`` at 3 layers and ``b`` at 4 carried to ``n`` (never below 0)."""
    first = REFERENCE_LAYERS[0]
    return {c: max(0, a.get(c, 0) + (n - first) * (b.get(c, 0) - a.get(c, 0)))
            for c in {*a, *b}}


def _sub(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {c: a.get(c, 0) - b.get(c, 0) for c in {*a, *b}}


def _add(at: dict[str, int], d: Mapping[str, int], times: int) -> None:
    for c, v in d.items():
        at[c] = at.get(c, 0) + times * v


def _last_stage(ref: Reference, k: int, m: int, act_layer: int) -> MemoryProfile:
    """A pipeline's last stage of ``k`` layers at ``m`` microbatches, from one layer at
    ``mb`` and ``mb + 1``: each call point carried to ``m`` along its line
    (:meth:`~flopscope.plan.reference.Reference.last_points`), then the ``k - 1`` more layers'
    activations of the microbatch in flight added from its layer's forward to the end of its
    layer's backward (the calls after hold only the microbatches' kept inputs, outputs and
    their gradients)."""
    points, layers, more = ref.last_points(m), ref.layers, ref.pipeline()[2]
    grown: list[Point] = []
    alive = in_backward = False  # the microbatch in flight holds its layers' activations
    for module, phase, op, live in points:
        inside = _in_layers(module, layers)
        if inside:
            alive = alive or phase == Phase.FORWARD.value
            in_backward = phase in _BACKWARD
        elif in_backward:
            alive = in_backward = False
        if alive:
            live = {**live, "activations": live.get("activations", 0) + (k - 1) * act_layer}
        grown.append((module, phase, op, live))
    return peak_of(grown, 0, more.memory)


def _middle_stage(ref: Reference, per_layer: Mapping[str, int], k: int, in_flight: int,
                  m: int, act_layer: int) -> tuple[MemoryProfile, dict[str, int]]:
    """A middle stage of ``k`` layers with ``in_flight`` microbatches in flight of ``m``, from
    the reference pipeline's middle stage (one layer, two in flight, ``M`` microbatches) at its
    peak: per further layer, what a layer adds there (``F2 - F1``'s but its activations) and
    its saved activations for every microbatch in flight; per further microbatch in flight,
    its ``k`` layers' saved activations and what the stage keeps outside them (the received
    hidden state, the rotary tables); per further microbatch of the step, what one more adds
    at a middle stage's peak (measured: torch's receive buffers where it allocates them at the
    step's start, the microbatch's inputs; :meth:`~flopscope.plan.reference.Reference.
    received`)."""
    kept, per_step = ref.received()
    at = dict(ref.middle_run().memory.at_peak)
    # the peak is at the start of a microbatch's backward (its stage's last layer): every
    # microbatch in flight holds all its layers' activations then. F2 - F1's own may be taken
    # elsewhere (on a large vocabulary at the embedding's backward, one microbatch's layers
    # freed), so a further layer adds its activations per microbatch in flight
    _add(at, {c: v for c, v in per_layer.items() if c != "activations"}, k - 1)
    _add(at, {"activations": act_layer}, k * in_flight - 2)  # the reference: 1 x 2
    _add(at, {"activations": kept}, in_flight - 2)
    # a middle stage needs 3 stages, so m >= 3 = M
    _add(at, per_step, m - PIPELINE_MICROBATCHES)
    return ref.middle_run().memory, at


def stage_memory(key: RoleKey, ref: Reference, k: int, first: bool, last: bool, m: int
                 ) -> tuple[MemoryProfile, int]:
    """A stage's peak memory and parameter shard bytes.

    Args:
        key: the role.
        ref: its reference.
        k: the stage's decoder layers.
        first: whether it is the first stage.
        last: whether it is the last.
        m: the step's microbatches.

    Returns:
        (memory profile, parameter bytes).
    """
    params = ref.parameters(k, first, last) * ref.dp // key.dp
    act_layer, act_embed, act_pre = ref.activations()
    if key.pp == 1:
        # the reference's call points carried to k layers (the peak may move to another call
        # as layers are added: flopscope.distributed.repeat_peak)
        a, b = ref.pair()
        peak = a.memory
        try:
            found = extrapolate_peak(a.points, a.frame, b.points, b.frame,
                                     Frame(a.frame.prefix, 0, k), WIDTH)
            at = dict(found.live)
            peak = MemoryProfile(found.total, found.module, found.phase, found.op)
        except NotRepeating:
            at = _affine(a.memory.at_peak, b.memory.at_peak, k)
    else:
        f1, l1, l2, f2 = ref.pipeline()
        # per layer under the pipeline: the first stage of two layers less that of one
        per_layer = _sub(f2.memory.at_peak, f1.memory.at_peak)
        if last:
            peak = _last_stage(ref, k, m, act_layer)
            at = dict(peak.at_peak)
            _add(at, {c: v for c, v in per_layer.items() if c != "activations"}, k - 1)
        elif first:
            # two microbatches in flight: each in flight holds k layers' activations and what
            # the stage computes before its layers (the embedding's output, the rotary tables)
            peak = f1.memory
            at = dict(peak.at_peak)
            _add(at, per_layer, k - 1)
            in_flight = min(key.pp, m)
            at["activations"] = max(0, at.get("activations", 0)
                                    + (in_flight - 2) * (k * act_layer + act_embed + act_pre))
            # per microbatch of the step more (or fewer) than F1's: what one adds at the peak,
            # measured (torch <= 2.14's buffer for the gradient it receives, its token ids)
            _add(at, ref.per_step or {}, m - PIPELINE_MICROBATCHES)
        else:
            peak, at = _middle_stage(ref, per_layer, k, min(key.pp - key.stage, m), m,
                                     act_layer)
    at["parameters"] = params
    memory = MemoryProfile(sum(at.values()), peak.peak_module, peak.peak_phase, peak.peak_op,
                           {c: v for c, v in at.items() if v > 0}, train=True,
                           note="screened from reference runs")
    return memory, params
