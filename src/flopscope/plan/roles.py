"""Rank roles: what one rank of a layout does, simulated once and reused.

The ranks of a layout that do the same work are one *role*: without pipeline stages every rank
of a tensor-parallel x FSDP2 layout runs the same shapes (its shards are equal), so one rank is
simulated; with pipeline stages each stage is a role. A role is simulated on torch's fake process
group (:func:`flopscope.distributed.simulate`, shape-only), forward and backward of one training
step, with two observers: :class:`~flopscope.estimate.MemoryTracker` (the rank's tensors:
its parameter shards, inputs, gradients, activations, FSDP2's gathered parameters) and
:class:`~flopscope.estimate.CallLog` (the roofline time of its calls). :class:`Roles` keeps every
result keyed by the rank's shard shapes and micro-batch (:class:`RoleKey`), so layouts that share
them (another microbatch count, another world of the same degrees) reuse the simulation. A role
whose stage holds more than 12 alike decoder layers is put together from three simulations with
3, 4 and 5 layers per stage (:mod:`flopscope.plan.layers`), checked exact at the third; the
first, second or last stage of a pipeline of more than 18 stages (as many microbatches) from
three simulations of it in pipelines of 5, 6 and 7 stages, the same way.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flopscope.distributed import Layout, simulate
from flopscope.distributed.repeat import (
    SMALL,
    Frame,
    NotRepeating,
    alike,
    layer_list,
    layer_of,
    move_layers,
)
from flopscope.distributed.repeat_peak import Point
from flopscope.distributed.world import fake_world, shared_world
from flopscope.estimate import CallLog, Estimate, Hardware, MemoryProfile, MemoryTracker
from flopscope.execution.heap import frozen_heap
from flopscope.plan.degrees import Degrees, Dims, clear_degrees, dims_of, hardware_key
from flopscope.plan.layers import (
    UNIT_SMALL,
    UNITS,
    Actions,
    Put,
    Small,
    by_microbatch,
    check,
    combine,
    frame_of,
)
from flopscope.plan.microbatches import at_step
from flopscope.report.report import Report

__all__ = ["Build", "RoleKey", "RoleRun", "Roles", "clear_cache", "layout_of", "local_tensor", "remember"]

#: ``build(batch, checkpoint, layers=None)`` -> ``(model, args, kwargs)``: the model (on
#: ``meta``) in train mode, checkpointed as ``checkpoint`` says (:data:`flopscope.plan.
#: checkpointing.KNOWN`), and ``batch`` sequences of token ids; ``layers``: its first decoder
#: layers only (:func:`~flopscope.distributed.repeat.truncate`; ``None``: every one)
Build = Callable[..., tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]


@dataclass(frozen=True)
class RoleKey:
    """What a rank's work depends on: its shard shapes (tensor-parallel and FSDP2 degrees, its
    pipeline stage among ``pp``) and its batch (micro-batch, microbatches, checkpointing).

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline stages.
        stage: the rank's stage.
        dp: FSDP2 degree.
        micro_batch: sequences per microbatch.
        microbatches: microbatches in the simulated step (1 without stages).
        checkpoint: the decoder blocks' checkpointing: ``"none"``, ``"block"`` or
            ``"selective"`` (:mod:`flopscope.plan.checkpointing`); ``False`` and ``True`` are
            taken as ``"none"`` and ``"block"``.
        mixed_precision: ``(compute dtype, reduce dtype)``: FSDP2's mixed precision policy
            (:attr:`flopscope.distributed.Layout.mixed_precision`); ``None``: the model's dtype.
        sequence_parallel: the norms' activations sharded along the sequence over the
            tensor-parallel ranks (:attr:`flopscope.distributed.Layout.sequence_parallel`).
        loss_parallel: the head's logits vocabulary shards over the tensor-parallel ranks, the
            cross-entropy computed on them (:attr:`flopscope.distributed.Layout.loss_parallel`).
        loss: what backward runs from (:func:`flopscope.distributed.simulate`): ``"sum"`` of
            the logits, or ``"cross_entropy"``, a plan's (:func:`~flopscope.plan.layout_roles.roles_of`).
        peak_microbatches: the step's microbatches when more than ``microbatches`` (0: the
            same): the stage's peak memory is taken at that count
            (:mod:`flopscope.plan.microbatches`), its work at ``microbatches`` and scaled.
        replicate: DDP's whole replicas, not FSDP2's shards
            (:attr:`flopscope.distributed.Layout.replicate`).
        keep_gathered: FSDP2 keeps the gathered parameters from forward to backward
            (:attr:`flopscope.distributed.Layout.keep_gathered`).
    """

    tp: int
    pp: int
    stage: int
    dp: int
    micro_batch: int
    microbatches: int
    checkpoint: str
    mixed_precision: tuple[str, str] | None = None
    sequence_parallel: bool = False
    loss_parallel: bool = False
    loss: str = "sum"
    peak_microbatches: int = 0
    replicate: bool = False
    keep_gathered: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.checkpoint, bool):  # one key per role, whichever way it was named
            object.__setattr__(self, "checkpoint", "block" if self.checkpoint else "none")


@dataclass(frozen=True)
class RoleRun:
    """One simulated role.

    Attributes:
        key: the role.
        report: the rank's count (its records and collectives).
        memory: the rank's tensors over the simulated step (no optimizer state).
        estimate: its calls' roofline bound (and prediction where the profile has a calibration).
        parameter_bytes: the rank's own parameter shards.
        seconds: how long the simulation took here (0 for a screened estimate).
        microbatches: the microbatches the figures are for (0: ``key.microbatches``); below
            ``key.peak_microbatches``: the peak is lower than the step's (a deep pipeline).
        parameter_tensors: how many parameter shards the rank holds (the optimizer's calls
            per parameter, :mod:`flopscope.plan.update`); 0: not known.
        parameters_dtensor: the parameters are DTensors (each optimizer call on them passes
            DTensor's dispatch).
        partial_tensors: parameters whose gradient is partial after the backward (sequence
            parallelism's norms: :func:`shards`), all-reduced by the optimizer's calls.
        partial_elements: those gradients' elements.
    """

    key: RoleKey
    report: Report
    memory: MemoryProfile
    estimate: Estimate
    parameter_bytes: int
    seconds: float
    microbatches: int = 0
    parameter_tensors: int = 0
    parameters_dtensor: bool = False
    partial_tensors: int = 0
    partial_elements: int = 0

    @classmethod
    def of(cls, key: RoleKey, put: Put, seconds: float, microbatches: int = 0) -> RoleRun:
        """A role from what was put together (or simulated) for it."""
        return cls(key, put.report, put.memory, put.estimate, put.parameter_bytes, seconds,
                   microbatches, put.parameter_tensors, put.parameters_dtensor,
                   put.partial_tensors, put.partial_elements)

    @property
    def understated(self) -> bool:
        """Whether the peak is the simulated microbatches', below the step's."""
        return self.key.peak_microbatches > (self.microbatches or self.key.microbatches)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def shards(params: Sequence[torch.Tensor]) -> tuple[int, int, bool, int, int]:
    """A rank's parameter shards as a role holds them after its backward: (their local
    storages' bytes, how many, whether they are DTensors, how many have a partial gradient and
    its local elements).

    A partial gradient (a DTensor placed ``Partial`` on some mesh dimension) is a replicated
    parameter's whose uses ran on shards: sequence parallelism's norms (their inputs are
    sequence shards over the tensor-parallel ranks). Nothing reduces it before the optimizer:
    each of AdamW's operators that reads it with the replicated moments all-reduces it
    (:func:`flopscope.plan.update.update_collectives`)."""
    from torch.distributed.tensor import DTensor

    partial = [p.grad for p in params if isinstance(p.grad, DTensor)
               and any(pl.is_partial() for pl in p.grad.placements)]
    return (sum(local_tensor(p).untyped_storage().nbytes() for p in params), len(params),
            any(local_tensor(p) is not p for p in params), len(partial),
            sum(local_tensor(g).numel() for g in partial))


#: every role simulated in this process, by (model identity, hardware name, role)
_CACHE: dict[tuple[Hashable, str, RoleKey], RoleRun] = {}


def clear_cache() -> None:
    """Forget every simulated role and small run (the next plan simulates its roles again)."""
    _CACHE.clear()
    clear_degrees()


def remember(identity: Hashable, hardware: Hardware, run: RoleRun) -> None:
    """Keep a role simulated elsewhere (a worker process, a Ray task) as if this process had
    simulated it: :meth:`Roles.get` of the same model identity, hardware and key finds it.

    Args:
        identity: what the role's model is (as :class:`Roles` is given it).
        hardware: the profile its estimate is for.
        run: the simulated role.
    """
    _CACHE[(identity, hardware_key(hardware), run.key)] = run


class Roles:
    """Simulated roles, each once per process: a later plan of the same model (another global
    batch, budget or device count) reuses the roles it shares with earlier ones.

    Args:
        build: makes the model and a batch (:data:`Build`).
        hardware: the profile the roofline estimate is for.
        identity: what ``build`` builds (source, config, sequence length, dtype), the cache's
            key with the role.
        repeat_layers: a role whose stage holds more than 12 alike decoder layers from three
            small layer counts (:mod:`flopscope.plan.layers`); ``False``: every layer.
        repeat_microbatches: put the first, second and last stage of a pipeline of more than
            18 stages together from the stage in pipelines of 5, 6 and 7 (as many microbatches;
            :mod:`flopscope.plan.layers`); ``False``: simulate every microbatch.
        repeat_degrees: a role from small layer counts or small pipelines at a third FSDP2
            degree or later takes its small runs from two earlier degrees where that is exact
            (:mod:`flopscope.plan.degrees`: no padding, the first small run simulated as the
            check); ``False``: simulate them.

    Attributes:
        simulations: simulations run (cache misses).
        from_small: of those, roles put together from three small layer counts
            (:mod:`flopscope.plan.layers`) instead of simulated whole.
        from_microbatches: of those, pipeline stages put together from three small pipelines.
        seconds: time spent simulating (also :attr:`used`, :attr:`from_degrees`,
            :attr:`degrees_refused`).
    """

    def __init__(self, build: Build, hardware: Hardware, identity: Hashable, *,
                 repeat_layers: bool = True, repeat_microbatches: bool = True,
                 repeat_degrees: bool = True) -> None:
        self._build = build
        self._hardware = hardware
        self._identity = identity
        self._used: set[RoleKey] = set()
        self._alike: bool | None = None if repeat_layers else False
        self._layers: tuple[str, int] = ("", 0)
        self._microbatches = repeat_microbatches
        self._degrees = Degrees(identity, hardware_key(hardware)) if repeat_degrees else None
        self._records = repeat_degrees and hardware.calibration is not None  # degrees.derive
        self.from_small = 0
        self.from_microbatches = 0
        self.simulations = 0
        self.seconds = 0.0

    @property
    def used(self) -> int:
        """Distinct roles asked for."""
        return len(self._used)

    @property
    def from_degrees(self) -> int:
        """Roles whose small runs were derived from two other FSDP2 degrees."""
        return self._degrees.derived if self._degrees is not None else 0

    @property
    def degrees_refused(self) -> int:
        """Roles at a third degree or later whose small runs were simulated."""
        return self._degrees.refused if self._degrees is not None else 0

    def get(self, key: RoleKey) -> RoleRun:
        """The role's simulation (run now when no earlier one is cached).

        Args:
            key: the role.

        Returns:
            Its :class:`RoleRun`.
        """
        self._used.add(key)
        full = (self._identity, hardware_key(self._hardware), key)
        found = _CACHE.get(full)
        if found is None:
            found = _CACHE[full] = (self._more_microbatches(key) if key.peak_microbatches
                                    else self._simulate(key))
        return found

    def _more_microbatches(self, key: RoleKey) -> RoleRun:
        """A stage with more microbatches in its step, at the step's count
        (:func:`~.microbatches.at_step`); a deep pipeline's, the simulated count's."""
        start, base = time.perf_counter(), dataclasses.replace(key, peak_microbatches=0)
        self._repeats()
        to = frame_of(*self._layers, key.pp, key.stage)
        small = bool(self._alike) and to.n > sum(SMALL)
        if key.pp > sum(UNIT_SMALL):  # simulated over pp (roles_of): not built
            return dataclasses.replace(self.get(base), key=key)
        layout = layout_of(key)

        def run(m: int, n: int | None) -> Small:
            self.simulations += 1
            return self.small(dataclasses.replace(base, microbatches=m), n)

        try:
            with fake_world(layout.world_size, layout.rank), shared_world(layout):
                put = at_step(run, base.microbatches, key.peak_microbatches,
                              to if small else None)
        except NotRepeating:
            if small:
                return dataclasses.replace(self.get(base), key=key)
            put = Put.of(run(key.peak_microbatches, None))
        seconds = time.perf_counter() - start
        self.seconds += seconds
        return RoleRun.of(key, put, seconds, key.peak_microbatches)

    def _simulate(self, key: RoleKey) -> RoleRun:
        """The role simulated: from three small layer counts when its stage holds more
        (:mod:`flopscope.plan.layers`, checked exact at the third), else every layer."""
        start = time.perf_counter()
        run = None
        if self._repeats():
            try:
                run = self._from_small(key)
            except NotRepeating:
                run = None
            self.from_small += run is not None
        if run is None and self._microbatches:
            try:
                run = self._from_microbatches(key)
            except NotRepeating:
                run = None
            self.from_microbatches += run is not None
        if run is None:
            run = Put.of(self.small(key, None))
        seconds = time.perf_counter() - start
        self.simulations += 1
        self.seconds += seconds
        return RoleRun.of(key, run, seconds)

    def _repeats(self) -> bool:
        """Whether the model's decoder layers are alike (checked once)."""
        if self._alike is None:
            model = self._build(1, "none")[0]
            found = layer_list(model)
            self._alike = found is not None and alike(list(found[1].children()))
            self._layers = (found[0], len(found[1])) if found is not None else ("", 0)
        return self._alike

    def _from_small(self, key: RoleKey) -> Put | None:
        prefix, layers = self._layers
        to = frame_of(prefix, layers, key.pp, key.stage)
        if to.n <= sum(SMALL):
            return None
        layout = layout_of(key)

        def run(n: int) -> tuple[Small, Dims]:
            dims: list[Dims] = []
            return self.small(key, n, dims=dims), dims[0] if dims else None

        with fake_world(layout.world_size, layout.rank), shared_world(layout):
            degrees = self._degrees_for(key)
            if degrees is None:
                a, b, c = (self.small(key, n) for n in SMALL)
            else:
                a, b, c = degrees.runs(("layers", dataclasses.replace(key, dp=0)), key.dp,
                                             SMALL, run, layout.world_size, layout.rank)
        check(a, b, c)
        return combine(a, b, c, to)

    def _from_microbatches(self, key: RoleKey) -> Put | None:
        """The first, second or last stage of a pipeline of more than ``sum(UNIT_SMALL)``
        stages from the stage in pipelines of ``UNIT_SMALL`` stages (as many microbatches), the
        model cut so that the stage holds as many layers (at their own indices, but the last
        stage's: renumbered); ``None`` where that does not apply (see docs/plan.md)."""
        from flopscope.distributed.pipeline import split_layers

        last = key.stage == key.pp - 1
        if key.pp <= sum(UNIT_SMALL) or not (key.stage <= 1 or last) or \
                key.microbatches != key.pp:
            return None
        held = split_layers(self.decoder_layers()[1], key.pp)[key.stage]
        if not last and held.start != key.stage * len(held):  # the first stage holds one more
            return None
        def run(m: int) -> tuple[Small, Dims]:
            dims: list[Dims] = []
            small = self.small(dataclasses.replace(key, pp=m, microbatches=m,
                                                  stage=m - 1 if last else key.stage),
                              len(held), like=key, dims=dims)
            return small, dims[0] if dims else None

        degrees = self._degrees_for(key)
        if degrees is None:
            a, b, c = (run(m)[0] for m in UNIT_SMALL)
        else:
            layout = layout_of(key)
            a, b, c = degrees.runs(("stages", dataclasses.replace(key, dp=0)), key.dp,
                                         UNIT_SMALL, run, layout.world_size, layout.rank)
        check(a, b, c)
        return combine(a, b, c, Frame(UNITS, 0, key.microbatches))

    def _degrees_for(self, key: RoleKey) -> Degrees | None:
        """Where ``key``'s small runs may come from two other FSDP2 degrees (``None``: simulate
        them): not for replicas, whose shards do not change with the degree, nor for kept
        gathered parameters (whole, whatever the degree)."""
        return None if key.replicate or key.keep_gathered else self._degrees

    def decoder_layers(self) -> tuple[str, int]:
        """Where the model's decoder layers are (their module list's path) and how many."""
        if not self._layers[0]:
            found = layer_list(self._build(1, "none")[0])
            self._layers = (found[0], len(found[1])) if found is not None else ("", 0)
        return self._layers

    def small(self, key: RoleKey, per_stage: int | None, like: RoleKey | None = None,
              dims: list[Dims] | None = None, calls: bool = False) -> Small:
        """One simulation of a role (a small run: what roles are put together from).

        Args:
            key: the role.
            per_stage: layers per stage (``None``: the model's own).
            like: a stage put together from small pipelines, for which this run (fewer stages)
                stands: its calls named by microbatch, its world and p2p groups ``like``'s.
            dims: given how the parameters split their dimension 0 (``dims_of``).
            calls: keep every operator call's roofline record (``Small.calls``).

        Returns:
            The :class:`~flopscope.plan.layers.Small` run.
        """
        with frozen_heap():  # collections scan what the run makes, not what the plan keeps
            return self._small(key, per_stage, like, dims, calls)

    def _small(self, key: RoleKey, per_stage: int | None, like: RoleKey | None,
               dims: list[Dims] | None, calls: bool) -> Small:
        tracker, log, actions = MemoryTracker(), CallLog(), Actions()
        kept: list[nn.Module] = []

        def prepare(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
            kept.append(model)
            if dims is not None:
                dims.append(dims_of(model, key.dp))
            tracker.register((local_tensor(p) for p in model.parameters()), "parameters")
            tracker.register((local_tensor(b) for b in model.buffers()), "buffers")
            tracker.register(_tensors(args, kwargs), "inputs")

        def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
            return self._build(key.micro_batch * key.microbatches, key.checkpoint,
                               None if per_stage is None else per_stage * key.pp)

        layout = layout_of(key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = simulate(build, layout, backward=True, shape_only=True, logical=False,
                              microbatches=key.microbatches if key.pp > 1 else None,
                              loss=key.loss,
                              prepare=prepare, observers=[tracker, log, actions], warn=False)
        params = list(kept[0].parameters())
        memory = tracker.profile(relabel={"gradients": [local_tensor(p.grad) for p in params
                                                        if p.grad is not None]})
        points: list[Point] = [(p.module, p.phase, p.op, p.live) for p in tracker.call_points()]
        parameter_bytes, tensors, dtensor, partial, partial_elements = shards(params)
        kept.clear()
        prefix, layers = self.decoder_layers()
        total = per_stage * key.pp if per_stage is not None else layers
        frame = frame_of(prefix, total, key.pp, key.stage) if total >= key.pp else None
        if like is not None:
            real = frame_of(prefix, self.decoder_layers()[1], like.pp, like.stage)
            if frame is not None and frame.first != real.first:  # the last stage
                report = move_layers(report, frame, real)
                points = [(_moved(p[0], frame, real), *p[1:]) for p in points]
            points = by_microbatch(points, actions.starts)
            frame = Frame(UNITS, 0, key.microbatches)
            p2p = tuple(dataclasses.replace(c, group_size=like.pp)
                        if c.kind in ("send", "recv") else c for c in report.communication)
            report = dataclasses.replace(report, world_size=layout_of(like).world_size,
                                         rank=layout_of(like).rank, communication=p2p)
        return Small(frame or Frame(prefix, 0, 0), report, points, memory,
                     log.estimate(self._hardware), parameter_bytes,
                     log.records if calls or self._records else [], tensors, dtensor,
                     partial, partial_elements)


def layout_of(key: RoleKey) -> Layout:
    """The layout of a role's rank (the first of its stage)."""
    return Layout(key.tp * key.pp * key.dp, tp=key.tp, fsdp=key.dp, pp=key.pp,
                  rank=key.stage * key.dp * key.tp, mixed_precision=key.mixed_precision,
                  sequence_parallel=key.sequence_parallel, loss_parallel=key.loss_parallel,
                  replicate=key.replicate, keep_gathered=key.keep_gathered)


def _moved(path: str, frm: Frame, to: Frame) -> str:
    """A module path with the layers of ``frm`` renumbered to ``to``'s."""
    i, rest = layer_of(path, frm)
    return path if i is None else f"{to.prefix}.{to.first + i}{rest}"


def _tensors(args: Iterable[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    return [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
