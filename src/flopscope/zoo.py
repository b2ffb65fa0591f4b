"""Counting many models of a library, one row each (shape-only): params, MACs, FLOPs, the
publisher's reference figure, time to count, or the error that stopped one model.

    >>> for row in sweep("torchvision", ["resnet18", "vit_b_16"]):
    ...     print(row.model, row.macs, row.reference_gmacs)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from flopscope._text import one_line

__all__ = ["LIBRARIES", "TIMM_ZOO", "ZooRow", "count_model", "sweep", "zoo_models"]

LIBRARIES = ("torchvision", "timm")

TIMM_ZOO = (
    "resnet18", "resnet50", "resnext50_32x4d", "efficientnet_b0", "efficientnet_b3",
    "mobilenetv3_large_100", "mobilenetv4_conv_small", "convnext_tiny", "convnext_base",
    "regnety_016", "vit_tiny_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
    "swin_tiny_patch4_window7_224", "beit_base_patch16_224", "eva02_tiny_patch14_224",
    "levit_128", "mixer_b16_224", "poolformer_s12", "coat_lite_tiny", "convmixer_768_32",
    "edgenext_small", "fastvit_t8", "efficientvit_b0", "ghostnet_100", "mobilevit_s",
)
"""The default timm selection: one or two of each architecture family."""


@dataclass(frozen=True)
class ZooRow:
    """One model of a sweep.

    Attributes:
        model: the model name.
        seconds: wall time to build and count it.
        input: its input, described (``1x3x224x224``).
        params: parameters.
        macs: multiply-accumulates of one forward.
        flops: floating-point operations of one forward.
        uncounted_ops: how many operators had no rule.
        reference_gmacs: the publisher's figure (torchvision's GFLOPS, which are MACs), if any.
        error: ``ExceptionType: message`` when the model failed (the counts are then 0).
    """

    model: str
    seconds: float
    input: str = ""
    params: int = 0
    macs: int = 0
    flops: int = 0
    uncounted_ops: int = 0
    reference_gmacs: float | None = None
    error: str | None = None


def zoo_models(library: str, models: Sequence[str] | None = None) -> list[str]:
    """The model names of a sweep.

    Args:
        library: ``"torchvision"`` or ``"timm"``.
        models: explicit names (items may be comma-separated lists); ``None`` or empty: every
            torchvision classification model, or :data:`TIMM_ZOO`.

    Returns:
        The names, in order.

    Raises:
        ImportError: torchvision is needed to list its models and is not installed.
    """
    if models:
        return [m for item in models for m in item.split(",") if m]
    if library == "torchvision":
        import torchvision.models as tvm  # type: ignore[import-untyped]

        return list(tvm.list_models(module=tvm))
    return list(TIMM_ZOO)


def count_model(library: str, name: str) -> ZooRow:
    """Build one model on ``meta`` and count one forward (shape-only); a failure becomes a row
    with ``error`` set, never an exception (``KeyboardInterrupt`` still stops it).

    Args:
        library: ``"torchvision"`` or ``"timm"``.
        name: the model name.

    Returns:
        The row.
    """
    from flopscope.run import count
    from flopscope.sources import load_model

    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # constructors' FutureWarnings would drown the progress
            warnings.simplefilter("ignore")
            loaded = load_model(f"{library}:{name}", shape_only=True)
            report = count(loaded.model, loaded.inputs, shape_only=True, warn=False)
    except Exception as e:  # noqa: BLE001  (one failing model must not stop the sweep)
        return ZooRow(name, time.perf_counter() - start,
                      error=one_line(f"{type(e).__name__}: {e}", 160))
    return ZooRow(
        name, time.perf_counter() - start, input=" ".join(loaded.meta.inputs),
        params=report.params, macs=report.macs, flops=report.flops,
        uncounted_ops=len(report.uncounted), reference_gmacs=loaded.meta.reference_gmacs,
    )


def sweep(
    library: str,
    names: Sequence[str],
    *,
    on_start: Callable[[str], None] | None = None,
) -> Iterator[ZooRow]:
    """Count ``names`` one after the other, yielding each row as it finishes (so a caller can
    write rows as they come and keep them when interrupted).

    Args:
        library: ``"torchvision"`` or ``"timm"``.
        names: the model names.
        on_start: called with each name before it is counted (progress display).

    Yields:
        One :class:`ZooRow` per name, in order.
    """
    for name in names:
        if on_start is not None:
            on_start(name)
        yield count_model(library, name)
