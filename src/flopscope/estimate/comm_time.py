"""Communication time: each collective of a rank from its kind, bus bytes, group and link, and
how much of it a training step exposes. The one model, used by the planner
(:func:`flopscope.plan.timing.step_time`) and by a simulated rank's report with ``--hardware``
(:func:`rank_step`).

**One collective** of ``B`` bus bytes (the ring convention of :mod:`flopscope.rules.collectives`:
all-reduce 2 (n-1)/n of the payload, all-gather and reduce-scatter (n-1)/n, broadcast and
point-to-point 1) takes ``latency + B / bandwidth`` (alpha-beta) on its link: inside a node when
the ranks of its group lie within one node, across nodes otherwise (a ring runs at its slowest
link). The latency and bandwidth are the profile's link fields; where the profile carries a
link calibration (``flopscope calibrate --comm``), the fit of the collective's own kind for the
link it measured (at the collective's group size where it was measured at that size). Ranks
are numbered with tensor-parallel ranks neighbours, then FSDP / data
parallel, then pipeline stages (:class:`flopscope.distributed.Layout`), so a tensor-parallel group
spans ``tp`` consecutive ranks, an FSDP group ``tp x dp`` (stride ``tp``), a pipeline group the
whole layout.

**Overlap with compute** (:class:`CommTime`):

- **blocking, exposed**: tensor parallelism's all-reduces (each sits between two matrix
  products: the next cannot start without it), expert parallelism's all-to-alls, broadcasts
  and the rest of the kinds not named below;
- **pipeline point-to-point** (send, recv): exposed;
- **FSDP2's all-gathers and reduce-scatters**: run on their own stream / thread beside compute;
  the all-gather of the next layer is prefetched while this one computes, the gradients'
  reduce-scatters run while backward goes on. Exposed: the step's first all-gather (nothing to
  hide it behind) and whatever the rest need beyond the compute and blocking time they run
  beside: ``first + max(0, rest - busy)``;
- **DDP's gradient all-reduces** (``ddp=True``: a data-parallel layout that replicates the
  model) the same way, overlapped with backward bucket by bucket; one bucket (the first
  all-reduce call) is exposed. They run once a step (DDP's ``no_sync`` over the step's
  microbatches but the last; a pipeline's schedule the same), so they are not scaled with
  the microbatches, and they hide only behind the backward they run in (the caller's
  ``window``: one microbatch's).

Where the links are gloo's (a link calibration measured with the ``gloo`` backend: ranks on CPU
cores), nothing overlaps: gloo's transfers run on the cores the ranks compute on, so FSDP2's and
DDP's collectives are exposed where they run, as the blocking ones are (:attr:`Links.overlap`).

Which parallelism issued a collective is told by its group (``CommRecord.group``: the device
mesh's dimension): an all-gather or reduce-scatter over the tensor-parallel group (``tp``:
sequence parallelism's, before and after attention and the MLP) is blocking and exposed, as the
all-reduces it replaces; over the data-parallel group (``dp``), FSDP2's, overlapped. A record
without a group (an older report) is sorted by its kind alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flopscope.cost import Phase
from flopscope.errors import UsageError
from flopscope.estimate.link_calibration import LinkCalibration
from flopscope.estimate.overlap import host_overlap, phase_times, row_parts
from flopscope.estimate.profile import Hardware
from flopscope.report.records import CommRecord

if TYPE_CHECKING:
    from flopscope.estimate.bound import Estimate

__all__ = ["OVERLAPPED_KINDS", "P2P_KINDS", "CommTime", "Exposure", "Links", "RankStep",
           "comm_time", "rank_step"]

OVERLAPPED_KINDS = ("all_gather", "reduce_scatter")
"""FSDP2's collectives: prefetched / overlapped with compute."""
P2P_KINDS = ("send", "recv")
"""Pipeline point-to-point: exposed."""
_TP_KINDS = ("all_reduce",)


