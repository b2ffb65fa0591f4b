"""The time of one forward of a serving layout's decode loop (a prefill or a decode step), from
its serving role's counts: the sibling of :func:`flopscope.plan.timing.step_time` for serving,
the same link model and the same rule for the host (:func:`serve_step_time`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from flopscope.cost import Phase
from flopscope.estimate.bound import Estimate, Row
from flopscope.estimate.comm_time import Links
from flopscope.estimate.overlap import host_overlap, row_parts
from flopscope.report.records import CommRecord

__all__ = ["ServeTime", "forward_parts", "forward_seconds", "micro_batch", "row_seconds",
           "serve_step_time"]


@dataclass(frozen=True)
class ServeTime:
    """One forward of a decode loop (a prefill or a decode step) on a serving layout, seconds,
    as :func:`~flopscope.plan.timing.step_time` sees a training step.

    Attributes:
        compute: the tensor-parallel rank's calls, every stage's layers in turn (one
            micro-batch through the stages): their prediction or their roofline bound
            (:attr:`kind`, :func:`forward_parts`); on a GPU's prediction the device's time
            only (the host's is :attr:`host`).
        tp_comm: the tensor-parallel collectives (each sits between two products on the
            device): the all-reduces, and with a mixture of experts' experts sharded the
            all-gather of the group's token slices.
        p2p: the hidden states handed from stage to stage (``pp - 1`` sends).
        total: the step: ``compute + tp_comm + ep_comm + p2p + host_wait``.
        kind: ``"prediction"`` (the profile's calibration) or ``"bound"`` (roofline): what
            :attr:`compute` is.
        host: on a GPU's prediction, the host's time issuing the calls (0 elsewhere: a CPU's
            is in :attr:`compute`, the bound has none).
        host_wait: the time the device waits for the host beyond its own work, ``host -
            (compute + tp_comm + p2p)`` where positive: the step is **host-bound** (eager
            PyTorch issuing its calls one by one; the collectives and sends run on the device
            in the time it waits).
        calls: the operator calls of the step on the rank (their host time is :attr:`host`).
        ep_comm: a mixture of experts' all-to-alls (the tokens' dispatch to their experts'
            ranks and the results' return; between the router and the experts).
    """

    compute: float
    tp_comm: float
    p2p: float
    total: float
    kind: str = "bound"
    host: float = 0.0
    host_wait: float = 0.0
    calls: float = 0.0
    ep_comm: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready dict (seconds; the parts and the total, not :attr:`kind` or
        :attr:`calls`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("kind", "calls")}

    @property
    def device_only(self) -> float:
        """The step without the host's wait: the device's work, all-reduces and sends (what
        CUDA graphs or a compiled step approach where the step is host-bound)."""
        return self.compute + self.tp_comm + self.ep_comm + self.p2p

    def scaled(self, factor: float) -> ServeTime:
        """Every part and the total times ``factor`` (a pipeline's fill: a prefill's
        micro-batches one stage apart)."""
        if factor == 1:
            return self
        return ServeTime(self.compute * factor, self.tp_comm * factor, self.p2p * factor,
                         self.total * factor, self.kind, self.host * factor,
                         self.host_wait * factor, self.calls * factor, self.ep_comm * factor)

    @staticmethod
    def mean(a: ServeTime, b: ServeTime) -> ServeTime:
        """The part-by-part mean of two steps (a decode step's time is linear in its context,
        so the first and last steps' mean is the mean over the loop)."""
        return ServeTime((a.compute + b.compute) / 2, (a.tp_comm + b.tp_comm) / 2,
                         (a.p2p + b.p2p) / 2, (a.total + b.total) / 2,
                         a.kind if a.kind == b.kind else "bound", (a.host + b.host) / 2,
                         (a.host_wait + b.host_wait) / 2, (a.calls + b.calls) / 2,
                         (a.ep_comm + b.ep_comm) / 2)


def forward_seconds(estimate: Estimate, *, bound: bool = False) -> float:
    """The compute of one forward's calls (a serving step's), as :func:`~flopscope.plan.timing.step_time` takes a
    training phase's: the prediction where the profile has a calibration (on a GPU the longer of
    the calls' host and device times: the host issues kernels while the device runs earlier
    ones; on a CPU their sum, one timeline), else (or with ``bound``) the roofline bound.

    Args:
        estimate: the forward's estimate (one phase).
        bound: the roofline bound whatever the profile.

    Returns:
        Seconds.
    """
    return row_seconds(estimate.total, estimate, bound=bound)


def row_seconds(row: Row, estimate: Estimate, *, bound: bool = False) -> float:
    """The time of a row of ``estimate``'s calls (a phase, a forward): the prediction where the
    profile has a calibration, else (or with ``bound``) the roofline bound. On a GPU the longer
    of the calls' host and device times (:func:`~flopscope.estimate.overlap.host_overlap`:
    the host issues kernels while the device runs earlier ones); on a CPU their sum (one
    timeline).

    Args:
        row: the summed calls.
        estimate: the estimate they are of (its profile's calibration).
        bound: the roofline bound whatever the profile.

    Returns:
        Seconds.
    """
    device, host = row_parts(row, estimate, bound=bound)
    return host_overlap(host, device)[0]


def forward_parts(estimate: Estimate, *, bound: bool = False) -> tuple[float, float]:
    """A serving forward's calls as (device time, host time)
    (:func:`~flopscope.estimate.overlap.row_parts` of its total; a step takes the longer of
    the host and the device's work with its collectives: :func:`serve_step_time`).

    Args:
        estimate: the forward's estimate (one phase).
        bound: the roofline bound whatever the profile.

    Returns:
        (seconds of compute, seconds of host time beside it).
    """
    return row_parts(estimate.total, estimate, bound=bound)


def serve_step_time(compute: float, communication: Iterable[CommRecord], boundary_bytes: int,
                    tp: int, pp: int, links: Links, kind: str = "bound", *, host: float = 0.0,
                    calls: int = 0) -> ServeTime:
    """The time of one forward of a decode loop on ``tp`` x ``pp`` devices: the sibling of
    :func:`~flopscope.plan.timing.step_time` for serving, the same parts and link model. On a GPU's prediction the
    host issues every call, collective and send without waiting for the device (a
    tensor-parallel all-reduce and a send are kernels on the device's stream, ordered between
    the products around them), so the step is the longer of the host's time and the device's
    work with its collectives and sends: a host-bound step's collectives run while the device
    waits for the host (:attr:`ServeTime.host_wait`).

    Args:
        compute: the step's calls on one tensor-parallel rank (all layers), seconds
            (:func:`forward_parts`: on a GPU's prediction the device's time).
        communication: the step's collectives on that rank (tensor-parallel all-reduces; a
            mixture of experts' all-to-alls and all-gathers).
        boundary_bytes: what one stage hands the next (a decoder layer's output).
        tp: tensor-parallel degree.
        pp: pipeline stages.
        links: the collectives' links.
        kind: what ``compute`` is: ``"prediction"`` or ``"bound"``.
        host: on a GPU's prediction, the calls' host time (0: none apart from ``compute``).
        calls: the step's operator calls on the rank.

    Returns:
        The :class:`ServeTime`.
    """
    collectives = list(communication)
    tp_comm = links.seconds([c for c in collectives if c.kind != "all_to_all"], tp)
    ep_comm = links.seconds([c for c in collectives if c.kind == "all_to_all"], tp)
    sends = pp - 1
    p2p = links.seconds([CommRecord("", Phase.FORWARD, "send", 2, sends, boundary_bytes * sends,
                                    boundary_bytes * sends)], tp * pp) if sends else 0.0
    device = compute + tp_comm + ep_comm + p2p  # the collectives and sends on the device's stream
    total = host_overlap(host, device)[0]
    return ServeTime(compute, tp_comm, p2p, total, kind, host, total - device, calls, ep_comm)


def micro_batch(batch: int, pp: int) -> int:
    """The sequences of one of the ``pp`` micro-batches a pipeline of ``pp`` stages keeps in
    flight when it serves ``batch`` sequences (the last one smaller where ``pp`` does not
    divide ``batch``).

    Args:
        batch: sequences per replica.
        pp: pipeline stages.

    Returns:
        ``ceil(batch / pp)``.
    """
    return -(-batch // pp)
