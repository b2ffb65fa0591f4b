"""Measure a model given by a SOURCE string: the API behind ``flopscope measure``.

:func:`measure_request` builds the model *once*, where the backend runs it (in this process for
perf and PAPI, in the valgrind child otherwise): it loads the model with
:func:`flopscope.sources.load_model`, counts one forward pass with :func:`flopscope.count`
(outside the measured region), then measures the same forward.  The result holds the counted
report, the measurement and their comparison, overall and per module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flopscope.errors import UsageError
from flopscope.measure.backend import Backend, ProgressFn
from flopscope.measure.registry import BackendName, resolve_backend
from flopscope.measure.result import Comparison, Measurement
from flopscope.measure.workload import Region, WorkloadSpec, segment_of, segment_paths

if TYPE_CHECKING:
    from flopscope.report.report import Report
    from flopscope.sources import LoadedModel

__all__ = [
    "RESULT_SCHEMA",
    "MeasureRequest",
    "MeasureResult",
    "SourceWorkload",
    "build_source_region",
    "check_request",
    "counted_segments",
    "measure_request",
]

RESULT_SCHEMA = "flopscope-measure/1"


def _dtype_name(name: str) -> str:
    from flopscope.sources import parse_dtype

    return str(parse_dtype(name, floating=True)).removeprefix("torch.")


@dataclass(frozen=True)
class MeasureRequest:
    """A model to build, count and measure; the same options as ``flopscope count``.

    Attributes:
        source: the SOURCE string (``torchvision:resnet18``, ``path/to/file.py:factory``, ...).
        inputs: input shapes in the ``--input`` grammar (``"1x3x224x224"``,
            ``"1x128:int64"``); empty = the source's default inputs.
        batch: batch size (first dimension of every input).
        seq_len: sequence length of ``hf:`` token inputs.
        config: overrides of an ``hf:`` config.
        dtype: floating-point dtype of weights and floating inputs (``float64``, ``float32``,
            ``bfloat16``, ``float16``).
        depth: module depth of the per-module comparison (1 = top-level children, 0 = none).
        seed: random seed for weights and inputs.

    Raises:
        UsageError: for an unknown dtype or a negative depth.
    """

    source: str
    inputs: tuple[str, ...] = ()
    batch: int | None = None
    seq_len: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    depth: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "config", dict(self.config))
        if self.depth < 0:
            raise UsageError(f"depth must be 0 or more, not {self.depth}")

    def to_dict(self) -> dict[str, Any]:
        """Returns: a JSON-ready dict (:meth:`from_dict` reads it back)."""
        return {
            "source": self.source,
            "inputs": list(self.inputs),
            "batch": self.batch,
            "seq_len": self.seq_len,
            "config": dict(self.config),
            "dtype": self.dtype,
            "depth": self.depth,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasureRequest:
        """Rebuild a request from :meth:`to_dict` output.

        Args:
            data: the dict.

        Returns:
            The request.
        """
        return cls(
            source=str(data["source"]),
            inputs=tuple(data.get("inputs") or ()),
            batch=data.get("batch"),
            seq_len=data.get("seq_len"),
            config=dict(data.get("config") or {}),
            dtype=str(data.get("dtype", "float32")),
            depth=int(data.get("depth", 1)),
            seed=int(data.get("seed", 0)),
        )


def _load(request: MeasureRequest) -> LoadedModel:
    """Load the model with the one SOURCE loader, in the request's dtype, in eval mode."""
    import torch

    from flopscope import sources

    torch.manual_seed(request.seed)
    loaded = sources.load_model(
        request.source,
        inputs=[sources.parse_input(s) for s in request.inputs] or None,
        batch=request.batch,
        seq_len=request.seq_len,
        config=dict(request.config) or None,
        dtype=request.dtype,
    )
    loaded.model.eval()
    return loaded


_REGISTRY_PREFIXES = ("torchvision:", "timm:", "hf:")


def check_request(request: MeasureRequest) -> None:
    """Catch a wrong source or input in this process, in about a second, before a long run.

    Inputs are parsed; a registry source (``torchvision:``, ``timm:``, ``hf:``) is loaded on the
    ``meta`` device (no weights, no arithmetic).  A factory source is not run here (that would
    build the user's model twice); its errors come from where the model is built.

    Args:
        request: the request.

    Raises:
        SourceError: the source or an input is wrong (with close matches where there are some).
    """
    from flopscope import sources

    specs = [sources.parse_input(s) for s in request.inputs]
    if request.source.startswith(_REGISTRY_PREFIXES):
        sources.load_model(
            request.source,
            inputs=specs or None,
            batch=request.batch,
            seq_len=request.seq_len,
            config=dict(request.config) or None,
            shape_only=True,
            dtype=request.dtype,
        )


@dataclass(frozen=True)
class SourceWorkload:
    """The forward pass of a model from a SOURCE string, counted by flopscope when built.

    Attributes:
        request: what to load.
    """

    request: MeasureRequest

    def build(self) -> Region:
        """Load the model, count one forward (``torch.no_grad()``), return the forward as a region.

        Returns:
            The region; ``report`` is the count and ``module`` the model.

        Raises:
            SourceError: the source, an input or an option is wrong.
        """
        import torch

        import flopscope

        loaded = _load(self.request)
        model, args, kwargs = loaded.model, tuple(loaded.args), dict(loaded.kwargs)
        with torch.no_grad():
            report = flopscope.count(model, flopscope.Inputs(*args, **kwargs), warn=False)
        report = replace(report, meta=report.meta.merged(loaded.meta))

        def run() -> object:
            with torch.no_grad():
                return model(*args, **kwargs)

        return Region(run, model, report, self.request.depth)

    def spec(self, directory: Path) -> WorkloadSpec:
        """Args:
            directory: unused (the request is plain JSON).

        Returns:
            A spec that rebuilds this workload with :func:`build_source_region`.
        """
        return WorkloadSpec(
            factory=f"{__name__}:build_source_region", arguments=self.request.to_dict()
        )