@dataclass(frozen=True)
class Links:
    """The links collectives run over (alpha-beta per link, per kind where calibrated).

    Attributes:
        intra_bandwidth: bytes/s per device, one direction, inside a node.
        intra_latency: seconds per call inside a node.
        inter_bandwidth: bytes/s per device across nodes (``None``: unknown; a group that
            crosses nodes is then an error).
        inter_latency: seconds per call across nodes.
        gpus_per_node: devices per node.
        calibration: the profile's link calibration (its fits, per kind and group size, are
            preferred over the link fields on the link it measured).
        source: where the figures come from, for reports.
        overlap: collectives can run beside compute (a device's copy engines and NCCL's
            kernels); ``False`` for gloo's links (the CPU cores that compute move the data).
    """

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float | None
    inter_latency: float
    gpus_per_node: int
    calibration: LinkCalibration | None = None
    source: str = "the profile's link fields"
    overlap: bool = True

    @classmethod
    def of(cls, hardware: Hardware, gpus_per_node: int, gpus: int | None = None) -> Links:
        """The links of a hardware profile.

        Args:
            hardware: the profile.
            gpus_per_node: devices per node.
            gpus: devices in the job, when known: a job larger than a node needs the
                inter-node figures.

        Returns:
            The links.

        Raises:
            UsageError: the profile has no link figures (or none across nodes for a job that
                spans nodes).
        """
        if hardware.intra_node_bandwidth is None:
            raise UsageError(
                f"hardware {hardware.name!r} has no link bandwidths for collectives: use a "
                "profile that has them (h100-sxm, h200, a100-80gb ...), a profile file with "
                "intra_node_gb_s and inter_node_gb_s, or measure them here with "
                "'flopscope calibrate --comm --ranks N'")
        if gpus is not None and gpus > gpus_per_node and hardware.inter_node_bandwidth is None:
            raise UsageError(
                f"hardware {hardware.name!r} has no inter-node link figures and {gpus} devices "
                f"span more than one node of {gpus_per_node}: give --gpus-per-node {gpus} or a "
                "profile with inter_node_gb_s")
        cal = hardware.link_calibration
        source = "the profile's link fields"
        if cal is not None:
            source = (f"calibrated {cal.date[:10]} ({cal.backend}, {cal.ranks} ranks, "
                      f"{cal.link}-node)")
        return cls(hardware.intra_node_bandwidth, hardware.intra_node_latency,
                   hardware.inter_node_bandwidth, hardware.inter_node_latency, gpus_per_node,
                   cal, source, overlap=cal is None or cal.backend != "gloo")

    def call_seconds(self, kind: str, bus_bytes: int, calls: int, span: int,
                     group_size: int = 0) -> float:
        """Time of ``calls`` collectives of ``kind`` over ``group_size`` ranks moving
        ``bus_bytes`` in all, over groups whose ranks span ``span`` consecutive ranks.

        Raises:
            UsageError: the group crosses nodes and the links have no inter-node figures.
        """
        inside = span <= self.gpus_per_node
        cal = self.calibration
        if cal is not None and (cal.link == "intra") == inside:
            fit = cal.fit_for(kind, group_size)
            if fit is not None:
                return fit.seconds(bus_bytes, calls)
        bandwidth = self.intra_bandwidth if inside else self.inter_bandwidth
        if bandwidth is None:
            raise UsageError(f"a {kind} over {span} ranks crosses nodes of {self.gpus_per_node} "
                             "and the profile has no inter-node link figures")
        latency = self.intra_latency if inside else self.inter_latency
        return bus_bytes / bandwidth + calls * latency

    def seconds(self, records: Iterable[CommRecord], span: int) -> float:
        """Time of collectives over groups whose ranks span ``span`` consecutive ranks."""
        return sum(self.call_seconds(r.kind, r.bus_bytes, r.calls, span, r.group_size)
                   for r in records)


