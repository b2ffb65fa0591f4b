"""What a backend measures: a workload, built once into a region of code.

A :class:`Workload` is a recipe; :meth:`Workload.build` turns it into a :class:`Region` (the code to
run, the model whose modules split the result, and the flopscope count when the workload counted
one).  In-process backends (perf, PAPI) build it here; the valgrind backend builds it in a child
process from the workload's :class:`WorkloadSpec`, which is plain JSON.

Two workloads exist: :class:`CallableWorkload` (``fn(*args, **kwargs)``, pickled for a child) and
:class:`~flopscope.measure.request.SourceWorkload` (a model from a SOURCE string, loaded and
counted where it runs).
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flopscope.errors import MeasureError

if TYPE_CHECKING:
    from flopscope.report.report import Report

__all__ = [
    "CallableWorkload",
    "Region",
    "SegmentMarks",
    "Workload",
    "WorkloadSpec",
    "model_workload",
    "segment_modules",
    "segment_of",
    "segment_paths",
]


@dataclass(frozen=True)
class Region:
    """A built workload: the code to measure and what goes with it.

    Attributes:
        run: runs the measured region once.
        module: the model whose modules delimit per-module segments, if any.
        report: flopscope's count of the same code, made while building (outside the region).
        depth: module depth of the per-module split, when the workload decides it (``None``:
            the backend's option; 0: no split).
    """

    run: Callable[[], object]
    module: Any = None
    report: Report | None = None
    depth: int | None = None


class Workload(Protocol):
    """A recipe for a :class:`Region`, buildable here or in a child process."""

    def build(self) -> Region:
        """Build the region in this process.

        Raises:
            MeasureError: the workload cannot be built (a :class:`~flopscope.errors.SourceError`,
                a usage error, passes through).
        """
        ...

    def spec(self, directory: Path) -> WorkloadSpec:
        """How a child process rebuilds this workload.

        Args:
            directory: a private directory for files the spec refers to.

        Raises:
            MeasureError: the workload cannot be sent to another process.
        """
        ...


@dataclass(frozen=True)
class CallableWorkload:
    """``fn(*args, **kwargs)``; ``module`` splits the valgrind result per module.

    For the valgrind backend ``fn``, its arguments and ``module`` must be picklable (a
    module-level function, an ``nn.Module``).
    """

    fn: Callable[..., object]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    module: Any = None

    def build(self) -> Region:
        """Returns: the region calling ``fn``."""
        fn, args, kwargs = self.fn, tuple(self.args), dict(self.kwargs)

        def run() -> object:
            return fn(*args, **kwargs)

        return Region(run, self.module)

    def spec(self, directory: Path) -> WorkloadSpec:
        """Pickle the call into ``directory``.

        Args:
            directory: where the pickle file goes.

        Returns:
            A spec naming the pickle file.

        Raises:
            MeasureError: if something cannot be pickled.
        """
        try:
            data = pickle.dumps(
                (self.fn, tuple(self.args), dict(self.kwargs), self.module),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise MeasureError(
                "the valgrind backend runs the workload in a separate process, so the callable "
                f"and its arguments must be picklable (a module-level function or an nn.Module): "
                f"{exc}"
            ) from None
        path = directory / "workload.pkl"
        path.write_bytes(data)
        return WorkloadSpec(pickle_path=str(path))


def _call_module(model: Any, *inputs: Any) -> object:
    import torch

    with torch.no_grad():
        return model(*inputs)


def model_workload(model: Any, inputs: Sequence[Any]) -> CallableWorkload:
    """A workload running ``model(*inputs)`` under ``torch.no_grad()``, split by its modules.

    Args:
        model: an ``nn.Module``.
        inputs: its positional inputs.

    Returns:
        The workload.
    """
    return CallableWorkload(_call_module, (model, *inputs), {}, model)


@dataclass(frozen=True)
class WorkloadSpec:
    """How a child process rebuilds a workload (plain JSON; exactly one way is given).

    Attributes:
        factory: ``"package.module:function"``, called as ``function(**arguments)`` in the child;
            it returns the :class:`Region`.
        arguments: JSON-ready keyword arguments of the factory.
        pickle_path: a file holding a pickled ``(fn, args, kwargs, module)``.
    """

    factory: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    pickle_path: str | None = None

    def build(self) -> Region:
        """Rebuild the workload in this process.

        Returns:
            The region.

        Raises:
            MeasureError: the spec is empty, the factory cannot be imported or returns something
                else than a :class:`Region`.
        """
        if self.pickle_path is not None:
            fn, args, kwargs, module = pickle.loads(Path(self.pickle_path).read_bytes())
            return CallableWorkload(fn, args, kwargs, module).build()
        if self.factory is None:
            raise MeasureError("workload spec has neither a factory nor a pickled callable")
        mod_name, _, attr = self.factory.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise MeasureError(f"cannot import workload factory {self.factory!r}: {exc}") from None
        region = factory(**self.arguments)
        if not isinstance(region, Region):
            raise MeasureError(
                f"workload factory {self.factory!r} returned {type(region).__name__}, not a Region"
            )
        return region

    def to_json(self) -> dict[str, Any]:
        """Returns: a JSON-ready dict (:meth:`from_json` reads it back)."""
        return {
            "factory": self.factory,
            "arguments": dict(self.arguments),
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
            factory=data.get("factory"),
            arguments=dict(data.get("arguments") or {}),
            pickle_path=data.get("pickle_path"),
        )


def segment_paths(paths: Sequence[str], depth: int = 1) -> list[str]:
    """The module paths that delimit measurement segments: every module down to ``depth``.

    Segments nest: a module's segment holds the code that runs while it is the innermost segment
    module running (:func:`segment_of`), so a module above ``depth`` holds only its own code
    (residual adds, reshapes, functional calls in its ``forward``) and one at ``depth`` holds
    everything below it.  What runs outside all of them is the ``""`` segment.  At ``depth`` 1
    the segments are the top-level children, which do not nest.

    Args:
        paths: every module path of a model (``""`` is the root), in model order.
        depth: 1 = top-level children, 2 = their children too, ...

    Returns:
        The segment paths, in model order.
    """
    return [p for p in paths if p and p.count(".") + 1 <= depth]


def segment_of(path: str, segments: Collection[str]) -> str:
    """The segment that code running in module ``path`` belongs to: ``path`` itself or its
    nearest ancestor among ``segments`` (``""`` if none is).

    Args:
        path: a module path.
        segments: the segment paths (:func:`segment_paths`).

    Returns:
        The segment path.
    """
    while path and path not in segments:
        path = path.rpartition(".")[0]
    return path


def segment_modules(model: Any, depth: int = 1) -> list[tuple[str, Any]]:
    """The modules of ``model`` at :func:`segment_paths`.

    Args:
        model: an ``nn.Module``.
        depth: 1 = top-level children, 2 = their children too, ...

    Returns:
        ``(path, module)`` pairs in registration order.
    """
    named = dict(model.named_modules())
    return [(p, named[p]) for p in segment_paths(list(named), depth)]


class SegmentMarks:
    """Follows which segment's code is running during a forward, from module hooks.

    Every module of the model is hooked, not only the segment modules: a segment module may never
    be called itself (an ``nn.ModuleList`` or ``nn.ModuleDict`` whose parent calls its items) and a
    module may be called from another segment's ``forward``.  Entering a module makes its segment
    (:func:`segment_of`) current; leaving it returns to the segment of the module that called it.
    Each time the current segment changes, ``mark`` is called with the segment that was current
    until then, so the code run between two marks belongs to the segment passed to the second.

    Args:
        model: an ``nn.Module``.
        depth: module depth of the segments (:func:`segment_paths`).
        mark: called with the segment path whose code ran since the previous mark.
    """

    def __init__(self, model: Any, depth: int, mark: Callable[[str], None]) -> None:
        named = dict(model.named_modules())
        segments = set(segment_paths(list(named), depth))
        self._of = {id(m): segment_of(p, segments) for p, m in named.items()}
        self._modules = [m for p, m in named.items() if p]
        self._mark = mark
        self._stack: list[str] = []
        self.current = ""
        self._handles: list[Any] = []

    def _switch(self, segment: str) -> None:
        if segment != self.current:
            self._mark(self.current)
            self.current = segment

    def _enter(self, module: Any, _args: Any) -> None:
        self._stack.append(self._of[id(module)])
        self._switch(self._stack[-1])

    def _leave(self, _module: Any, _args: Any, _out: Any) -> None:
        self._stack.pop()
        self._switch(self._stack[-1] if self._stack else "")

    def install(self) -> None:
        """Hook every module of the model (until :meth:`remove`)."""
        for m in self._modules:
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave))

    def finish(self) -> None:
        """Mark the segment that is current (the end of the region)."""
        self._mark(self.current)

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
