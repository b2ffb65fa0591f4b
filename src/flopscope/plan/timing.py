"""The time of one training step of a layout, from its roles' counts: ONE function,
:func:`step_time`, so that a calibrated prediction can replace the roofline bound in one place.

Parts (seconds per step, on the layout's slowest stage):

- **compute**: the roofline time of the rank's counted calls (forward, backward; a lower bound:
  every call at the hardware's peak FLOP rate or memory bandwidth, whichever binds);
- **recompute**: the forward work activation checkpointing runs again in backward (its phase);
- **tensor-parallel communication**: every all-reduce exposed (it sits between two products);
- **FSDP communication**: the parameters' all-gathers and the gradients' reduce-scatters run
  beside compute, prefetched; only the first all-gather of a step is exposed, and whatever the
  rest needs beyond the compute time; DDP's gradient all-reduces (a vision model's
  ``data_parallel="ddp"`` layouts) the same way, one bucket (one block's gradients) exposed;
- **pipeline point-to-point**: activations and gradients between stages, exposed;
- **expert all-to-alls** (expert parallelism): the tokens' dispatch to their experts' ranks and
  the results' return, exposed;
- **pipeline bubble**: 1F1B's idle time, replayed with each stage's forward and backward times
  (:func:`flopscope.distributed.pipeline.bubble`).

A collective of ``B`` bus bytes (the ring convention, :mod:`flopscope.rules.collectives`) over a
group that stays inside one node takes ``B / intra_node_bandwidth + latency``; one that spans
nodes ``B / inter_node_bandwidth + latency`` (the ring runs at its slowest link). Tensor-parallel
ranks are neighbours, so a TP group is inside a node when ``tp <= gpus_per_node``; an FSDP group
(stride ``tp``) when ``tp x dp <= gpus_per_node``; a pipeline group when the whole layout is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from fractions import Fraction

from flopscope.cost import Phase
from flopscope.distributed.pipeline import bubble
from flopscope.errors import UsageError
from flopscope.estimate import Hardware
from flopscope.plan.roles import RoleRun
from flopscope.plan.space import Choice
from flopscope.report.records import CommRecord

__all__ = ["PART_NAMES", "Links", "ServeTime", "StepTime", "compare", "describe", "one_f_one_b",
           "serve_step_time", "step_time"]

_TP_KINDS = ("all_reduce",)
_FSDP_KINDS = ("all_gather", "reduce_scatter")
_P2P_KINDS = ("send", "recv")
_EP_KINDS = ("all_to_all",)


@dataclass(frozen=True)
class Links:
    """The links collectives run over.

    Attributes:
        intra_bandwidth: bytes/s per device, one direction, inside a node.
        intra_latency: seconds per call inside a node.
        inter_bandwidth: bytes/s per device across nodes.
        inter_latency: seconds per call across nodes.
        gpus_per_node: devices per node.
    """

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    gpus_per_node: int

    @classmethod
    def of(cls, hardware: Hardware, gpus_per_node: int) -> Links:
        """The links of a hardware profile.

        Args:
            hardware: the profile.
            gpus_per_node: devices per node.

        Returns:
            The links.

        Raises:
            UsageError: the profile has no link figures.
        """
        if hardware.intra_node_bandwidth is None or hardware.inter_node_bandwidth is None:
            raise UsageError(
                f"hardware {hardware.name!r} has no link bandwidths for collectives: use a "
                "profile that has them (h100-sxm, h200, a100-80gb ...) or a profile file with "
                "intra_node_gb_s and inter_node_gb_s")
        return cls(hardware.intra_node_bandwidth, hardware.intra_node_latency,
                   hardware.inter_node_bandwidth, hardware.inter_node_latency, gpus_per_node)

    def seconds(self, records: Iterable[CommRecord], span: int) -> float:
        """Time of collectives over groups whose ranks span ``span`` consecutive ranks."""
        inside = span <= self.gpus_per_node
        bandwidth = self.intra_bandwidth if inside else self.inter_bandwidth
        latency = self.intra_latency if inside else self.inter_latency
        return sum(r.bus_bytes / bandwidth + r.calls * latency for r in records)


@dataclass(frozen=True)
class StepTime:
    """Where one step's time goes (seconds; the slowest stage's view).

    Attributes:
        forward: the rank's forward compute.
        backward: its backward compute.
        recompute: forward work run again by activation checkpointing.
        tp_comm: tensor-parallel all-reduces (exposed).
        fsdp_comm: FSDP2 all-gathers and reduce-scatters left exposed.
        fsdp_hidden: FSDP2 communication hidden behind compute (not in the total).
        p2p: pipeline sends and receives (exposed).
        bubble: pipeline idle time.
        total: the step.
        ep_comm: expert parallelism's all-to-alls (dispatch and combine; exposed).
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

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready dict (seconds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

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
    forward: float
    backward: float
    recompute: float
    tp_forward: float
    tp_backward: float
    fsdp_first: float
    fsdp_rest: float
    p2p: float
    ep_comm: float = 0.0

    @property
    def tp_comm(self) -> float:
        return self.tp_forward + self.tp_backward

    @property
    def busy(self) -> float:
        return self.forward + self.backward + self.recompute + self.tp_comm + self.ep_comm


def _stage(run: RoleRun, choice: Choice, links: Links, scale: float) -> _Stage:
    phases = run.estimate.by_phase
    comm = run.report.communication

    def phase(name: str) -> float:
        row = phases.get(name)
        return row.time_s if row is not None else 0.0

    # DDP's all-reduces are the gradients' (overlapped with backward like FSDP2's
    # reduce-scatters), tensor parallelism's sit between two products
    ddp = choice.data_parallel == "ddp"
    tp = [] if ddp else [c for c in comm if c.kind in _TP_KINDS]
    fsdp = [c for c in comm if c.kind in _FSDP_KINDS or (ddp and c.kind in _TP_KINDS)]
    p2p = [c for c in comm if c.kind in _P2P_KINDS]
    span = choice.tp * choice.dp
    fsdp_total = links.seconds(fsdp, span)
    # exposed at least: FSDP2's first gather (nothing to hide it behind), DDP's last bucket
    gathers = [c for c in fsdp if (c.kind == "all_gather" and c.phase is Phase.FORWARD)
               or (ddp and c.kind in _TP_KINDS)]
    first = (links.seconds([gathers[0]], span) / gathers[0].calls) if gathers else 0.0
    return _Stage(
        forward=phase(Phase.FORWARD.value) * scale,
        backward=phase(Phase.BACKWARD.value) * scale,
        recompute=phase(Phase.RECOMPUTE.value) * scale,
        tp_forward=links.seconds([c for c in tp if c.phase is Phase.FORWARD], choice.tp) * scale,
        tp_backward=links.seconds([c for c in tp if c.phase is not Phase.FORWARD],
                                  choice.tp) * scale,
        fsdp_first=first,
        fsdp_rest=fsdp_total * scale - first,
        p2p=links.seconds(p2p, choice.gpus) * scale,
        # the dispatch and combine sit between the router and the experts: exposed; an
        # expert group is ep neighbouring ranks
        ep_comm=links.seconds([c for c in comm if c.kind in _EP_KINDS], choice.ep) * scale,
    )


def step_time(runs: Sequence[RoleRun], choice: Choice, links: Links) -> StepTime:
    """The step time of ``choice`` from its roles (one run, or one per pipeline stage).

    A role's run covers ``runs[i].key.microbatches`` microbatches; its work is scaled to the
    step's ``choice.microbatches`` (products and collectives are per microbatch). With stages,
    the 1F1B schedule of ``choice.microbatches`` is replayed with each stage's forward (compute
    and tensor-parallel communication) and backward (with recompute) times per microbatch; the
    step is its makespan plus the exposed FSDP2 and point-to-point time of the slowest stage.

    Args:
        runs: the roles, in stage order.
        choice: the layout.
        links: the collectives' links.

    Returns:
        The :class:`StepTime`.
    """
    stages = [_stage(r, choice, links, choice.microbatches / r.key.microbatches) for r in runs]
    if len(stages) == 1:
        span = stages[0].busy
        slow = stages[0]
    else:
        m = choice.microbatches
        fwd = [Fraction((s.forward + s.tp_forward) / m) for s in stages]
        bwd = [Fraction((s.backward + s.recompute + s.tp_backward) / m) for s in stages]
        _, idle = bubble(one_f_one_b(len(stages), m), fwd, bwd)
        slow = max(stages, key=lambda s: s.busy)
        i = stages.index(slow)
        span = slow.busy / float(1 - idle[i]) if idle[i] < 1 else slow.busy
    exposed = max(s.fsdp_first + max(0.0, s.fsdp_rest - s.busy) for s in stages)
    hidden = max(s.fsdp_first + s.fsdp_rest for s in stages) - exposed
    p2p = max(s.p2p for s in stages)
    total = span + exposed + p2p
    return StepTime(slow.forward, slow.backward, slow.recompute, slow.tp_comm, exposed,
                    max(0.0, hidden), p2p, span - slow.busy, total, slow.ep_comm)


@dataclass(frozen=True)
class ServeTime:
    """One forward of a decode loop (a prefill or a decode step) on a serving layout, seconds,
    as :func:`step_time` sees a training step: a lower bound.

    Attributes:
        compute: the roofline time of the tensor-parallel rank's calls, every stage's layers in
            turn (a batch passes the stages one after the other).
        tp_comm: the tensor-parallel all-reduces (exposed: each sits between two products).
        p2p: the hidden states handed from stage to stage (``pp - 1`` sends, exposed).
        total: the step.
    """

    compute: float
    tp_comm: float
    p2p: float
    total: float

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready dict (seconds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def mean(a: ServeTime, b: ServeTime) -> ServeTime:
        """The part-by-part mean of two steps (a decode step's time is linear in its context,
        so the first and last steps' mean is the mean over the loop)."""
        return ServeTime(*((getattr(a, f.name) + getattr(b, f.name)) / 2 for f in fields(a)))


def serve_step_time(compute: float, communication: Iterable[CommRecord], boundary_bytes: int,
                    tp: int, pp: int, links: Links) -> ServeTime:
    """The time of one forward of a decode loop on ``tp`` x ``pp`` devices: the sibling of
    :func:`step_time` for serving, the same parts and link model.

    Args:
        compute: the roofline time of the step's calls on one tensor-parallel rank (all layers).
        communication: the step's collectives on that rank (tensor-parallel all-reduces).
        boundary_bytes: what one stage hands the next (a decoder layer's output).
        tp: tensor-parallel degree.
        pp: pipeline stages.
        links: the collectives' links.

    Returns:
        The :class:`ServeTime`.
    """
    tp_comm = links.seconds([c for c in communication if c.kind in _TP_KINDS], tp)
    sends = pp - 1
    p2p = links.seconds([CommRecord("", Phase.FORWARD, "send", 2, sends, boundary_bytes * sends,
                                    boundary_bytes * sends)], tp * pp) if sends else 0.0
    return ServeTime(compute, tp_comm, p2p, compute + tp_comm + p2p)


#: the parts of a step by :meth:`StepTime.parts` key, as the table names them
PART_NAMES = {"forward": "forward compute", "backward": "backward compute",
              "recompute": "recomputation (checkpointing)",
              "tp_comm": "tensor-parallel all-reduces",
              "fsdp_comm": "FSDP gathers/reduce-scatters (exposed)",
              "p2p": "pipeline sends/receives", "bubble": "pipeline bubble",
              "ep_comm": "expert all-to-alls"}


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