@dataclass(frozen=True)
class CommTime:
    """A rank's communication over one step, sorted by the overlap rules (seconds).

    Attributes:
        blocking_forward: blocking collectives (tensor-parallel all-reduces, all-to-alls ...)
            in forward.
        blocking_backward: the same in backward (and recomputation).
        overlapped_first: the step's first FSDP2 all-gather (exposed).
        overlapped_rest: every other FSDP2 all-gather and reduce-scatter (hidden behind
            compute where it fits).
        p2p: pipeline sends and receives (exposed).
        by_kind: kind -> seconds (everything, exposed or not).
    """

    blocking_forward: float
    blocking_backward: float
    overlapped_first: float
    overlapped_rest: float
    p2p: float
    by_kind: Mapping[str, float] = field(default_factory=dict)

    @property
    def blocking(self) -> float:
        """Blocking collectives' time (exposed)."""
        return self.blocking_forward + self.blocking_backward

    @property
    def total(self) -> float:
        """Every collective's time."""
        return self.blocking + self.overlapped_first + self.overlapped_rest + self.p2p

    def exposure(self, compute: float, *, wait_forward: float = 0.0,
                 wait_backward: float = 0.0, hooks: float = 0.0,
                 window: float | None = None) -> Exposure:
        """What a step exposes of this communication beside ``compute`` seconds of phases, in
        which the device waits ``wait_forward`` and ``wait_backward`` seconds for the host
        (a GPU's prediction; 0 on a CPU and at the bound), by
        :func:`~flopscope.estimate.overlap.host_overlap`: a phase's blocking collectives are
        exposed beyond its own wait; the step's first FSDP2 all-gather, then the pipeline's
        sends, beyond the wait the blocking ones left (device work outside the phases, in the
        step's order); the other FSDP2 collectives run on their own stream beside the whole
        step (its phases, blocking collectives and ``hooks``, FSDP2's host time on a CPU) less
        the part of it that the first gather held where it hid, and are exposed beyond that:
        the stream's work, the first gather and the rest, is never shorter than the step.
        With ``window`` they run beside that much of the step at most (DDP's all-reduces:
        the backward of the microbatch they run in).

        Args:
            compute: the phases' time (each the longer of its host and device times).
            wait_forward: the device's wait for the host in forward.
            wait_backward: the same in backward and recomputation.
            hooks: FSDP2's hooks on the rank's one timeline (seconds).
            window: the most of the step's busy time the overlapped collectives run beside
                (``None``: all of it).

        Returns:
            The :class:`Exposure`.
        """
        forward = host_overlap(wait_forward, 0.0, self.blocking_forward)[1]
        backward = host_overlap(wait_backward, 0.0, self.blocking_backward)[1]
        left = (max(0.0, wait_forward - self.blocking_forward)
                + max(0.0, wait_backward - self.blocking_backward))
        first = self.overlapped_first
        first_exposed = host_overlap(left, 0.0, first)[1]
        p2p = host_overlap(max(0.0, left - first), 0.0, self.p2p)[1]
        busy = compute + forward + backward + hooks
        if window is not None:
            busy = min(busy, window)
        # the rest share FSDP2's stream with the first gather: they overlap the step's busy
        # time but the part of it that the hidden first gather held
        rest = max(0.0, self.overlapped_rest - (busy - (first - first_exposed)))
        return Exposure(forward, backward, first_exposed + rest, p2p)

    def exposed(self, compute: float) -> float:
        """Communication time a step exposes beside ``compute`` seconds of compute, the
        device never waiting for the host (:meth:`exposure`'s total)."""
        return self.exposure(compute).total


@dataclass(frozen=True)
class Exposure:
    """What a step exposes of its communication (seconds; :meth:`CommTime.exposure`).

    Attributes:
        blocking_forward: forward's blocking collectives beyond forward's wait for the host.
        blocking_backward: backward's (and recomputation's) beyond theirs.
        fsdp: FSDP2's (the first all-gather beyond the waits left, the rest beyond the step).
        p2p: the pipeline's sends and receives beyond the waits left after the first gather.
    """

    blocking_forward: float
    blocking_backward: float
    fsdp: float
    p2p: float

    @property
    def blocking(self) -> float:
        """The blocking collectives exposed."""
        return self.blocking_forward + self.blocking_backward

    @property
    def total(self) -> float:
        """Everything exposed."""
        return self.blocking + self.fsdp + self.p2p


def comm_time(records: Iterable[CommRecord], links: Links, *, tp: int = 1, dp: int = 1,
              gpus: int | None = None, scale: float = 1.0, ddp: bool = False) -> CommTime:
    """Sort a rank's collectives by the overlap rules and time them (module docstring).

    Args:
        records: the rank's communication records (``Report.communication``).
        links: the links.
        tp: tensor-parallel degree (a TP group's span).
        dp: FSDP / data-parallel degree (an FSDP group spans ``tp x dp`` ranks).
        gpus: ranks in the job (a pipeline group's span; default ``tp x dp``).
        scale: the step's microbatches over the simulated ones (every time but the first
            all-gather and DDP's all-reduces is per microbatch).
        ddp: the all-reduces are DDP's gradient buckets (overlapped, one bucket exposed, once
            a step), not tensor parallelism's.

    Returns:
        The :class:`CommTime`.
    """
    world = gpus if gpus is not None else tp * dp
    fwd = bwd = first = rest = p2p = 0.0
    by_kind: dict[str, float] = {}
    first_seen = False
    for r in records:
        tensor_parallel = r.group == "tp" or (r.kind in _TP_KINDS and not ddp)
        overlapped = ((r.kind in OVERLAPPED_KINDS or (ddp and r.kind in _TP_KINDS))
                      and not tensor_parallel)
        if overlapped:
            span = tp * dp
        elif tensor_parallel:
            span = tp
        elif r.kind in P2P_KINDS:
            span = world
        else:
            span = r.group_size
        seconds = links.call_seconds(r.kind, r.bus_bytes, r.calls, span, r.group_size)
        times = 1.0 if ddp and overlapped and r.kind in _TP_KINDS else scale  # DDP: once a step
        by_kind[r.kind] = by_kind.get(r.kind, 0.0) + seconds * times
        overlapped = overlapped and links.overlap  # gloo: on the cores that compute
        if overlapped:
            if (not first_seen and r.calls > 0
                    and ((r.kind == "all_gather" and r.phase is Phase.FORWARD)
                         or r.kind in _TP_KINDS)):
                first_seen = True
                one = seconds / r.calls
                first += one
                rest -= one
            rest += seconds * times
        elif r.kind in P2P_KINDS:
            p2p += seconds * times
        elif r.phase is Phase.FORWARD:
            fwd += seconds * times
        else:
            bwd += seconds * times
    return CommTime(fwd, bwd, first, rest, p2p, by_kind)


