"""A prediction of each call's time from a profile's calibration (:mod:`.calibration`), beside
the roofline bound (docs/prediction.md has the model, where its error came from, and its
validation).

Per call: its family (:func:`.families.family`); its work (FLOPs for products, convolutions,
attention and pooling, bytes for the rest); its attained rate interpolated among the points of
its own ATen operator, else its family's (linearly in log work for the streaming families; by
inverse-distance weighting in (log work, log intensity[, log reduction length]) for
:data:`.families.SHAPED_FAMILIES`);
device time = max(work / rate, the roofline bound); host time = its operator's tiny call's, grown
with the bytes moved since the operator's last call for the loop-timed families;
predicted = host + device (one timeline on a CPU; on a GPU the step overlaps them,
:func:`overlapped`). A family without points is predicted at its bound (*uncalibrated*).
Nothing is fitted to a model under validation: the points are microbenchmarks
(:mod:`flopscope.estimate.workloads`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from flopscope.estimate.calibration import DTENSOR_POINTWISE, GRAPH_CLOCK, Calibration
from flopscope.estimate.call_record import CallRecord, fields_but
from flopscope.estimate.families import (
    COMPUTE_FAMILIES,
    ROTATED_FAMILIES,
    coords,
    family,
    reduction_length,
    work,
)

__all__ = ["HOST_DOMINATED", "CallPrediction", "Predictor", "overlapped", "predictor"]

HOST_DOMINATED = 0.5
"""A point whose device time is under this fraction of its measured time is host time: the
host times of one family's operators differ by more than the device time there (a scalar
multiply's host time is twice an add's)."""

_NEAREST = 4
_MEMO = 1 << 18  # calls' predictions kept per calibration (then forgotten, to start again)
_HOT_BYTES_LOG2 = 12.0  # a call after one that moved up to 4 KiB: its host time in a loop


@dataclass(frozen=True)
class _Curve:
    """Points (coordinates, log10 attained rate), equal coordinates merged (mean log rate)."""

    points: tuple[tuple[tuple[float, ...], float], ...]

    @classmethod
    def of(cls, raw: Iterable[tuple[tuple[float, ...], float]]) -> _Curve:
        merged: dict[tuple[float, ...], list[float]] = {}
        for c, y in raw:
            merged.setdefault(tuple(round(v, 9) for v in c), []).append(y)
        return cls(tuple(sorted((c, sum(ys) / len(ys)) for c, ys in merged.items())))

    def streaming(self, at: tuple[float, ...], cache_bytes: int) -> tuple[float, ...] | None:
        """``at`` moved to the curve's largest work where that is beyond a last-level cache of
        ``cache_bytes`` (its points there stream from memory) and beyond ``at``'s; ``None``
        where no point is that large."""
        largest = max(c[0] for c, _ in self.points)
        if 10**largest <= cache_bytes:
            return None
        return (max(largest, at[0]), *at[1:])

    def log_rate(self, at: tuple[float, ...]) -> float:
        pts = self.points
        if len(at) == 1:  # linear in log work, constant beyond the ends
            x = at[0]
            if x <= pts[0][0][0]:
                return pts[0][1]
            for (c0, y0), (c1, y1) in zip(pts, pts[1:], strict=False):
                if x <= c1[0]:
                    return y0 + (y1 - y0) * (x - c0[0]) / (c1[0] - c0[0])
            return pts[-1][1]
        # a call without a coordinate its points have (a module rule's cost knows no reduction
        # length) is placed by the coordinates it has
        n = len(at)
        near = sorted(pts, key=lambda p: math.dist(p[0][:n], at))[:_NEAREST]
        weights = []
        for c, y in near:
            d = math.dist(c[:n], at)
            if d == 0:
                return y
            weights.append((1 / d**2, y))
        return sum(w * y for w, y in weights) / sum(w for w, _ in weights)


@dataclass(frozen=True)
class CallPrediction:
    """One call's prediction.

    Attributes:
        family: its family.
        host_s: host time of an eager call of the family.
        device_s: device time (work at the attained rate, at least the roofline bound); the
            bound where uncalibrated.
        calibrated: whether points of the family were found (else the device time is the bound).
    """

    family: str
    host_s: float
    device_s: float
    calibrated: bool

    @property
    def seconds(self) -> float:
        """Predicted time: host plus device."""
        return self.host_s + self.device_s


class Predictor:
    """The calibrated model of one :class:`~.calibration.Calibration` (the module docstring).

    Args:
        calibration: the points and host times.
    """

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self.host = dict(calibration.host_s)
        self.host_op = dict(calibration.host_op_s)
        # host time's growth with the bytes moved since the operator's last call: per operator,
        # and the median over the operators for those not measured
        self._evicted: dict[str, _Curve] = {}
        sizes = [math.log2(n) for n in calibration.evictions]
        extras: list[list[float]] = [[] for _ in sizes]
        for op, seconds in calibration.host_evicted_s.items():
            hot = self.host_op.get(op)
            if hot is None or len(seconds) != len(sizes):
                continue
            extra = [max(s - hot, 0.0) for s in seconds]
            for i, e in enumerate(extra):
                extras[i].append(e)
            self._evicted[op] = _Curve(((( _HOT_BYTES_LOG2,), 0.0),
                                        *(((x,), e) for x, e in zip(sizes, extra, strict=True))))
        if sizes and all(extras):
            self._evicted[""] = _Curve((((_HOT_BYTES_LOG2,), 0.0), *(
                ((x,), statistics.median(e)) for x, e in zip(sizes, extras, strict=True))))
        raw: dict[tuple[str, str, str], list[tuple[tuple[float, ...], float]]] = {}
        # the products' points: (dtype, bytes, their coordinates but work, log bytes per second)
        self._products: list[tuple[str, int, tuple[float, ...], float]] = []
        self._streamed: dict[tuple[str, int], _Curve | None] = {}
        cuda, graphed = calibration.device.startswith("cuda"), calibration.clock == GRAPH_CLOCK
        self._shaped = all(p.reduction > 0 for p in calibration.points
                           if p.family in COMPUTE_FAMILIES)  # else files before it: 2-D
        for p in calibration.points:
            host = self.host_s(p.family, p.op)
            amount = work(p.family, p.flops, p.bytes)
            # CUDA events around an eager loop time the device, or the host where slower (not a
            # rate: dropped); around a graph's replay, the device always; on a CPU the host's
            # time is inside the point's (one timeline)
            device = ((p.seconds if graphed or p.seconds >= 2 * host else 0.0) if cuda
                      else p.seconds - host - calibration.fault_s(p.fresh))
            # a rotation-timed point holds what a model's call pays beyond its loop host time
            floor = 0.0 if p.family in ROTATED_FAMILIES and not cuda else HOST_DOMINATED
            if p.family == "view" or amount <= 0 or device <= 0 or device < floor * p.seconds:
                continue
            point = (coords(p.family, p.flops, p.bytes, p.reduction if self._shaped else 0.0),
                     math.log10(amount / device))
            if p.family == "matmul" and not cuda:  # for the products' streaming floor
                self._products.append((p.dtype, p.bytes, point[0][1:],
                                       math.log10(p.bytes / device)))
            if p.op and p.family not in COMPUTE_FAMILIES:  # the operator's own curve
                raw.setdefault((p.family, p.dtype, "op:" + p.op), []).append(point)
            if p.inplace:  # no new output: no page faults of a fresh allocation
                raw.setdefault((p.family, p.dtype, "inplace"), []).append(point)
                continue
            raw.setdefault((p.family, p.dtype, ""), []).append(point)
            if p.function:
                raw.setdefault((p.family, p.dtype, p.function), []).append(point)
        self._curves = {k: _Curve.of(v) for k, v in raw.items()}
        self._cuda = cuda
        self._memo: dict[tuple[object, ...], CallPrediction] = {}
        # the record's fields a call's prediction is keyed by (see call), with and without the
        # cache model (a CPU with a known cache size reads the reuse distances and sizes)
        placed = ("path", "phase", *(() if self._evicted else ("before",)))
        self._keyed = {True: fields_but(*placed),
                       False: fields_but(*placed, "reuse", "out_bytes")}

    def _curve(self, fam: str, dtype: str, *selectors: str) -> _Curve | None:
        for key in ([(fam, dtype, s) for s in selectors if s] + [(fam, dtype, "")]
                    + [(fam, "fp32", s) for s in selectors if s] + [(fam, "fp32", "")]):
            curve = self._curves.get(key)
            if curve is not None:
                return curve
        return None

    def host_s(self, fam: str, op: str = "", before: int = 0, after: str = "") -> float:
        """Host time of an eager call of operator ``op`` (its base name) where it was measured,
        else of family ``fam`` (the element-wise one where the family was not measured; 0
        without either); plus, where the calibration measured it, its growth after a call that
        moved ``before`` bytes (the operator's, else the median operator's; linear in
        log(bytes) between the sizes measured, none up to 4 KiB, the largest's beyond).

        Args:
            fam: the family.
            op: the ATen operator's base name.
            before: bytes the call before moved.
            after: the family of the call just before: a loop-timed family's call after a
                convolution or a product takes the calibration's ``host_after_s`` for it
                more (where positive; its kernel library evicts more than its bytes).

        Returns:
            Seconds.
        """
        seconds = self.host_op.get(op) if op else None
        if seconds is None:
            seconds = self.host.get(fam, self.host.get("elementwise", 0.0))
        curve = self._evicted.get(op) or self._evicted.get("")
        if curve is not None and before > 0 and fam not in ROTATED_FAMILIES:
            seconds += curve.log_rate((math.log2(before),))  # seconds, not a log: linear
        if after and fam not in ROTATED_FAMILIES:  # a rotated point holds it already
            seconds += max(self.calibration.host_after_s.get(after, 0.0), 0.0)
        return seconds

    def device_s(self, fam: str, dtype: str, flops: int, nbytes: int,
                 *selectors: str, reduction: float = 0.0, cold: float = 0.0,
                 cache_bytes: int = 0) -> float | None:
        """Device time of work of family ``fam``, or ``None`` when the family has no points.

        A loop-timed point's inputs are in the caches (the loop just read them); a call whose
        inputs were last touched too long ago for the last-level cache to hold them (a weight,
        an optimizer's state: ``cold``, the share of its bytes the roofline's cache model
        reads from memory) runs that share at the rate its curve reaches streaming from
        memory (its largest points, beyond ``cache_bytes``); a product takes at least that
        share at the rate of the products streamed from memory (:meth:`_product_floor`).

        Args:
            fam: the family.
            dtype: its dtype key.
            flops: its FLOPs.
            nbytes: its bytes.
            selectors: the curves to try first, in order: ``"op:NAME"`` (the operator's own
                points), a special function's name, ``"inplace"``; then the family's.
            reduction: its reduction length (:func:`reduction_length`), for the compute
                families.
            cold: the share of its bytes read from memory, not the caches (0 to 1).
            cache_bytes: the last-level cache's capacity (0: unknown, ``cold`` unused).

        Returns:
            Seconds, or ``None``.
        """
        if fam == "view":
            return 0.0
        curve = self._curve(fam, dtype, *selectors)
        amount = work(fam, flops, nbytes)
        if curve is None:
            return None
        if amount <= 0:
            return 0.0
        at = coords(fam, flops, nbytes, reduction if self._shaped else 0.0)
        seconds = amount / 10 ** curve.log_rate(at)
        if fam == "matmul":
            return self._product_floor(seconds, dtype, nbytes, at, cold, cache_bytes)
        far = curve.streaming(at, cache_bytes) if cold > 0 and cache_bytes > 0 else None
        if far is None:
            return seconds
        return (1 - cold) * seconds + cold * amount / 10 ** curve.log_rate(far)

    def _product_floor(self, seconds: float, dtype: str, nbytes: int, at: tuple[float, ...],
                       cold: float, cache_bytes: int) -> float:
        """A product whose operands the cache no longer holds (``cold``: the share of its
        bytes read from memory; a decode step's weights, read once per step, the whole model
        between) takes at least the time to read that share at the rate the calibration's
        products past ``cache_bytes`` read theirs (weights streamed from memory, in
        ``nn.Linear``'s layout), in bytes per second interpolated in (log intensity, log
        reduction length): its rotated neighbours of a few MiB stay partly in the cache (round
        11: a decode step's 2.9 MiB weights at K = 512 read at 10 GB/s, the 1-4 MiB rotated
        points at 15). A floor on the bytes, not on the FLOPs at those products' rate: a
        product of high intensity reuses each byte it reads many times (a 2048 x 2048 x 2048
        product runs at its compute rate whatever the cache held before it; the streamed
        points, all at M <= 128, would put it at their FLOP rate, 1.2-2x its time)."""
        if cold <= 0 or cache_bytes <= 0:
            return seconds
        key = (dtype, cache_bytes)
        if key not in self._streamed:
            far = [(c, y) for d, b, c, y in self._products if d == dtype and b > cache_bytes]
            if not far and dtype != "fp32":
                far = [(c, y) for d, b, c, y in self._products if d == "fp32" and b > cache_bytes]
            self._streamed[key] = _Curve.of(far) if far else None
        streamed = self._streamed[key]
        if streamed is None:
            return seconds
        return max(seconds, cold * nbytes / 10 ** streamed.log_rate(at[1:]))

    def call(self, rec: CallRecord, bound_s: float, cache_bytes: int = 0) -> CallPrediction:
        """One call's prediction.

        Args:
            rec: the call's record.
            bound_s: its roofline bound (the device time where the family is uncalibrated).
            cache_bytes: the last-level cache's capacity (the hardware profile's; 0: unknown):
                a loop-timed family's call whose inputs the cache no longer holds is
                predicted at its operator's rate streaming from memory for that share.

        Returns:
            The prediction.
        """
        # a call's prediction is a function of its record but its place (a plan's roles repeat
        # each call many times: the layers, the microbatches, the ranks' alike shards); the
        # bytes moved before it and the cache model's figures only where they are read
        memo = (bound_s, cache_bytes, self._keyed[bool(cache_bytes) and not self._cuda](rec))
        found = self._memo.get(memo)
        if found is None:
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            found = self._memo[memo] = self._call(rec, bound_s, cache_bytes)
        return found

    def _call(self, rec: CallRecord, bound_s: float, cache_bytes: int) -> CallPrediction:
        from flopscope.estimate.profile import dtype_key

        fam = family(rec)
        if fam == "framework":  # DTensor's dispatch: host time only
            cal = self.calibration
            if cal.compiled:
                return CallPrediction(fam, 0.0, 0.0, True)
            pointwise = rec.op == DTENSOR_POINTWISE and cal.dtensor_pointwise_s
            return CallPrediction(fam, cal.dtensor_pointwise_s if pointwise
                                  else cal.dtensor_call_s, 0.0, True)
        key = (dtype_key(rec.dtype) if rec.dtype is not None else None) or "fp32"
        function = rec.special[0] if rec.special is not None else ""
        op = rec.op.split(".")[1] if rec.op.count(".") >= 1 else rec.op
        inplace = "inplace" if rec.fresh_bytes == 0 and rec.bytes_written > 0 else ""
        cold = 0.0
        if (cache_bytes and rec.bytes and (fam not in ROTATED_FAMILIES or fam == "matmul")
                and not self.calibration.device.startswith("cuda")):
            cold = max(rec.bytes - sum(rec.cached(cache_bytes)), 0) / rec.bytes
        device = self.device_s(fam, key, rec.flops, rec.bytes, "op:" + op, function, inplace,
                               reduction=reduction_length(rec), cold=cold,
                               cache_bytes=cache_bytes)
        # Python's time of the nn.Module calls this call entered
        host = 0.0 if self.calibration.compiled else (  # a compiled step issues no call
            self.host_s(fam, op, rec.before, rec.after)
            + rec.modules * self.calibration.module_call_s)
        if device is None:
            return CallPrediction(fam, host, bound_s, False)
        # its fresh allocations' new pages: their page faults and unmapping (a CPU; the heap's
        # simulation where the log ran it, .heap, else an allocation of at least mmap_bytes); the chains'
        # measured / predicted for the family at its size (1 without): a CPU's time host and
        # device on one timeline (both take it), a GPU's are eager, tiny and host-bound
        # (benchmarks/gpu_calib.py: the host's, the device's time stays its graph-timed points')
        cal = self.calibration
        fault = (rec.faulted * cal.fault_s_per_byte if rec.faulted is not None
                 else cal.fault_s(rec.fresh_bytes or 0))
        k = self.calibration.chain_factor(fam, rec.bytes_written, reduction_length(rec))
        kd = 1.0 if self.calibration.device.startswith("cuda") else k
        return CallPrediction(fam, host * k, max(device * kd, bound_s) + fault, True)


def overlapped(calls: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The step time of calls (host seconds, device seconds) in order, the host issuing each
    and the device running it once issued and once the previous kernel is done (CUDA's
    stream order): a kernel cannot start before its launch, the device idles while the host
    is slower.

    Args:
        calls: (host, device) seconds per call, in call order.

    Returns:
        (the step's time, the device's idle time in it).
    """
    host = device = idle = 0.0
    for h, d in calls:
        host += h
        if host > device:
            idle += host - device
            device = host
        device += d
    return max(host, device), idle


_PREDICTORS: dict[int, tuple[Calibration, Predictor]] = {}


def predictor(calibration: Calibration) -> Predictor:
    """The :class:`Predictor` of a calibration, built once per calibration object.

    Args:
        calibration: the calibration.

    Returns:
        Its predictor.
    """
    entry = _PREDICTORS.get(id(calibration))
    if entry is None or entry[0] is not calibration:
        entry = _PREDICTORS[id(calibration)] = (calibration, Predictor(calibration))
    return entry[1]
