"""Attention, two ways: what the kernel executes and what the model needs.

flopscope's rules count an attention kernel's *dense* work, B x H x L_q x L_k scores, whatever its
mask (``docs/conventions.md``, attention). Two other figures are what people mean:

- **executed**: what the selected kernel computes. PyTorch's CPU flash kernel
  (``_scaled_dot_product_flash_attention_for_cpu``, ``aten/src/ATen/native/cpu/
  FlashAttentionKernel.cpp``) splits the queries into blocks of 256 rows when L_q >= 768, 64 when
  L_q >= 192, 32 otherwise, and the keys into blocks of 512 (or L_k if shorter). Under
  ``is_causal`` query block [m, m + q_block) walks key blocks from 0 while their start is below
  ``min(m + q_block, L_k)``, each key block whole (``min(512, L_k - n)`` keys): fully masked key
  blocks are skipped, the diagonal ones computed whole and masked inside. With an explicit mask
  it computes every block. Its backward walks the same blocks. Other kernels (GPU flash,
  memory-efficient, cuDNN) also skip blocks, with block sizes that depend on the GPU and head
  dimension; a count gives the dense figure as their executed one. For FlashAttention-2's
  forward, :func:`flash2_block_sizes` and :func:`flash2_executed_pairs` model the skipping from
  the kernel's source (a model, not checked on a GPU: none was available).
  A flex_attention call executes its BlockMask's computed blocks (what its rule counts).
- **model**: the query-key pairs the mask leaves visible (PaLM's and the MFU literature's
  convention): causal top-left (query i sees keys 0..i, ``torch``'s ``is_causal``) or bottom-right
  (query i sees keys up to i + L_k - L_q, FlashAttention 2's and xformers' ``custom_mask_type=2``),
  sliding windows, explicit boolean or additive masks (read when the tensors are real), a
  BlockMask's mask_mod (evaluated on real tensors), variable-length sequences (the per-sequence
  blocks the rules already count). In the backward, model MACs are 2d + 2d_v per visible score
  (dP, dV, dQ, dK): the kernel's recomputation of S = Q K^T (d more) is an executed cost, like
  activation checkpointing.

Per visible score the element-wise FLOPs of the rule (scale, softmax, mask, dropout) are kept.
Where a mask's values cannot be read (a shape-only count of a model that passes an explicit mask)
the model figure is the dense one and :attr:`AttentionTotals.exact` is ``False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from flopscope.cost import Cost, OpCall, Phase
from flopscope.llm.pairs import (
    causal_pairs,
    cpu_flash_executed_pairs,
    sliding_window_pairs,
)
from flopscope.rules.attention import varlen_pairs

__all__ = ["AttentionFigures", "AttentionTotals"]

@dataclass
class AttentionTotals:
    """Attention work of a run, three ways (see the module docstring).

    Attributes:
        counted: what the report counts (the rules: dense kernel work).
        executed: what the kernels computed (block skipping of the CPU flash kernel).
        model: the visible query-key pairs' work.
        calls: attention operator calls seen.
        exact: ``False`` when a mask's values could not be read (model figure = dense bound).
        notes: one line per kind of approximation met.
    """

    counted: Cost = field(default_factory=Cost)
    executed: Cost = field(default_factory=Cost)
    model: Cost = field(default_factory=Cost)
    calls: int = 0
    exact: bool = True
    notes: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data."""
        return {"counted": self.counted.to_dict(), "executed": self.executed.to_dict(),
                "model": self.model.to_dict(), "calls": self.calls, "exact": self.exact,
                "notes": sorted(self.notes)}