@dataclass(frozen=True)
class RankStep:
    """A simulated rank's predicted step: compute plus the communication it exposes.

    Attributes:
        compute: the rank's compute (seconds): the calibrated prediction, or the roofline
            bound where the profile is not calibrated (:attr:`compute_kind`); on a GPU's
            prediction each phase the longer of its host and device times.
        compute_kind: ``"prediction"`` or ``"bound"``.
        comm: its collectives, by the overlap rules.
        exposed: the communication time the step exposes.
        bubble: the pipeline stage's idle fraction (0 without stages).
        total: ``(compute + exposed) / (1 - bubble)``.
        links: where the link figures come from.
        error: the measured relative error of such steps (the link calibration's
            ``error_bars["step"]``), ``None`` when not validated.
    """

    compute: float
    compute_kind: str
    comm: CommTime
    exposed: float
    bubble: float
    total: float
    links: str
    error: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (seconds)."""
        c = self.comm
        return {"kind": "prediction" if self.compute_kind == "prediction" else "bound",
                "compute_s": self.compute, "compute": self.compute_kind,
                "communication_s": c.total, "exposed_s": self.exposed,
                "hidden_s": c.total - self.exposed, "blocking_s": c.blocking,
                "fsdp_s": c.overlapped_first + c.overlapped_rest, "p2p_s": c.p2p,
                "by_kind_s": dict(c.by_kind), "bubble": self.bubble, "step_s": self.total,
                "links": self.links, "error": self.error,
                "overlap": "tensor-parallel all-reduces and all-to-alls blocking; FSDP2 "
                           "all-gathers prefetched and reduce-scatters overlapped with "
                           "backward (the first all-gather exposed); pipeline sends exposed"}


def rank_step(estimate: Estimate, records: Iterable[CommRecord], links: Links, *, tp: int = 1,
              dp: int = 1, gpus: int | None = None, bubble: float = 0.0,
              error: float | None = None) -> RankStep:
    """A simulated rank's step time: its compute (predicted where the profile is calibrated,
    the bound otherwise; on a GPU's prediction each phase the longer of its calls' host and
    device times) plus the communication it exposes (:meth:`CommTime.exposure`: beyond the
    device's wait for the host, the planner's rule), over the pipeline stage's busy fraction.

    Args:
        estimate: the rank's estimate (a :class:`~flopscope.estimate.Estimate`).
        records: its collectives.
        links: the links.
        tp: tensor-parallel degree.
        dp: FSDP / data-parallel degree.
        gpus: ranks in the job.
        bubble: the stage's idle fraction (pipeline).
        error: the measured error of such predictions, if any.

    Returns:
        The :class:`RankStep`.
    """
    calibrated = estimate.calibrated
    compute, host = row_parts(estimate.total, estimate)  # host 0: one timeline, or the bound
    waits = {Phase.FORWARD: 0.0, Phase.BACKWARD: 0.0}
    if host:  # a GPU's prediction: each phase the longer of its host and device times
        compute = 0.0
        for name, (time, wait) in phase_times(estimate).items():
            compute += time
            waits[Phase.FORWARD if name == Phase.FORWARD.value else Phase.BACKWARD] += wait
    comm = comm_time(records, links, tp=tp, dp=dp, gpus=gpus)
    exposed = comm.exposure(compute, wait_forward=waits[Phase.FORWARD],
                            wait_backward=waits[Phase.BACKWARD]).total
    busy = compute + exposed
    total = busy / (1 - bubble) if bubble < 1 else busy
    return RankStep(compute, "prediction" if calibrated else "bound", comm, exposed, bubble,
                    total, links.source, error)
