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
from flopscope.rules.attention import varlen_pairs

__all__ = [
    "CPU_FLASH_KV_BLOCK",
    "AttentionFigures",
    "AttentionTotals",
    "causal_pairs",
    "cpu_flash_block_sizes",
    "cpu_flash_executed_pairs",
    "flash2_block_sizes",
    "flash2_executed_pairs",
    "sliding_window_pairs",
]

CPU_FLASH_KV_BLOCK = 512


def cpu_flash_block_sizes(l_q: int, l_k: int) -> tuple[int, int]:
    """(query block, key block) of PyTorch's CPU flash attention kernel for these lengths.

    Args:
        l_q: query length.
        l_k: key length.

    Returns:
        256 / 64 / 32 query rows for L_q >= 768 / >= 192 / shorter (at most L_q), and 512 keys (at
        most L_k), as ``flash_attention_kernel_impl`` chooses.
    """
    q_split = 256 if l_q >= 768 else 64 if l_q >= 192 else 32
    return min(q_split, l_q), min(CPU_FLASH_KV_BLOCK, l_k)


def cpu_flash_executed_pairs(l_q: int, l_k: int, *, causal: bool) -> int:
    """Score elements (per batch and head) that the CPU flash kernel computes.

    Args:
        l_q: query length.
        l_k: key length.
        causal: ``is_causal=True`` (top-left).

    Returns:
        Without ``causal`` L_q x L_k; with it, the sum over query blocks of the block's rows times
        the keys of the key blocks it visits (whole blocks up to ``min(m + q_block, L_k)``).
    """
    if not causal:
        return l_q * l_k
    q_block, kv_block = cpu_flash_block_sizes(l_q, l_k)
    total = 0
    for m in range(0, l_q, q_block):
        rows = min(q_block, l_q - m)
        num_keys = min(m + rows, l_k)
        blocks = -(-num_keys // kv_block)  # key blocks with a start below num_keys
        total += rows * min(blocks * kv_block, l_k)
    return total


def flash2_block_sizes(head_dim: int, *, capability: tuple[int, int] = (9, 0),
                       causal: bool = True, dropout: bool = False) -> tuple[int, int]:
    """(kBlockM, kBlockN): the query and key tiles of FlashAttention-2's forward kernel as
    PyTorch's copy launches it (``aten/src/ATen/native/transformers/cuda/flash_attn/
    flash_fwd_launch_template.h``, ``run_mha_fwd_hdim*``; the same choices as
    Dao-AILab/flash-attention's ``csrc/flash_attn/src/flash_fwd_launch_template.h``).

    The head dimension is rounded up to the kernel's next instantiation (32, 64, 96, 128, 160,
    192). sm86/sm89 (``capability`` 8.x with x > 0) take square 64 x 64 tiles under a causal
    mask for head dims 96 to 160; A100 (8.0) and H100 (9.0) take 128 x 64 (128 x 32 for 160).

    Args:
        head_dim: d.
        capability: the GPU's compute capability (``torch.cuda.get_device_capability()``).
        causal: a causal mask.
        dropout: attention dropout in training.

    Returns:
        (query rows, keys) per tile.

    Raises:
        UsageError: a head dimension above 192 (224 and 256 choose by the GPU's shared memory,
            which is not modelled).
    """
    from flopscope.errors import UsageError

    if head_dim < 1 or head_dim > 192:
        raise UsageError(f"FlashAttention-2 tiles are modelled for head dims 1 to 192, not "
                         f"{head_dim} (224 and 256 depend on the GPU's shared memory)")
    d = next(x for x in (32, 64, 96, 128, 160, 192) if head_dim <= x)
    sm8x = capability[0] == 8 and capability[1] > 0
    if d == 32:
        return 128, 128
    if d == 64:
        return (128, 64) if dropout else (128, 128)
    if d == 96:
        return (64, 64) if sm8x and causal else (128, 64)
    if d == 128:
        if dropout:
            return 128, 32
        if sm8x:
            return (64, 64) if causal else (128, 32)
        return 128, 64
    if d == 160:
        if sm8x:
            return (64, 64) if causal else (128, 64)
        return 128, 32
    return (64, 64) if dropout else (128, 64)


def flash2_executed_pairs(l_q: int, l_k: int, *, block_m: int, block_n: int,
                          causal: bool = True, window: int | None = None) -> int:
    """Query-key pairs FlashAttention-2's forward computes (per batch and head): every query
    tile ``m`` multiplies the key tiles ``n_block_min <= n < n_block_max`` whole, where (from
    ``flash_fwd_kernel.h``, ``compute_attn_1rowblock``; causal is bottom-right aligned)::

        n_block_max = min(ceil(L_k / Bn), ceil(((m + 1) Bm + L_k - L_q) / Bn))   # causal
        n_block_min = max(0, floor((m Bm + L_k - L_q - window) / Bn))             # local

    Pairs are counted within the sequence (rows below L_q, keys below L_k); the tiles' padding
    past the ends is not.

    Args:
        l_q: L_q.
        l_k: L_k.
        block_m: Bm (:func:`flash2_block_sizes`).
        block_n: Bn.
        causal: the causal mask (``window_size_right = 0``).
        window: a sliding window's left size (``window_size_left``), or ``None``.

    Returns:
        The pairs computed, masked ones in the diagonal tiles included.
    """
    total = 0
    n_all = -(-l_k // block_n)
    for m in range(0, -(-l_q // block_m)):
        rows = min(block_m, l_q - m * block_m)
        n_max = n_all
        if causal:
            n_max = min(n_all, -(-((m + 1) * block_m + l_k - l_q) // block_n))
        n_min = 0
        if window is not None:
            n_min = max(0, (m * block_m + l_k - l_q - window) // block_n)
        if n_max > n_min:
            total += rows * (min(n_max * block_n, l_k) - n_min * block_n)
    return total


def causal_pairs(l_q: int, l_k: int, *, align: str = "top-left") -> int:
    """Visible (query, key) pairs per batch and head under a causal mask.

    Args:
        l_q: query length.
        l_k: key length.
        align: ``"top-left"`` (query i sees keys 0..i: ``torch``'s ``is_causal``) or
            ``"bottom-right"`` (query i sees keys 0..i + L_k - L_q: a query block at the end of a
            KV cache).

    Returns:
        The number of visible pairs; L (L + 1) / 2 when L_q = L_k = L.

    Raises:
        ValueError: an unknown ``align``.
    """
    if align == "top-left":
        offset = 0
    elif align == "bottom-right":
        offset = l_k - l_q
    else:
        raise ValueError(f"align must be 'top-left' or 'bottom-right', not {align!r}")
    return sum(max(0, min(i + 1 + offset, l_k)) for i in range(l_q))


def sliding_window_pairs(l_q: int, l_k: int, window: int, *, align: str = "bottom-right") -> int:
    """Visible pairs per batch and head under a causal sliding window of ``window`` keys.

    Query i (at position p = i + offset) sees keys p - window + 1 .. p, as transformers'
    ``sliding_window`` and Mistral define it (the query's own key included).

    Args:
        l_q: query length.
        l_k: key length.
        window: keys each query sees at most.
        align: as in :func:`causal_pairs` (default bottom-right: queries at the end of the keys).

    Returns:
        The number of visible pairs: sum over queries of min(p + 1, window).

    Raises:
        ValueError: an unknown ``align`` or a window below 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, not {window}")
    if align not in ("top-left", "bottom-right"):
        raise ValueError(f"align must be 'top-left' or 'bottom-right', not {align!r}")
    offset = l_k - l_q if align == "bottom-right" else 0
    return sum(max(0, min(i + 1 + offset, l_k, window)) for i in range(l_q))


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
