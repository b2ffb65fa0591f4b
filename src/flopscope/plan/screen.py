"""Screening: every pipeline stage of a plan estimated from a few small reference runs, the
layouts that could win then simulated (:func:`flopscope.plan.plan`'s ``screen``).

A plan simulates each rank role once (:mod:`flopscope.plan.roles`), but a 70B-shaped model on
hundreds of devices has hundreds of pipeline-stage roles (every tensor-parallel degree,
pipeline depth and stage, micro-batch and checkpointing), each tens of decoder-layer passes
through DTensor, FSDP2 and the fake tensor mode. A screened plan simulates roles without stages
as usual (they are few, and cheap from small layer counts), and puts every pipeline stage
together from references shared by every depth and stage of a tensor-parallel degree,
micro-batch, checkpointing and precision (:class:`~flopscope.plan.reference.Reference`, 19
layer passes): two-stage pipelines of one layer per stage (first and last stage,
:data:`PIPELINE_MICROBATCHES` ``= M`` microbatches, the last stage with one more too, the first
stage with two layers per stage too: ``F1``, ``L1``, ``L2``, ``F2``), and the middle stage of a
three-stage pipeline of one layer per stage at ``M`` microbatches (``M1``: a middle stage's
peak); what each microbatch of the step adds to a middle stage, once per tensor-parallel
degree and precision, from the same middle stage at micro-batch 1 at ``M`` and ``M + 1``
microbatches (:meth:`Screen.per_step`). (Until an earlier round a stage's time and
collectives came
from a second pair of runs, the model cut to 3 and 4 layers without stages: a figure further
from the pipeline's.)

- **time** per phase (:meth:`~flopscope.plan.reference.Reference.stage_row`): a layer's
  ``F2 - F1``, its work per microbatch (``m / M``) and FSDP2's own operators
  (:data:`PER_STEP`) as its all-gathers in the phase
  (:func:`~flopscope.plan.reference.gather_share`); the first stage's outside its layers
  ``F1 - (F2 - F1)`` (the embedding's work per microbatch, FSDP2's per step); the last
  stage's ``L1`` and ``L2`` on their line at ``m`` microbatches, with ``k - 1`` more layers;
  a middle stage's ``k`` layers;
- **collectives** the same way (:func:`~flopscope.plan.stage_records.stage_records`): the tensor-parallel ones per
  microbatch, FSDP2's all-gathers one per microbatch and one more (``w`` in the forward,
  the stage's forwards before its first backward, the rest in the backward) and its
  reduce-scatters once a step, at the role's FSDP2 degree (payloads as gathered, bus bytes
  at the degree); the hidden states sent and received, one each way per microbatch and stage
  boundary (the size the reference pipeline sent);
- **peak memory**: the first stage from the reference pipeline's first stage (two
  microbatches in flight), plus what a layer adds there (its two-layer run less its one-layer
  run) per further layer, plus each further microbatch 1F1B keeps in flight
  (``min(pp, microbatches)``: ``k`` layers' saved activations and what the stage computes
  before its layers, the embedding's output); a middle stage from ``M1`` at its peak, its
  further layers and microbatches in flight, and per further microbatch of the step what one
  adds at the peak (measured: :meth:`Screen.per_step`; :mod:`flopscope.plan.stage_memory`);
  the last stage from the reference
  pipeline's last stage at one and one more microbatch, each call point carried to the step's
  microbatches (:func:`~flopscope.plan.microbatches.extend_points`: every microbatch's output
  stays live to the step's end), with the microbatch in flight's further layers; the stage's
  parameter shards per layer (``F2 - F1``), embedding (``F1`` less a layer) and rest (``L1``
  less a layer), at its FSDP2 degree.

A role without stages of a model of more than 12 layers is screened from its own two runs of
3 and 4 layers (:data:`REFERENCE_LAYERS`), every call point carried to its layers.

A reference above the larger of :data:`CARRY_FROM` (micro-batch 4) is not simulated: its runs are
carried from the same runs at :data:`CARRY_FROM`'s micro-batches
(:func:`~flopscope.plan.micro_batch.at_micro_batch`: every count on its line in the
micro-batch, the roofline time summed again from the carried call records), exact where the
runs make the same calls (checked; else simulated).

A reference pipeline at FSDP2 degree 1 (a layout whose ``tp x pp`` is every device) is, with
mixed precision, derived from the plan's sharded one at the same micro-batch and a base pair
simulated at another (:mod:`flopscope.plan.whole`), exact where the difference between the
degrees is the same at every micro-batch (held out on the test model and the 70B plans).

What else a deep pipeline does (the schedule's order of frees, FSDP2's resharding between
microbatches at every depth) is not in the references, so a screened stage is an **estimate**:
the plan simulates the layouts that could win (:func:`flopscope.plan.confirm.confirm_best`)
and reports the screen's error on them; docs/plan.md ("Screening") has the errors measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from typing import NamedTuple

from flopscope.distributed.pipeline import split_layers
from flopscope.distributed.repeat import SMALL, NotRepeating
from flopscope.distributed.world import fake_world, shared_world
from flopscope.estimate import Estimate
from flopscope.plan.layers import Small
from flopscope.plan.micro_batch import at_micro_batch
from flopscope.plan.reference import (
    EMBEDDING,
    PER_STEP,
    PIPELINE_MICROBATCHES,
    REFERENCE_LAYERS,
    Reference,
    lin,
)
from flopscope.plan.roles import Build, RoleKey, RoleRun, Roles, layout_of
from flopscope.plan.stage_memory import stage_memory
from flopscope.plan.stage_records import role_records, stage_records
from flopscope.plan.whole import Base, base_pair, whole_from

__all__ = ["CARRY_FROM", "EMBEDDING", "PER_STEP", "PIPELINE_MICROBATCHES", "REFERENCE_LAYERS", "Pipeline",
           "Reference", "Screen", "reference_key", "screened"]

#: the micro-batches a reference pipeline at a larger one is carried from (at 1 a causal LM's
#: loss makes one call fewer: its shifted labels are contiguous, not copied)
CARRY_FROM = (2, 4)


class Pipeline(NamedTuple):
    """A reference pipeline's runs (:meth:`Screen.pipeline`), by name.

    Attributes:
        first: the first stage of two stages of one layer, at :data:`PIPELINE_MICROBATCHES`
            microbatches (``F1``).
        last: that pipeline's last stage (``L1``).
        last_more: its last stage with one microbatch more (``L2``).
        first_two: its first stage with two layers per stage (``F2``).
        middle: the middle stage of three stages of one layer, at
            :data:`PIPELINE_MICROBATCHES` microbatches (``M1``).
    """

    first: Small
    last: Small
    last_more: Small
    first_two: Small
    middle: Small


def reference_key(key: RoleKey, gpus: int) -> RoleKey:
    """The reference a role is screened from: a role without stages is its own (one
    microbatch); a pipeline stage's has its tensor-parallel degree, micro-batch, checkpointing,
    precision and loss, without stages, at FSDP2 degree ``gpus / tp``, without sequence or
    loss parallelism (a plan applies them without stages only).

    Args:
        key: the role.
        gpus: the plan's devices.

    Returns:
        The reference's key.
    """
    if key.pp == 1:
        return dataclasses.replace(key, microbatches=1, peak_microbatches=0)
    return dataclasses.replace(key, pp=1, stage=0, dp=gpus // key.tp, microbatches=1,
                               sequence_parallel=False, loss_parallel=False,
                               peak_microbatches=0)


def screened(key: RoleKey, ref: Reference, layers: int) -> RoleRun:
    """A role put together from its reference (see the module docstring): an estimate.

    Args:
        key: the role.
        ref: its reference (:func:`reference_key`).
        layers: the model's decoder layers.

    Returns:
        The :class:`~flopscope.plan.roles.RoleRun` (``seconds`` 0; its report holds only the
        collectives).
    """
    k = len(split_layers(layers, key.pp)[key.stage])
    first, last = key.stage == 0, key.stage == key.pp - 1
    m = key.peak_microbatches or key.microbatches
    est = ref.base().estimate
    phases = {}
    for phase in ref.phases():
        if key.pp > 1:
            phases[phase] = ref.stage_row(phase, k, m, first, last, key.pp - key.stage)
            continue
        layer, embed, rest, step_layer, step_rest = ref.rows(phase)
        phases[phase] = lin([(m * k, layer), (m, embed), (m, rest), (k, step_layer),
                             (1, step_rest)])
    estimate = Estimate(est.hardware, est.tf32, lin((1, r) for r in phases.values()), phases,
                        tf32_convolution=est.tf32_convolution)
    records = (stage_records(key, ref, k, first, last, m) if key.pp > 1
               else role_records(key, ref, k))
    memory, params = stage_memory(key, ref, k, first, last, m)
    report = dataclasses.replace(ref.base().report, records=(), logical=(), replicated=(),
                                 communication=tuple(records))
    return RoleRun(key, report, memory, estimate, params, 0.0, m,
                   ref.parameters(k, first, last, "parameter_tensors"),
                   ref.base().parameters_dtensor,
                   ref.parameters(k, first, last, "partial_tensors"),
                   ref.parameters(k, first, last, "partial_elements"))


class Screen:
    """Screened roles of one plan, each reference simulated once, its small runs in the fake
    world of their rank kept open from one run to the next in the same world
    (:func:`~flopscope.distributed.world.shared_world`: DTensor's sharding decisions made once
    for them) and left when :meth:`run` returns.

    Args:
        roles: the plan's roles (their small runs: :meth:`~flopscope.plan.roles.Roles.small`).
        build: the plan's model builder (:data:`~flopscope.plan.roles.Build`).
        gpus: the plan's devices.

    Attributes:
        references: references simulated (a pipeline carried from others not counted).
        carry_micro_batch: whether a reference above :data:`CARRY_FROM`'s micro-batches is
            carried from those (its runs without stages and its pipelines); ``False``:
            simulated.
        carried: the references carried so, as ``(reference, FSDP2 degree of its pipeline)``
            (0: its runs without stages).
        derive_whole: whether a reference pipeline at FSDP2 degree 1 is derived from the one
            at the plan's sharded degree (:mod:`flopscope.plan.whole`) where it can be;
            ``False``: simulated.
        derived: the references whose pipeline at degree 1 was derived so.
        slopes: what a microbatch of the step adds to a middle stage (``False``) or the first
            (``True``) at its peak, per family at micro-batch 1 (:meth:`per_step`; one run
            each, not counted in :attr:`references`).
    """

    def __init__(self, roles: Roles, build: Build, gpus: int) -> None:
        self._roles = roles
        self._gpus = gpus
        self._refs: dict[RoleKey, tuple[Small, ...]] = {}
        self._pipes: dict[tuple[RoleKey, int], Pipeline] = {}
        self.carry_micro_batch = True
        self.carried: list[tuple[RoleKey, int]] = []
        self.derive_whole = True
        self.derived: list[RoleKey] = []
        self._bases: dict[RoleKey, tuple[Base, ...]] = {}
        # a reference as screening reads it, per stage kind (its reads kept with it: each
        # role of the kind reads the same runs the same way)
        self._made: dict[tuple[RoleKey, int, str], Reference] = {}
        self.slopes: dict[tuple[RoleKey, bool], dict[str, int]] = {}
        self._world: tuple[int, int] | None = None
        self._stack = ExitStack()
        prefix, self._layers = roles.decoder_layers()
        self._prefix = prefix
        model = build(1, "none")[0]
        outside = [p.numel() for n, p in model.named_parameters()
                   if not n.startswith(prefix + ".")]
        embed = sum(p.numel() for n, p in model.named_parameters()
                    if n.startswith(EMBEDDING + "."))
        self._share = embed / sum(outside) if outside and sum(outside) else 0.0

    @property
    def references(self) -> int:
        """References simulated (runs without stages, and pipelines)."""
        return len(self._refs) + len(self._pipes) - len(self.carried) - len(self.derived)

    def estimates(self, key: RoleKey) -> bool:
        """Whether :meth:`run` gives ``key`` an estimate (else its simulation: a role without
        stages of a model with few layers, as cheap to simulate whole).

        Args:
            key: the role.

        Returns:
            ``True`` for an estimate.
        """
        return key.pp > 1 or self._layers > sum(SMALL)

    def run(self, key: RoleKey) -> RoleRun:
        """The role, screened (:meth:`estimates`): a pipeline stage from its references, a role
        without stages from its own two small runs (its call points carried to its layers).

        Args:
            key: the role.

        Returns:
            Its estimate (:func:`screened`), or its simulation.
        """
        if not self.estimates(key):
            return self._roles.get(key)
        try:
            return self._screened(key)
        finally:
            self._close()

    def _screened(self, key: RoleKey) -> RoleRun:
        rk = reference_key(key, self._gpus)
        if key.pp == 1:
            at = (rk, 0, "")
            ref = self._made.get(at)
            if ref is None:
                a, b = self._reference(rk)
                ref = self._made[at] = Reference(self._prefix, self._share, rk.dp, a=a, b=b)
        else:
            # FSDP2 shards only at a degree above 1 (without it gradients stay whole): the
            # reference pipeline's degree is 1 for such a role, else the most it can have
            dp = 1 if key.dp == 1 else self._gpus // (2 * key.tp)
            stage = ("last" if key.stage == key.pp - 1 else "first" if key.stage == 0
                     else "middle")
            at = (rk, dp, stage)
            ref = self._made.get(at)
            if ref is None:
                pipe = self._pipeline(rk, dp)
                ref = self._made[at] = Reference(
                    self._prefix, self._share, dp, first=pipe.first, last=pipe.last,
                    last_more=pipe.last_more, first_two=pipe.first_two, middle=pipe.middle,
                    per_step=(self.per_step(rk, stage == "first") if stage != "last"
                              else None))
        return screened(key, ref, self._layers)

    def reference(self, rk: RoleKey) -> tuple[Small, ...]:
        """A reference's runs without stages (:meth:`_reference`), the fake world left.

        Args:
            rk: the reference (:func:`reference_key`).

        Returns:
            Its runs at :data:`REFERENCE_LAYERS`' layer counts.
        """
        try:
            return self._reference(rk)
        finally:
            self._close()

    def _reference(self, rk: RoleKey) -> tuple[Small, ...]:
        """A reference's runs without stages (:data:`REFERENCE_LAYERS`): simulated (their
        operator calls' records kept at :data:`CARRY_FROM`'s micro-batches), or above those
        carried along the line through them (:func:`~flopscope.plan.micro_batch.
        at_micro_batch`: every call's record, so the roofline estimate is summed from them)."""
        runs = self._refs.get(rk)
        if runs is not None:
            return runs
        runs = self._carried(rk, 0, self._reference)
        if runs is None:
            runs = tuple(self._small(rk, n, rk.micro_batch in CARRY_FROM)
                         for n in REFERENCE_LAYERS)
        self._refs[rk] = runs
        return runs

    def pipeline(self, rk: RoleKey, dp: int) -> Pipeline:
        """A reference's pipeline runs (:meth:`_pipeline`), the fake world left.

        Args:
            rk: the reference (:func:`reference_key`).
            dp: the pipeline's FSDP2 degree.

        Returns:
            The :class:`Pipeline` (first stage, last stage, last with one microbatch more,
            first with two layers, the middle stage of three).
        """
        try:
            return self._pipeline(rk, dp)
        finally:
            self._close()

    def _pipeline(self, rk: RoleKey, dp: int) -> Pipeline:
        """A reference's pipeline runs at FSDP2 degree ``dp`` (first stage, last stage, last
        with one microbatch more, first with two layers, of two stages; the middle stage of
        three): simulated, or above
        :data:`CARRY_FROM`'s micro-batches carried along the line through them
        (:func:`~flopscope.plan.micro_batch.at_micro_batch`: memory and sends only, what
        screening reads of them) unless they are not the same calls."""
        found = self._pipes.get((rk, dp))
        if found is not None:
            return found
        pipe = self._whole(rk) if dp == 1 else None
        if pipe is None:
            pipe = self._pipeline_own(rk, dp)
        found = self._pipes[(rk, dp)] = Pipeline(*pipe)
        return found

    def _pipeline_own(self, rk: RoleKey, dp: int) -> tuple[Small, ...]:
        """:meth:`_pipeline`'s runs carried or simulated (not from another degree)."""
        pipe = self._carried(rk, dp, lambda k: self._pipeline(k, dp))
        if pipe is None:
            mb = PIPELINE_MICROBATCHES
            two_stages = dataclasses.replace(rk, pp=2, dp=dp)
            # the first stage's runs, then the last's (two worlds: the ranks differ)
            calls = rk.micro_batch in CARRY_FROM  # their time is read too: carried from them
            first, first_two = (self._small(dataclasses.replace(two_stages, microbatches=mb), n,
                                            calls) for n in (1, 2))
            last, last_more = (self._small(dataclasses.replace(two_stages, stage=1,
                                                               microbatches=m), 1, calls)
                               for m in (mb, mb + 1))
            # a middle stage: of three stages, two microbatches in flight as the first's
            middle = self._small(dataclasses.replace(two_stages, pp=3, stage=1, microbatches=mb),
                                 1, calls)
            pipe = (first, last, last_more, first_two, middle)
        return pipe

    def per_step(self, rk: RoleKey, first: bool = False) -> dict[str, int]:
        """What each microbatch of the step adds to a middle (or the first) stage at its peak,
        by category, for reference ``rk``: measured once per tensor-parallel degree, precision
        and loss (:attr:`slopes`), as the middle stage of three stages of one layer (the first
        of two) at micro-batch 1, without checkpointing, at the plan's sharded FSDP2 degree, at
        :data:`PIPELINE_MICROBATCHES` ``+ 1`` microbatches less at ``M`` (the run at ``M`` is
        the reference pipeline's own where the plan has it), times ``rk``'s micro-batch. What
        a microbatch of the step leaves live to the step's end is its input chunk and, where
        torch allocates them at the step's start (up to 2.14), its receive buffers: tensors
        of the microbatch's own samples, so proportional to the micro-batch and the same with
        any checkpointing or FSDP2 degree (checked exact on the test model's middle stages at
        micro-batch 1 and 2, checkpointing none and per block, FSDP2 degree 1, on torch 2.14
        and 2.15: ``tests/plan/test_screen.py``); one run of 4 layer passes per family and
        stage instead of one per reference.

        Args:
            rk: the reference (:func:`reference_key`).
            first: the first stage's (else a middle stage's).

        Returns:
            Bytes per category.
        """
        family = dataclasses.replace(rk, micro_batch=1, checkpoint="none")
        unit = self.slopes.get((family, first))
        if unit is None:
            dp, mb = max(1, self._gpus // (2 * rk.tp)), PIPELINE_MICROBATCHES
            stage = dataclasses.replace(family, pp=2 if first else 3, stage=0 if first else 1,
                                        dp=dp)
            have = self._pipes.get((family, dp))
            at = ((have.first if first else have.middle) if have is not None
                  else self._small(dataclasses.replace(stage, microbatches=mb), 1))
            more = self._small(dataclasses.replace(stage, microbatches=mb + 1), 1)
            a, b = at.memory.at_peak, more.memory.at_peak
            unit = {c: b.get(c, 0) - a.get(c, 0) for c in {*a, *b}}
            self.slopes[(family, first)] = unit
        return {c: v * rk.micro_batch for c, v in unit.items()}

    def _whole(self, rk: RoleKey) -> tuple[Small, ...] | None:
        """``rk``'s pipeline at FSDP2 degree 1 from the one at the plan's sharded degree
        (:mod:`flopscope.plan.whole`), moved by the difference of a base pair at another
        micro-batch of the same tensor-parallel degree, checkpointing and precision (its
        first pipeline at degree 1: simulated, with the sharded one); noted in
        :attr:`derived`. ``None`` (simulate it) where off, without mixed precision (degree 1
        then has no FSDP2), where the sharded degree is 1, for the base itself, or where the
        runs cannot be aligned."""
        sharded = self._gpus // (2 * rk.tp)
        if not self.derive_whole or rk.mixed_precision is None or sharded <= 1:
            return None
        family = dataclasses.replace(rk, micro_batch=0)
        if family not in self._bases:
            self._bases[family] = ()  # the base (and what it is carried from): simulated
            whole = self._pipeline_own(rk, 1)
            self._bases[family] = self._checked(whole, self._pipeline(rk, sharded))
            return whole
        base = self._bases[family]
        if not base:
            return None
        try:
            pipe = tuple(whole_from(s, b) for s, b in
                         zip(self._pipeline(rk, sharded), base, strict=True))
        except NotRepeating:
            return None
        self.derived.append(rk)
        return pipe

    def _checked(self, whole: tuple[Small, ...], sharded: tuple[Small, ...]
                 ) -> tuple[Base, ...]:
        """The base pair of each run (:func:`~flopscope.plan.whole.base_pair`), or ``()``
        where its runs cannot be aligned (a run's parameters change from call to call)."""
        try:
            return tuple(base_pair(w, s) for w, s in zip(whole, sharded, strict=True))
        except NotRepeating:
            return ()

    def _carried(self, rk: RoleKey, dp: int, runs_at: Callable[[RoleKey], tuple[Small, ...]]
                 ) -> tuple[Small, ...] | None:
        """``rk``'s runs carried from the same runs at :data:`CARRY_FROM`'s micro-batches
        (``runs_at``; :func:`~flopscope.plan.micro_batch.at_micro_batch`), noted in
        :attr:`carried` with ``dp`` (0: the runs without stages); ``None`` where ``rk`` is not
        above them, carrying is off, or the runs are not the same calls."""
        if rk.micro_batch <= CARRY_FROM[1] or not self.carry_micro_batch:
            return None
        low, high = (runs_at(dataclasses.replace(rk, micro_batch=b)) for b in CARRY_FROM)
        try:
            runs = tuple(at_micro_batch(a, b, CARRY_FROM, rk.micro_batch)
                         for a, b in zip(low, high, strict=True))
        except NotRepeating:
            return None
        self.carried.append((rk, dp))
        return runs

    def _small(self, key: RoleKey, per_stage: int, calls: bool = False) -> Small:
        """A small run in its rank's world, entered unless it is the one open."""
        layout = layout_of(key)
        world = (layout.world_size, layout.rank)
        if self._world != world:
            self._close()
            self._stack.enter_context(fake_world(*world))
            self._stack.enter_context(shared_world(layout))
            self._world = world
        return self._roles.small(key, per_stage, calls=calls)

    def _close(self) -> None:
        """Leave the fake world kept open."""
        self._stack.close()
        self._world = None