def build_source_region(**request: Any) -> Region:
    """Workload factory of a child process: :meth:`SourceWorkload.build` of a request dict.

    Args:
        **request: :meth:`MeasureRequest.to_dict` output.

    Returns:
        The region (model forward, with its count).
    """
    return SourceWorkload(MeasureRequest.from_dict(request)).build()


def counted_segments(report: Report, depth: int = 1) -> dict[str, int]:
    """Counted FLOPs per segment module (see :func:`~flopscope.measure.workload.segment_paths`),
    and ``""`` for everything outside them.

    Each operator counts in the segment of the module it ran in
    (:func:`~flopscope.measure.workload.segment_of`), as the measurement attributes executed code.

    Args:
        report: a report of one forward pass.
        depth: module depth of the split.

    Returns:
        FLOPs per segment path; ``""`` is the rest of the total.
    """
    segments = segment_paths(list(report.modules), depth)
    out = dict.fromkeys(segments, 0)
    for path, stats in report.by_module().items():
        seg = segment_of(path, out)
        if seg:
            out[seg] += int(stats.self_cost.flops)
    out[""] = int(report.flops) - sum(out.values())
    return out


def _json_ratio(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 6)


@dataclass(frozen=True)
class MeasureResult:
    """Counted vs measured FLOPs of one model.

    Attributes:
        request: what was measured.
        backend: the backend's name.
        notes: how the backend was chosen and how it measured.
        measurement: the executed floating-point operations.
        report: flopscope's count of the same forward pass (of the same model object).
        comparison: counted vs measured, overall and per module at ``request.depth``.
    """

    request: MeasureRequest
    backend: str
    notes: tuple[str, ...]
    measurement: Measurement
    report: Report
    comparison: Comparison

    @property
    def ratio(self) -> float:
        """measured / counted FLOPs."""
        return self.comparison.ratio

    def within(self, tolerance: float) -> bool:
        """Whether measured is within ``tolerance`` (relative, e.g. 0.03) of counted.

        Args:
            tolerance: the allowed relative difference.

        Returns:
            True if ``abs(measured / counted - 1) <= tolerance``.
        """
        return self.comparison.within(tolerance)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``flopscope measure SOURCE --format json``.

        Per-module rows have ``path`` ``""`` for code outside the listed modules (for a model
        without submodules that is the whole model).  ``ratio`` is ``null`` where nothing was
        counted.

        Returns:
            A JSON-ready dict with ``schema``, the request, ``backend``, ``counted_flops``,
            ``counted_macs``, ``measured_flops``, ``ratio``, ``measured_by_precision``,
            ``modules``, ``by_instruction``, timings and ``notes``.
        """
        m, c = self.measurement, self.comparison
        rows = list(c.segments)
        modules = [
            {
                "path": s.path,
                "counted_flops": s.counted_flops,
                "measured_flops": s.measured_flops,
                "ratio": _json_ratio(s.ratio) if s.counted_flops else None,
            }
            for s in rows
        ]
        if not modules and not segment_paths(list(self.report.modules), self.request.depth):
            modules = [
                {
                    "path": "",
                    "counted_flops": c.counted_flops,
                    "measured_flops": c.measured_flops,
                    "ratio": _json_ratio(c.ratio) if c.counted_flops else None,
                }
            ]
        return {
            "schema": RESULT_SCHEMA,
            "request": self.request.to_dict(),
            "model": self.report.model,
            "inputs": list(self.report.meta.inputs),
            "backend": self.backend,
            "counted_macs": int(self.report.macs),
            "counted_flops": c.counted_flops,
            "measured_flops": c.measured_flops,
            "ratio": _json_ratio(c.ratio) if c.counted_flops else None,
            "measured_by_precision": dict(m.flops_by_precision),
            "modules": modules,
            "by_instruction": dict(m.by_instruction),
            "uncounted": dict(self.report.uncounted),
            "region_seconds": round(m.region_seconds, 3),
            "wall_seconds": round(m.wall_seconds, 3),
            "notes": list(self.notes),
        }


def measure_request(
    request: MeasureRequest,
    *,
    backend: Backend | BackendName | str = BackendName.AUTO,
    progress: ProgressFn | None = None,
) -> MeasureResult:
    """Build the model of ``request`` once, count it, measure it, compare.

    Args:
        request: the model and its options.
        backend: a backend object (e.g. ``ValgrindBackend(options)`` or a
            :class:`~flopscope.measure.backend.FakeBackend`), a name, or ``auto``.
        progress: called with a short message at each stage (valgrind runs take minutes).

    Returns:
        The result: measurement, report and comparison.

    Raises:
        UsageError: an unknown backend name; :class:`~flopscope.errors.SourceError` for a bad
            source, input or option (in the valgrind child too, re-raised here).
        BackendUnavailableError: the backend cannot run here.
        MeasureError: the measurement failed.
    """
    chosen, note = resolve_backend(backend)
    run = chosen.measure(SourceWorkload(request), progress=progress)
    if run.report is None:  # a backend that ignored the workload's count
        from flopscope.errors import MeasureError

        raise MeasureError(f"backend {chosen.name} returned no counted report for the workload")
    m = run.measurement
    comparison = m.compare(run.report.flops, counted_segments(run.report, request.depth))
    return MeasureResult(
        request=request,
        backend=m.backend,
        notes=(note, *m.notes),
        measurement=m,
        report=run.report,
        comparison=comparison,
    )

