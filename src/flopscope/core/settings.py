"""The PyTorch settings flopscope changes while it counts, and why (:func:`while_counting`).

Meta tensors run what the CPU runs (:func:`flopscope.execution.meta.sdpa_as_cpu`): on ``meta``,
``scaled_dot_product_attention`` would choose its unfused math form where the CPU runs its fused
kernel, so a Counter around a meta-built model would count another computation (a meta Mistral's
sliding-window attention backward: 9,437,184 MACs where the CPU runs 9,568,256).

Eager flex attention:

``flex_attention`` called outside ``torch.compile`` wraps its higher-order operator in a
``torch.compile(..., fullgraph=True)`` with an eager backend; Dynamo refuses to compile while a
user (non-infrastructure) dispatch mode such as flopscope's is active, so the call would fail.
PyTorch's documented debug switch ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG`` makes it call the
operator directly instead -- the same eager computation -- so that the counter sees it. It is
set only while a Counter is active (when flex_attention has been imported) and put back on exit.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from flopscope.execution.meta import sdpa_as_cpu

__all__ = ["eager_flex_attention", "while_counting"]

_FLEX = "torch.nn.attention.flex_attention"
_SWITCH = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"


@contextmanager
def eager_flex_attention() -> Iterator[None]:
    """While active, eager ``flex_attention`` calls its operator directly (see the module doc)."""
    module = sys.modules.get(_FLEX)  # not imported: the model cannot be calling it
    before = getattr(module, _SWITCH, None) if module is not None else None
    if before is None or before is True:
        yield
        return
    setattr(module, _SWITCH, True)
    try:
        yield
    finally:
        setattr(module, _SWITCH, before)


@contextmanager
def while_counting() -> Iterator[None]:
    """Every setting flopscope changes while a Counter is active (see the module doc)."""
    with eager_flex_attention(), sdpa_as_cpu():
        yield
