"""The time of one training step of a layout, from its roles' counts: ONE function,
:func:`step_time`.

Parts (seconds per step, on the layout's slowest stage):

- **compute**: the rank's counted calls, forward and backward: the **prediction** when the
  hardware profile has a calibration block (``flopscope calibrate``'s, or a shipped GPU's
  reference calibration), else the roofline **lower bound** (every call at the hardware's peak
  FLOP rate or memory bandwidth, whichever binds); :attr:`StepTime.compute` says which. On a
  GPU calibration a phase takes the longer of its calls' host and device times (the host
  issues kernels while the device runs earlier ones), on a CPU their sum (one timeline);
  ``step_time(..., bound=True)`` takes the bound whatever the profile (shown beside);
- **recompute**: the forward work activation checkpointing runs again in backward (its phase);
- **communication**: every collective timed and sorted by the overlap rules of
  :mod:`flopscope.estimate.comm_time` (the one model; the planner and a simulated rank's
  ``--hardware`` report share it): tensor-parallel all-reduces exposed; FSDP2's all-gathers
  and reduce-scatters beside compute, only the first all-gather and what the rest need beyond
  the compute time exposed; DDP's gradient all-reduces (a vision model's
  ``data_parallel="ddp"`` layouts) the same way, one bucket (one block's gradients) exposed,
  once a step and beside the last microbatch's backward only; ZeRO-1's (``"zero1"``: the
  all-reduce's time stands for its reduce-scatter and gather, the same bus bytes) beside that
  backward and the next step's first forward;
  pipeline point-to-point exposed; expert parallelism's all-to-alls (the tokens' dispatch to
  their experts' ranks and the results' return) exposed;
- **the host's wait** (a GPU's prediction): the host issues every kernel, collective and send
  without waiting for the device, so communication on the device's streams is exposed only
  beyond the time the device waits for the host
  (:func:`~flopscope.estimate.overlap.host_overlap`, the one rule, a serving step's too;
  :meth:`~flopscope.estimate.comm_time.CommTime.exposure`): a phase's blocking collectives
  (tensor-parallel all-reduces, expert all-to-alls) beyond its own wait, the step's first
  FSDP2 all-gather and the pipeline's sends beyond the wait the phases left; the other FSDP2
  collectives beyond the stage's whole time (its waits in it). Where every phase is
  device-bound nothing hides: the step is the sum above to the bit; where the host is the
  slower timeline the step is shorter by what hid;
- **pipeline bubble**: 1F1B's idle time, replayed with each stage's forward and backward times
  (:func:`flopscope.distributed.pipeline.bubble`);
- **after the backwards** (with the parameters' dtype, as a plan gives it): AdamW's update of
  the rank's parameter shards (with ZeRO-1 a ``1 / dp`` share of them) and, without stages, the gradients' ``m - 1`` in-place
  additions, counted on fake tensors (:mod:`flopscope.plan.update`);
- **FSDP2's hooks**: with a CPU calibration that measured it, FSDP2's host time per all-gather
  and reduce-scatter (:mod:`flopscope.estimate.framework`) for each of the rank's, on the rank's
  one timeline (a GPU's host runs them while the device works: not added there). DTensor's own
  host time per operator is in the compute, as a call of its own in the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from fractions import Fraction

import torch

from flopscope.cost import Phase
from flopscope.distributed.pipeline import bubble
from flopscope.estimate.bound import Estimate
from flopscope.estimate.comm_time import OVERLAPPED_KINDS, CommTime, Links, comm_time
from flopscope.estimate.overlap import phase_times
from flopscope.plan.roles import RoleRun
from flopscope.plan.space import Choice

__all__ = ["PART_NAMES", "Links", "StepTime", "compare", "describe", "one_f_one_b",
           "step_time"]


@dataclass(frozen=True)
class StepTime:
    """Where one step's time goes (seconds; the slowest stage's view).

    Attributes:
        forward: the rank's forward compute.
        backward: its backward compute.
        recompute: forward work run again by activation checkpointing.
        tp_comm: tensor-parallel collectives (all-reduces; sequence parallelism's gathers and
            reduce-scatters) exposed: on a GPU's prediction beyond the time the device waits
            for the host in their phase.
        fsdp_comm: FSDP2 all-gathers and reduce-scatters left exposed.
        fsdp_hidden: FSDP2 communication hidden behind compute (not in the total).
        p2p: pipeline sends and receives (exposed).
        bubble: pipeline idle time.
        total: the step.
        ep_comm: expert parallelism's all-to-alls (dispatch and combine; exposed).
        compute: ``"prediction"`` (the profile's calibration) or ``"bound"`` (roofline): what
            the compute parts are.
        fsdp_hooks: FSDP2's host time around its collectives (see the module docstring).
        optimizer: AdamW's update of the rank's parameter shards after the last backward
            (:func:`flopscope.plan.update.update_estimate`; the largest of the stages').
        accumulation: the gradients' in-place additions between the microbatches of a
            layout without stages (``m - 1`` a step; a pipeline stage's are in its backward).
    """

    forward: float
    backward: float
    recompute: float
    tp_comm: float
    fsdp_comm: float
    fsdp_hidden: float
    p2p: float
    bubble: float
    total: float
    ep_comm: float = 0.0
    compute: str = "bound"
    fsdp_hooks: float = 0.0
    optimizer: float = 0.0
    accumulation: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready dict (seconds; what the compute is: :meth:`compute_kind`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "compute"}

    def parts(self) -> dict[str, float]:
        """The parts that add up to :attr:`total`, by name."""
        out = self.to_dict()
        del out["total"], out["fsdp_hidden"]
        return out


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """The actions of each stage under 1F1B: ``stages - 1 - s`` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards (Narayanan et al. 2021).

    Args:
        stages: pipeline stages.
        microbatches: microbatches per step.

    Returns:
        Per stage, ``("F", i)`` / ``("B", i)`` in order.
    """
    out = []
    for s in range(stages):
        warm = min(stages - 1 - s, microbatches)
        order = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < microbatches:
            if f < microbatches:
                order.append(("F", f))
                f += 1
            order.append(("B", b))
            b += 1
        out.append(order)
    return out


@dataclass
class _Stage:
    """A stage's step (the step's microbatches), its phases on a GPU's prediction split into
    the host's and the device's times, and what it exposes of its communication
    (:meth:`CommTime.exposure`)."""

    forward: float  # the phases: the longer of host and device (one timeline on a CPU)
    backward: float
    recompute: float
    comm: CommTime
    hooks: float = 0.0
    wait_forward: float = 0.0  # the device's wait for the host in forward
    wait_backward: float = 0.0  # and in backward with recomputation
    window: float | None = None  # DDP: the overlapped collectives beside this much at most

    def __post_init__(self) -> None:
        self.exposure = self.comm.exposure(self.forward + self.backward + self.recompute,
                                           wait_forward=self.wait_forward,
                                           wait_backward=self.wait_backward, hooks=self.hooks,
                                           window=self.window)

    @property
    def exposed_forward(self) -> float:
        return self.exposure.blocking_forward

    @property
    def exposed_backward(self) -> float:
        return self.exposure.blocking_backward

    @property
    def blocking(self) -> float:
        return self.exposure.blocking

    @property
    def ep_comm(self) -> float:
        ep = self.comm.by_kind.get("all_to_all", 0.0)
        return ep if self.comm.blocking == 0 else ep * (self.blocking / self.comm.blocking)

    @property
    def tp_comm(self) -> float:
        return self.blocking - self.ep_comm

    @property
    def busy(self) -> float:
        return self.forward + self.backward + self.recompute + self.blocking + self.hooks

    @property
    def fsdp(self) -> float:
        return self.comm.overlapped_first + self.comm.overlapped_rest


def _stage(run: RoleRun, choice: Choice, links: Links, scale: float, bound: bool) -> _Stage:
    estimate = run.estimate
    cal = None if bound else estimate.hardware.calibration
    # sequence parallelism's all-gathers and reduce-scatters (over the tensor-parallel group)
    # are exposed, as the all-reduces they replace; FSDP2's (over the data-parallel group)
    # overlapped: comm_time tells them apart by the records' group
    records = run.report.communication
    comm = comm_time(records, links, tp=choice.tp, dp=choice.dp, gpus=choice.gpus, scale=scale,
                     ddp=choice.replicas)
    hooks = 0.0
    if cal is not None and not cal.device.startswith("cuda"):
        hooks = cal.fsdp_collective_s * scale * sum(
            r.calls for r in records if r.kind in OVERLAPPED_KINDS and r.group != "tp")
    times = phase_times(estimate, scale=scale, bound=bound)
    (fwd, wait_f), (bwd, wait_b), (rec, wait_r) = (
        times.get(p.value, (0.0, 0.0)) for p in (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE))
    # DDP all-reduces its gradients in the step's last backward, bucket by bucket; ZeRO-1
    # reduce-scatters them there and gathers the updated parameters beside the next step's
    # first forward (Megatron-LM's overlapped gradient reduction and parameter gather)
    window = None
    if choice.replicas:
        window = (bwd + rec + (fwd if choice.data_parallel == "zero1" else 0.0)) / \
            choice.microbatches
    return _Stage(forward=fwd, backward=bwd, recompute=rec, comm=comm, hooks=hooks,
                  wait_forward=wait_f, wait_backward=wait_b + wait_r, window=window)


def _after_backward(runs: Sequence[RoleRun], choice: Choice, links: Links,
                    param_dtype: torch.dtype | None, bound: bool) -> tuple[float, float]:
    """(the optimizer's update, the gradients' accumulation) of the step: each stage updates
    its own shards after the schedule's flush (the largest update counts), all-reducing the
    partial gradients of replicated parameters on the way (sequence parallelism's norms:
    :func:`~flopscope.plan.update.update_collectives`, blocking, at the links); a layout
    without stages, simulated at one microbatch, adds its gradients ``m - 1`` times
    (:mod:`flopscope.plan.update`; a pipeline stage's additions are in its simulated
    microbatches). Nothing without ``param_dtype``."""
    if param_dtype is None:
        return 0.0, 0.0
    from flopscope.plan.update import (
        accumulation_estimate,
        update_collectives,
        update_estimate,
    )

    def seconds(est: Estimate) -> float:
        return sum(t for t, _ in phase_times(est, bound=bound).values())

    size = param_dtype.itemsize
    update = max(seconds(update_estimate(choice.optimizer_share(r.parameter_bytes // size),
                                         param_dtype, r.estimate.hardware,
                                         max(1, r.parameter_tensors // choice.optimizer_shards),
                                         r.parameters_dtensor))
                 + links.seconds(update_collectives(r.partial_tensors, r.partial_elements,
                                                    param_dtype, r.estimate.hardware,
                                                    choice.tp), choice.tp)
                 for r in runs)
    adds = 0.0
    run = runs[0]
    if len(runs) == 1 and (run.microbatches or run.key.microbatches) == 1 < choice.microbatches:
        # FSDP2 (data parallelism, or any layout with mixed precision: apply_layout shards then
        # even at degree 1) adds the reduced shard to the gradient's local tensor; without it
        # autograd adds each DTensor gradient of tensor parallelism through DTensor's dispatch
        fsdp2 = choice.dp > 1 or run.key.mixed_precision is not None
        adds = (choice.microbatches - 1) * seconds(accumulation_estimate(
            run.parameter_bytes // size, param_dtype, run.estimate.hardware,
            max(1, run.parameter_tensors), run.parameters_dtensor and not fsdp2))
    return update, adds


def step_time(runs: Sequence[RoleRun], choice: Choice, links: Links, *,
              bound: bool = False, param_dtype: torch.dtype | None = None) -> StepTime:
    """The step time of ``choice`` from its roles (one run, or one per pipeline stage).

    A role's run covers ``runs[i].microbatches`` (else ``key.microbatches``) microbatches; its
    work is scaled to the step's ``choice.microbatches`` (products and collectives are per
    microbatch; a stage with more microbatches than ``pp + 2`` is at the step's already). With stages,
    the 1F1B schedule of ``choice.microbatches`` is replayed with each stage's forward (compute
    and tensor-parallel communication) and backward (with recompute) times per microbatch; the
    step is its makespan plus the exposed FSDP2 and point-to-point time of the slowest stage.

    On a GPU's prediction each phase is the longer of its calls' host and device times, and
    the device's communication (the blocking collectives of the phase, then the step's first
    all-gather and the pipeline's sends) is exposed only beyond the time the device waits for
    the host (:func:`~flopscope.estimate.overlap.host_overlap`, the rule of a serving step
    too): the host issues them without waiting, so a host-bound step runs them in its wait.

    Args:
        runs: the roles, in stage order.
        choice: the layout.
        links: the collectives' links.
        bound: the compute at the roofline bound even where the profile has a calibration
            (the step's bound-based time, shown beside the prediction).
        param_dtype: the parameters' dtype: the optimizer's update and the gradients'
            accumulation counted in it (:attr:`StepTime.optimizer`,
            :attr:`StepTime.accumulation`); ``None``: left out.

    Returns:
        The :class:`StepTime`.
    """
    stages = [_stage(r, choice, links, choice.microbatches / (r.microbatches or r.key.microbatches),
                     bound) for r in runs]
    if len(stages) == 1:
        span = stages[0].busy
        slow = stages[0]
    else:
        m = choice.microbatches
        fwd = [Fraction((s.forward + s.exposed_forward) / m) for s in stages]
        bwd = [Fraction((s.backward + s.recompute + s.exposed_backward) / m)
               for s in stages]
        _, idle = bubble(one_f_one_b(len(stages), m), fwd, bwd)
        slow = max(stages, key=lambda s: s.busy)
        i = stages.index(slow)
        span = slow.busy / float(1 - idle[i]) if idle[i] < 1 else slow.busy
    exposed = max(s.exposure.fsdp for s in stages)
    hidden = max(s.fsdp for s in stages) - exposed
    p2p = max(s.exposure.p2p for s in stages)
    update, adds = _after_backward(runs, choice, links, param_dtype, bound)
    total = span + exposed + p2p + update + adds
    kind = "prediction" if not bound and all(r.estimate.calibrated for r in runs) else "bound"
    return StepTime(slow.forward, slow.backward, slow.recompute, slow.tp_comm, exposed,
                    max(0.0, hidden), p2p, span - slow.busy, total, ep_comm=slow.ep_comm,
                    compute=kind, fsdp_hooks=slow.hooks, optimizer=update, accumulation=adds)


#: the parts of a step by :meth:`StepTime.parts` key, as the table names them
PART_NAMES = {"forward": "forward compute", "backward": "backward compute",
              "recompute": "recomputation (checkpointing)",
              "tp_comm": "tensor-parallel collectives",
              "fsdp_comm": "FSDP gathers/reduce-scatters (exposed)",
              "p2p": "pipeline sends/receives", "bubble": "pipeline bubble",
              "ep_comm": "expert all-to-alls", "fsdp_hooks": "FSDP2 hooks (host)",
              "optimizer": "optimizer update (AdamW)",
              "accumulation": "gradient accumulation"}


def describe(time: StepTime) -> list[tuple[str, float, float]]:
    """Where the time goes: (part, seconds, share of the step), largest first.

    Args:
        time: a step time.

    Returns:
        The parts with a non-zero time.
    """
    parts: list[tuple[str, float, float]] = [
        (PART_NAMES[k], v, v / time.total if time.total else 0.0)
        for k, v in time.parts().items() if v > 0]
    return sorted(parts, key=lambda p: -p[1])


def compare(best: StepTime, other: StepTime) -> list[tuple[str, float]]:
    """Why one step is shorter than another: the parts where they differ, ``other - best``
    (positive: ``other`` spends more there), the largest differences first.

    Args:
        best: the shorter step.
        other: the step it is compared with.

    Returns:
        (part, seconds more in ``other``) for the parts that differ.
    """
    mine, theirs = best.parts(), other.parts()
    diff = [(PART_NAMES[k], theirs[k] - mine[k]) for k in mine if theirs[k] != mine[k]]
    return sorted(diff, key=lambda d: -abs(d[1]))
