"""What a measurement runs: a callable with its arguments, or a model built from a source name.

The valgrind backend runs the workload in a child process, so a workload must be rebuildable
there: either a picklable ``(callable, args, kwargs)`` or a *factory* reference
``"package.module:function"`` called with JSON keyword arguments.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopscope.errors import MeasureError

__all__ = [
    "Workload",
    "WorkloadSpec",
    "build_model_workload",
    "load_workload",
    "parse_dtype",
    "resolve_source",
    "segment_modules",
]


@dataclass
class Workload:
    """A region of code to measure.

    Attributes:
        run: runs the region once.
        module: the model whose top-level children delimit per-module segments, if any.
    """

    run: Callable[[], object]
    module: Any = None


@dataclass(frozen=True)
class WorkloadSpec:
    """How a child process rebuilds a workload.

    Attributes:
        factory: ``"package.module:function"`` returning a :class:`Workload`, or ``None``.
        factory_kwargs: JSON-serialisable keyword arguments for the factory.
        pickle_path: a file holding a pickled ``(callable, args, kwargs, module)``, or ``None``.
    """

    factory: str | None = None
    factory_kwargs: Mapping[str, Any] = field(default_factory=dict)
    pickle_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Returns: a JSON-serialisable dict."""
        return {
            "factory": self.factory,
            "factory_kwargs": dict(self.factory_kwargs),
            "pickle_path": self.pickle_path,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        """Rebuild from :meth:`to_json` output.

        Args:
            data: the dict.

        Returns:
            The spec.
        """
        return cls(
            data.get("factory"), dict(data.get("factory_kwargs") or {}), data.get("pickle_path")
        )


def segment_modules(model: Any, depth: int = 1) -> list[tuple[str, Any]]:
    """The modules that delimit measurement segments: those at ``depth``, and leaves above it.

    They never nest, so every op of a forward belongs to at most one of them; what runs outside
    all of them is the ``""`` segment.

    Args:
        model: an ``nn.Module``.
        depth: 1 = top-level children, 2 = their children, ...

    Returns:
        ``(path, module)`` pairs in registration order.
    """
    out: list[tuple[str, Any]] = []
    for path, module in model.named_modules():
        if not path:
            continue
        level = path.count(".") + 1
        if level == depth or (level < depth and not any(True for _ in module.children())):
            out.append((path, module))
    return out


def parse_dtype(name: str) -> Any:
    """Map a dtype name to a torch dtype.

    Args:
        name: ``float64``/``double``, ``float32``/``float``, ``bfloat16``, ``float16``/``half``.

    Returns:
        The ``torch.dtype``.

    Raises:
        MeasureError: for an unknown name.
    """
    import torch

    table = {
        "float64": torch.float64,
        "double": torch.float64,
        "float32": torch.float32,
        "float": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "half": torch.float16,
    }
    try:
        return table[name.lower()]
    except KeyError:
        raise MeasureError(f"unknown dtype {name!r}; expected one of {sorted(table)}") from None


def resolve_source(
    source: str,
    *,
    dtype: str = "float32",
    input_size: int = 224,
    batch_size: int = 1,
    seed: int = 0,
) -> tuple[Any, tuple[Any, ...]]:
    """Build a model and example inputs from a source name (``torchvision:NAME``).

    This is the single place where :mod:`flopscope.measure` turns a name into a model; it is
    meant to be replaced by ``flopscope.sources`` once that exists.

    Args:
        source: ``torchvision:resnet18`` (a bare name is taken as a torchvision model).
        dtype: parameter and input dtype name.
        input_size: height and width of the random input image.
        batch_size: batch size of the input.
        seed: random seed for weights and input.

    Returns:
        ``(model, inputs)`` with the model in eval mode.

    Raises:
        MeasureError: for an unknown scheme or model name, or when torchvision is missing.
    """
    import torch

    scheme, _, name = source.partition(":")
    if not name:
        scheme, name = "torchvision", scheme
    if scheme != "torchvision":
        raise MeasureError(
            f"unsupported source {source!r}: only 'torchvision:NAME' is supported here"
        )
    try:
        import torchvision  # type: ignore[import-untyped]
    except ImportError:
        raise MeasureError(
            "torchvision is not installed (pip install 'flopscope[vision]')"
        ) from None
    torch.manual_seed(seed)
    try:
        model = torchvision.models.get_model(name, weights=None)
    except ValueError as exc:
        raise MeasureError(f"unknown torchvision model {name!r}: {exc}") from None
    torch_dtype = parse_dtype(dtype)
    model = model.to(torch_dtype).eval()
    x = torch.randn(batch_size, 3, input_size, input_size, dtype=torch_dtype)
    return model, (x,)


def build_model_workload(model: Any, inputs: tuple[Any, ...]) -> Workload:
    """A workload that runs ``model(*inputs)`` under ``torch.no_grad()``.

    Args:
        model: an ``nn.Module``.
        inputs: its positional inputs.

    Returns:
        The workload, segmented by the model's top-level children.
    """
    import torch

    def run() -> object:
        with torch.no_grad():
            return model(*inputs)

    return Workload(run, model)


def source_workload(
    source: str, dtype: str = "float32", input_size: int = 224, batch_size: int = 1, seed: int = 0
) -> Workload:
    """Factory used by child processes: a model built by :func:`resolve_source`.

    Args:
        source: see :func:`resolve_source`.
        dtype: see :func:`resolve_source`.
        input_size: see :func:`resolve_source`.
        batch_size: see :func:`resolve_source`.
        seed: see :func:`resolve_source`.

    Returns:
        The model's forward as a workload.
    """
    model, inputs = resolve_source(
        source, dtype=dtype, input_size=input_size, batch_size=batch_size, seed=seed
    )
    return build_model_workload(model, inputs)


def write_pickled(
    path: Path,
    fn: Callable[..., object],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    module: Any,
) -> None:
    """Pickle a callable workload for a child process.

    Args:
        path: destination file.
        fn: the callable (must be picklable: a module-level function or an ``nn.Module``).
        args: positional arguments.
        kwargs: keyword arguments.
        module: model for per-module segments, or ``None``.

    Raises:
        MeasureError: if something cannot be pickled.
    """
    try:
        data = pickle.dumps(
            (fn, tuple(args), dict(kwargs), module), protocol=pickle.HIGHEST_PROTOCOL
        )
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise MeasureError(
            "the valgrind backend runs the workload in a separate process, so the callable and "
            f"its arguments must be picklable (a module-level function or an nn.Module): {exc}"
        ) from None
    path.write_bytes(data)


def load_workload(spec: WorkloadSpec) -> Workload:
    """Rebuild a workload in the current process.

    Args:
        spec: the workload spec.

    Returns:
        The workload.

    Raises:
        MeasureError: if the factory cannot be imported or returns something else.
    """
    if spec.pickle_path is not None:
        fn, args, kwargs, module = pickle.loads(Path(spec.pickle_path).read_bytes())

        def run() -> object:
            return fn(*args, **kwargs)

        return Workload(run, module)
    if spec.factory is None:
        raise MeasureError("workload spec has neither a factory nor a pickled callable")
    mod_name, _, attr = spec.factory.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise MeasureError(f"cannot import workload factory {spec.factory!r}: {exc}") from None
    result = factory(**spec.factory_kwargs)
    if isinstance(result, Workload):
        return result
    if callable(result):
        return Workload(result)
    raise MeasureError(f"factory {spec.factory!r} returned {type(result).__name__}, not a Workload")