def _visible(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # additive masks: -inf or the dtype's minimum


def _readable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.device.type != "meta"


def _mask_pairs(mask: torch.Tensor, shape: tuple[int, int, int, int], causal: bool) -> int:
    """Visible pairs of an explicit mask broadcast to [B, H, L_q, L_k] (and a causal mask)."""
    with torch.no_grad():
        visible = _visible(mask.detach())
        if causal:
            l_q, l_k = shape[2], shape[3]
            visible = visible & torch.ones(l_q, l_k, dtype=torch.bool).tril()
        total = shape[0] * shape[1] * shape[2] * shape[3]
        return int(visible.sum()) * (total // max(visible.numel(), 1))


def _block_mask_pairs(q: torch.Tensor, k: torch.Tensor, block_mask: tuple[Any, ...]) -> int | None:
    """Visible pairs of a flex_attention BlockMask: its mask_mod on every (b, h, q, kv)."""
    mask_mod = block_mask[-1] if block_mask else None
    if not callable(mask_mod) or not _readable(q):
        return None
    b, h, l_q, _ = q.shape
    l_k = k.shape[-2]
    try:
        with torch.no_grad():
            visible = mask_mod(torch.arange(b).view(b, 1, 1, 1), torch.arange(h).view(1, h, 1, 1),
                               torch.arange(l_q).view(1, 1, l_q, 1),
                               torch.arange(l_k).view(1, 1, 1, l_k))
            if not isinstance(visible, torch.Tensor):
                return None
            return int(visible.sum()) * (b * h * l_q * l_k // max(visible.numel(), 1))
    except Exception:  # noqa: BLE001  (a mask_mod that does not broadcast: keep the counted figure)
        return None


def _arg(call: OpCall, name: str, default: Any = None) -> Any:
    if name in call.kwargs:
        return call.kwargs[name]
    for i, a in enumerate(call.op._schema.arguments):
        if a.name == name:
            return call.args[i] if i < len(call.args) else default
    return default


@dataclass(frozen=True)
class _Kind:
    first: int  # index of the query argument
    layout: str  # "bhsd" or "bshd"
    backward: bool
    cpu_flash: bool = False
    mask: str | None = None  # name of the mask argument
    varlen: tuple[str, str, str, str] | None = None


_FLASH_VARLEN = ("cum_seq_q", "cum_seq_k", "max_q", "max_k")
_EFF_VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
_KINDS: dict[str, _Kind] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default":
        _Kind(0, "bhsd", False, cpu_flash=True, mask="attn_mask"),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default":
        _Kind(1, "bhsd", True, cpu_flash=True, mask="attn_mask"),
    "aten._scaled_dot_product_flash_attention.default": _Kind(0, "bhsd", False),
    "aten._scaled_dot_product_flash_attention_backward.default": _Kind(1, "bhsd", True),
    "aten._scaled_dot_product_efficient_attention.default": _Kind(0, "bhsd", False, mask="attn_bias"),
    "aten._scaled_dot_product_efficient_attention_backward.default":
        _Kind(1, "bhsd", True, mask="attn_bias"),
    "aten._scaled_dot_product_cudnn_attention.default": _Kind(0, "bhsd", False, mask="attn_bias"),
    "aten._scaled_dot_product_cudnn_attention_backward.default":
        _Kind(1, "bhsd", True, mask="attn_bias"),
    "aten._flash_attention_forward.default": _Kind(0, "bshd", False, varlen=_FLASH_VARLEN),
    "aten._flash_attention_backward.default": _Kind(1, "bshd", True, varlen=_FLASH_VARLEN),
    "aten._efficient_attention_forward.default":
        _Kind(0, "bshd", False, mask="bias", varlen=_EFF_VARLEN),
    "aten._efficient_attention_backward.default":
        _Kind(1, "bshd", True, mask="bias", varlen=_EFF_VARLEN),
}
_FLEX = ("higher_order.flex_attention", "flex_attention")


def _dims(shape: tuple[int, ...], layout: str) -> tuple[int, int, int, int]:
    if len(shape) == 3:
        s, h, d = shape if layout == "bshd" else (shape[1], shape[0], shape[2])
        return 1, h, s, d
    if layout == "bshd":
        return shape[0], shape[2], shape[1], shape[3]
    return shape[0], shape[1], shape[2], shape[3]


def _scale(cost: Cost, num: int, den: int, mac_num: int = 1, mac_den: int = 1) -> Cost:
    """``cost`` for ``num/den`` of its scores, its MACs per score times ``mac_num/mac_den``."""
    if den <= 0:
        return Cost()
    macs = cost.macs * num * mac_num // (den * mac_den)
    other = (cost.flops - 2 * cost.macs) * num // den
    return Cost(macs, 2 * macs + max(other, 0), cost.bytes_read, cost.bytes_written)


class AttentionFigures:
    """A :class:`~flopscope.core.counter.CallObserver` that gives each attention call's counted,
    executed and model figures, summed per phase.

    Example::

        figures = AttentionFigures()
        with flopscope.Counter(model, observers=[figures]) as c:
            model(ids)
        figures.total().model.flops          # attention FLOPs of the visible pairs
        figures.adjust(c.report.total(), "model")   # the report's total, attention as model FLOPs

    Args:
        on_call_hook: optional callable given each call's (phase, counted, executed, model) costs
            (used by the generation step counter).
        assume_mask: what an explicit mask whose values cannot be read (shape-only counts) is
            taken to be: ``None`` (nothing: model = dense, :attr:`AttentionTotals.exact` is
            ``False``), ``"causal"`` (bottom-right causal: the queries are the last L_q
            positions) or an int W (a causal sliding window of W keys). The assumption is
            written in the notes.
    """

    def __init__(self, on_call_hook: Callable[[Phase, Cost, Cost, Cost], None] | None = None,
                 *, assume_mask: str | int | None = None) -> None:
        self.by_phase: dict[Phase, AttentionTotals] = {}
        self._hook = on_call_hook
        if assume_mask is not None and assume_mask != "causal" and not (
                isinstance(assume_mask, int) and assume_mask >= 1):
            raise ValueError(f"assume_mask must be None, 'causal' or a window >= 1, not "
                             f"{assume_mask!r}")
        self.assume_mask = assume_mask

    def reset(self) -> None:
        """Forget what was seen (a count that starts again)."""
        self.by_phase.clear()

    def total(self, phases: tuple[Phase, ...] | None = None) -> AttentionTotals:
        """The figures summed over ``phases`` (default: all).

        Args:
            phases: the phases to add up.

        Returns:
            One :class:`AttentionTotals`.
        """
        out = AttentionTotals()
        for phase, t in self.by_phase.items():
            if phases is not None and phase not in phases:
                continue
            out.counted += t.counted
            out.executed += t.executed
            out.model += t.model
            out.calls += t.calls
            out.exact = out.exact and t.exact
            out.notes |= t.notes
        return out

    def adjust(self, total: Cost, figure: str = "model",
               phases: tuple[Phase, ...] | None = None) -> Cost:
        """A report total with its attention read as ``figure`` instead of the counted one.

        Args:
            total: a total of the same run (e.g. ``report.total()``).
            figure: ``"model"``, ``"executed"`` or ``"counted"``.
            phases: the phases ``total`` covers (default all).

        Returns:
            ``total - counted attention + figure attention`` (bytes unchanged).

        Raises:
            ValueError: an unknown ``figure``.
        """
        t = self.total(phases)
        if figure not in ("model", "executed", "counted"):
            raise ValueError(f"figure must be 'model', 'executed' or 'counted', not {figure!r}")
        chosen: Cost = getattr(t, figure)
        return Cost(total.macs - t.counted.macs + chosen.macs,
                    total.flops - t.counted.flops + chosen.flops,
                    total.bytes_read, total.bytes_written)

    # -- the observer ------------------------------------------------------------------------
    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        """One costed call (see :class:`flopscope.core.counter.CallObserver`)."""
        if call is None:
            return
        kind = _KINDS.get(op)
        if kind is None:
            if op.startswith(_FLEX) and not op.endswith("backward") and len(call.args) > 4:
                self._flex(phase, call, cost)
            return
        totals = self.by_phase.setdefault(phase, AttentionTotals())
        q, k, v = call.args[kind.first], call.args[kind.first + 1], call.args[kind.first + 2]
        b, h, l_q, d = _dims(tuple(q.shape), kind.layout)
        _, _, l_k, _ = _dims(tuple(k.shape), kind.layout)
        d_v = _dims(tuple(v.shape), kind.layout)[3]
        dense = b * h * l_q * l_k
        causal = bool(_arg(call, "is_causal", False))
        align = "top-left"
        mask_type = _arg(call, "custom_mask_type", 0)
        if isinstance(mask_type, int) and mask_type in (1, 2):
            causal, align = True, ("top-left" if mask_type == 1 else "bottom-right")
        window = _arg(call, "window_size_left", None)
        model_pairs: int | None
        if kind.varlen is not None and _arg(call, kind.varlen[0]) is not None:
            cq, ck = _arg(call, kind.varlen[0]), _arg(call, kind.varlen[1])
            starts_q = [int(x) for x in cq.tolist()] if _readable(cq) else None
            starts_k = [int(x) for x in ck.tolist()] if _readable(ck) else None
            dense = h * varlen_pairs(starts_q, starts_k, b * l_q, b * l_k,
                                     _arg(call, kind.varlen[2]), _arg(call, kind.varlen[3]))
            model_pairs = dense
            if causal and starts_q is not None and starts_k is not None:
                model_pairs = h * sum(causal_pairs(q1 - q0, k1 - k0, align=align) for q0, q1, k0, k1
                                      in zip(starts_q, starts_q[1:], starts_k, starts_k[1:],
                                             strict=False))
            elif causal:
                totals.exact = False
                totals.notes.add("causal packed sequences on fake tensors: model = dense bound")
        else:
            mask = _arg(call, kind.mask) if kind.mask else None
            if mask is not None and isinstance(mask, torch.Tensor):
                if _readable(mask):
                    model_pairs = _mask_pairs(mask, (b, h, l_q, l_k), causal)
                elif self.assume_mask == "causal":
                    model_pairs = b * h * causal_pairs(l_q, l_k, align="bottom-right")
                    totals.notes.add("explicit mask without values (shape-only): assumed causal")
                elif isinstance(self.assume_mask, int):
                    model_pairs = b * h * sliding_window_pairs(l_q, l_k, self.assume_mask)
                    totals.notes.add(f"explicit mask without values (shape-only): assumed a "
                                     f"sliding window of {self.assume_mask}")
                else:
                    model_pairs = dense if not causal else b * h * causal_pairs(l_q, l_k)
                    totals.exact = False
                    totals.notes.add("explicit mask without values (shape-only): model = the "
                                     "unmasked bound")
            elif causal and isinstance(window, int) and window >= 0:
                model_pairs = b * h * sliding_window_pairs(l_q, l_k, window + 1, align="bottom-right")
            elif causal:
                model_pairs = b * h * causal_pairs(l_q, l_k, align=align)
            else:
                model_pairs = dense
        executed_pairs = dense
        if kind.cpu_flash and kind.varlen is None:
            executed_pairs = b * h * cpu_flash_executed_pairs(l_q, l_k, causal=causal)
        elif causal:
            totals.notes.add("GPU kernels' block skipping not modelled: executed = counted")
        if kind.backward:
            # recompute S (d) is the kernel's: model keeps dP, dV, dQ, dK (2d + 2d_v of 3d + 2d_v)
            model = _scale(cost, model_pairs, dense, 2 * d + 2 * d_v, 3 * d + 2 * d_v)
        else:
            model = _scale(cost, model_pairs, dense)
        executed = _scale(cost, executed_pairs, dense)
        self._add(totals, phase, cost, executed, model)

    def _flex(self, phase: Phase, call: OpCall, cost: Cost) -> None:
        totals = self.by_phase.setdefault(phase, AttentionTotals())
        q, k = call.args[0], call.args[1]
        block_mask = call.args[4] if isinstance(call.args[4], tuple) else ()
        dense = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]
        computed = _counted_scores(q, k, block_mask, dense)
        pairs = _block_mask_pairs(q, k, block_mask)
        if pairs is None:
            pairs = computed
            totals.exact = False
            totals.notes.add("BlockMask mask_mod not evaluated (fake tensors): model = the "
                             "computed blocks")
        self._add(totals, phase, cost, cost, _scale(cost, pairs, computed))

    def _add(self, totals: AttentionTotals, phase: Phase, counted: Cost, executed: Cost,
             model: Cost) -> None:
        totals.counted += counted
        totals.executed += executed
        totals.model += model
        totals.calls += 1
        if self._hook is not None:
            self._hook(phase, counted, executed, model)


def _counted_scores(q: torch.Tensor, k: torch.Tensor, block_mask: tuple[Any, ...], dense: int) -> int:
    from flopscope.rules.flex import computed_scores

    return computed_scores(q, k, block_mask) if block_mask else dense
