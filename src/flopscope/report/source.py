"""Typed facts about where a counted model came from (:class:`SourceInfo`), as the model loader
knows them; a report's ``meta``. :mod:`flopscope.report.report` re-exports it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SourceInfo"]


@dataclass(frozen=True)
class SourceInfo(Mapping[str, Any]):
    """Where a counted model came from, as the command line's model loader knows it.

    Typed fields; also readable as a mapping of the fields that are set (the JSON ``"meta"``
    object), so ``report.meta["inputs"]`` and ``report.meta.inputs`` both work.

    Attributes:
        source: the SOURCE string (``torchvision:resnet50``, ``hf:llama``, ``file.py:factory``).
        inputs: the forward inputs, described (``"1x3x224x224"``).
        reference_gmacs: the publisher's figure for this model and input size, in GMAC
            (torchvision's ``_ops``), when there is one.
        model_type: a transformers model type (``hf:`` sources).
        config: configuration overrides given on the command line (``hf:`` sources).
    """

    source: str | None = None
    inputs: tuple[str, ...] = ()
    reference_gmacs: float | None = None
    model_type: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, JSON-ready (``inputs`` as a list)."""
        out: dict[str, Any] = {}
        if self.reference_gmacs is not None:
            out["reference_gmacs"] = self.reference_gmacs
        if self.model_type is not None:
            out["model_type"] = self.model_type
        if self.config:
            out["config"] = dict(self.config)
        if self.inputs:
            out["inputs"] = list(self.inputs)
        if self.source is not None:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceInfo:
        """Read :meth:`to_dict` output back (unknown keys are ignored)."""
        gmacs = data.get("reference_gmacs")
        return cls(
            source=data.get("source"),
            inputs=tuple(str(i) for i in data.get("inputs", ())),
            reference_gmacs=float(gmacs) if gmacs is not None else None,
            model_type=data.get("model_type"),
            config=dict(data.get("config", {})),
        )

    def merged(self, other: SourceInfo) -> SourceInfo:
        """These facts, with every field that ``other`` sets taken from ``other``."""
        return SourceInfo.from_dict({**self.to_dict(), **other.to_dict()})

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())
