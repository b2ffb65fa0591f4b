"""FLOPs per token and MFU, counted, and the hand formulas they replace.

**Model FLOPs** of a training step are those of its forward and backward with attention read as
the visible query-key pairs (``docs/llm.md``): what the model needs whatever the implementation.
**Hardware FLOPs** add what the implementation chose to do on top: activation recomputation
(``Phase.RECOMPUTE``) and the attention kernels' executed work (dense or block-skipped scores,
the backward's recomputation of Q K^T). MFU = model FLOPs per second / peak (PaLM, Chowdhery et
al. 2022, appendix B); HFU = hardware FLOPs per second / peak.

The formulas (per token, training = forward + backward):

- PaLM / torchtitan: ``6 N + 12 L H Q T`` (N parameters, L layers, H heads, Q head dim, T
  sequence length; attention counted dense, no causal halving, 2 FLOPs per MAC, element-wise
  work ignored);
- Megatron-LM (Narayanan et al. 2021, eq. 3): ``72 l h^2 (1 + s / (6h) + V / (12 l h))`` per
  token without recomputation, ``96 l h^2 (1 + s / (6h) + V / (16 l h))`` with full recomputation
  (GPT layers: 4h MLP, MHA, no GQA, logits over the whole sequence);
- nanoGPT's ``transformer_sizing`` notebook: 3 x the forward's matmul FLOPs
  (QKV, Q K^T, P V, projection, MLP, LM head; attention dense).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopscope.cost import Cost, Phase
from flopscope.llm.attention import AttentionFigures, AttentionTotals
from flopscope.report.report import Report

__all__ = [
    "TokenFlops",
    "Utilization",
    "megatron_flops_per_token",
    "mfu",
    "nanogpt_flops_per_token",
    "palm_flops_per_token",
    "assumed_mask",
    "peak_flops",
    "report_flops",
    "report_utilization",
    "resolve_peak",
    "token_count",
    "token_flops",
]


def palm_flops_per_token(n_params: int, layers: int, heads: int, head_dim: int,
                         seq_len: int) -> int:
    """PaLM's (and torchtitan's) training FLOPs per token: ``6 N + 12 L H Q T``.

    Args:
        n_params: parameters N (PaLM: non-embedding; torchtitan and nanoGPT: all but the
            position embedding, the tied LM head once).
        layers: L.
        heads: H.
        head_dim: Q.
        seq_len: T.

    Returns:
        FLOPs per token of forward + backward.
    """
    return 6 * n_params + 12 * layers * heads * head_dim * seq_len


def megatron_flops_per_token(layers: int, hidden: int, seq_len: int, vocab: int, *,
                             recompute: bool = False) -> float:
    """Megatron-LM's training FLOPs per token (Narayanan et al. 2021, eq. 3, divided by B s).

    Args:
        layers: l.
        hidden: h.
        seq_len: s.
        vocab: V.
        recompute: full activation recomputation (one more forward: 96 instead of 72).

    Returns:
        FLOPs per token.
    """
    if recompute:
        return 96 * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72 * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (12 * layers * hidden))


def nanogpt_flops_per_token(layers: int, hidden: int, seq_len: int, vocab: int) -> int:
    """nanoGPT's ``transformer_sizing`` count: 3 x the forward matmul FLOPs, per token.

    Per layer and token: QKV 2 d 3d, scores 2 T d, P V 2 T d, projection 2 d^2, MLP 2 x 2 d 4d;
    LM head 2 d V.

    Args:
        layers: L.
        hidden: d.
        seq_len: T.
        vocab: V.

    Returns:
        FLOPs per token of forward + backward (3 x forward).
    """
    d = hidden
    per_layer = 2 * d * 3 * d + 2 * seq_len * d + 2 * seq_len * d + 2 * d * d + 2 * 2 * d * 4 * d
    return 3 * (layers * per_layer + 2 * d * vocab)


@dataclass
class TokenFlops:
    """Counted FLOPs of one forward (and backward) over ``tokens`` tokens.

    Attributes:
        tokens: batch x sequence length.
        report: the count.
        attention: attention figures per phase.
        by_phase: the report's total per phase.
    """

    tokens: int
    report: Report
    attention: AttentionFigures
    by_phase: dict[Phase, Cost] = field(default_factory=dict)

    def _attn(self, phases: tuple[Phase, ...]) -> AttentionTotals:
        return self.attention.total(phases)

    @property
    def model_flops(self) -> int:
        """Forward + backward, attention as visible pairs, no recomputation."""
        phases = (Phase.FORWARD, Phase.BACKWARD)
        counted = sum(self.by_phase.get(p, Cost()).flops for p in phases)
        a = self._attn(phases)
        return counted - a.counted.flops + a.model.flops

    @property
    def hardware_flops(self) -> int:
        """Forward + backward + recomputation, attention as the kernels execute it."""
        phases = (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE)
        counted = sum(self.by_phase.get(p, Cost()).flops for p in phases)
        a = self._attn(phases)
        return counted - a.counted.flops + a.executed.flops

    @property
    def counted_flops(self) -> int:
        """Forward + backward + recomputation as the report counts them (dense attention)."""
        return sum(c.flops for p, c in self.by_phase.items() if p is not Phase.OPTIMIZER)

    @property
    def matmul_flops(self) -> int:
        """2 x MACs of forward + backward (dense attention): the formulas' kind of FLOPs."""
        return 2 * sum(self.by_phase.get(p, Cost()).macs for p in (Phase.FORWARD, Phase.BACKWARD))

    def per_token(self) -> dict[str, float]:
        """Every figure divided by the token count."""
        return {"model_flops": self.model_flops / self.tokens,
                "hardware_flops": self.hardware_flops / self.tokens,
                "counted_flops": self.counted_flops / self.tokens,
                "matmul_flops": self.matmul_flops / self.tokens}

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"tokens": self.tokens, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops, "counted_flops": self.counted_flops,
                "matmul_flops": self.matmul_flops, "per_token": self.per_token(),
                "attention": {p.value: t.to_dict() for p, t in self.attention.by_phase.items()}}


def token_flops(
    model: nn.Module,
    *,
    seq_len: int,
    batch: int = 1,
    train: bool = True,
    recompute: bool = False,
    shape_only: bool = True,
    dropout: bool = False,
    assume_mask: str | int | None = "auto",
    **model_kwargs: Any,
) -> TokenFlops:
    """Count a language model over ``batch x seq_len`` tokens: forward, or forward + backward.

    Args:
        model: a model taking ``input_ids`` (transformers models and most LMs do).
        seq_len: T.
        batch: B.
        train: count the backward too (gradients of every trainable parameter).
        recompute: with activation recomputation (transformers' ``gradient_checkpointing_enable``;
            switched off again afterwards): hardware FLOPs then include the recomputed forward.
        shape_only: no arithmetic (fake / meta tensors).
        dropout: keep the model's dropout in training. By default every ``nn.Dropout`` is set to
            ``p = 0`` for the count (and put back): LLM pre-training runs without dropout, and
            PyTorch's CPU flash kernel refuses dropout, so SDPA would fall back to its unfused
            math form (dense matmuls in which no causal mask can be seen).
        assume_mask: what an explicit attention mask without values (shape-only) is taken to
            be (see :class:`AttentionFigures`); ``"auto"``: the config's ``sliding_window`` if it
            has one in use, else causal for a causal LM (a ``*ForCausalLM`` or ``*LMHeadModel`` class or
            ``config.is_decoder``), else nothing.
        **model_kwargs: more keyword arguments of the model (``use_cache=False`` is added for
            transformers models).

    Returns:
        The :class:`TokenFlops`.

    Raises:
        UsageError: ``recompute`` for a model without ``gradient_checkpointing_enable``.
    """
    from flopscope.errors import UsageError
    from flopscope.run import count

    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 2) or 2)
    ids = (torch.empty((batch, seq_len), dtype=torch.long, device="meta") if shape_only  # no memory
           else torch.randint(0, vocab, (batch, seq_len)))
    if hasattr(model, "config"):
        model_kwargs.setdefault("use_cache", False)
    figures = AttentionFigures(assume_mask=assumed_mask(model) if assume_mask == "auto"
                               else assume_mask)
    enabled = False
    dropped = [] if dropout else [(m, m.p) for m in model.modules() if isinstance(m, nn.Dropout)]
    for m, _ in dropped:
        m.p = 0.0
    if recompute:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise UsageError("recompute=True needs a model with gradient_checkpointing_enable() "
                             "(transformers); wrap your blocks in torch.utils.checkpoint instead")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        enabled = True
    try:
        report = count(model, input_ids=ids, backward=train, train=train or None,
                       shape_only=shape_only, warn=False, observers=[figures], **model_kwargs)
    finally:
        for m, p in dropped:
            m.p = p
        if enabled:
            model.gradient_checkpointing_disable()  # type: ignore[operator]
    by_phase = {p: report.total(p) for p in report.phases}
    return TokenFlops(batch * seq_len, report, figures, by_phase)


def assumed_mask(model: nn.Module) -> str | int | None:
    """What an attention mask without values (a shape-only count) is taken to be for ``model``:
    the config's ``sliding_window`` if it has one in use, else causal for a causal LM (a
    ``*ForCausalLM`` or ``*LMHeadModel`` class or ``config.is_decoder``), else ``None`` (the
    dense bound, marked inexact).

    Args:
        model: the model.

    Returns:
        ``"causal"``, a window, or ``None``.
    """
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window > 0 and getattr(config, "use_sliding_window", True):
        return window
    if (type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
            or getattr(config, "is_decoder", False)):
        return "causal"
    return None


def peak_flops(hardware: Any, dtype: torch.dtype = torch.bfloat16, *, tf32: bool = False) -> float:
    """Peak matrix FLOP/s of a hardware profile for ``dtype``, or a number given as is.

    Args:
        hardware: a profile name (``"h100-sxm"``), a :class:`flopscope.estimate.Hardware`, or
            a peak in FLOP/s (int or float).
        dtype: the dtype of the matrix products.
        tf32: float32 products run as TF32.

    Returns:
        FLOP/s.

    Raises:
        UsageError: an unknown profile or a dtype with no rate.
    """
    from flopscope.errors import UsageError

    if isinstance(hardware, (int, float)) and not isinstance(hardware, bool):
        if hardware <= 0:
            raise UsageError(f"a peak must be positive, not {hardware}")
        return float(hardware)
    from flopscope.estimate.hardware import get_hardware
    from flopscope.estimate.profile import dtype_key

    hw = get_hardware(hardware)
    key = dtype_key(dtype, tf32=tf32)
    if key is None:
        raise UsageError(f"no arithmetic rate for dtype {dtype}")
    return hw.peak(key, matrix=True)


def resolve_peak(hardware: Any = None, *, peak_tflops: float | None = None,
                 dtype: torch.dtype = torch.bfloat16,
                 tf32: bool = False) -> tuple[float, str, float | None]:
    """The peak a utilization is measured against: a hardware profile's matrix peak for
    ``dtype``, or a peak given in TFLOP/s (which wins over the profile's).

    Args:
        hardware: a profile name, a :class:`flopscope.estimate.Hardware`, or ``None``.
        peak_tflops: a peak in TFLOP/s (dense), or ``None``.
        dtype: the dtype of the matrix products.
        tf32: float32 products run as TF32.

    Returns:
        ``(peak FLOP/s, its name, memory bandwidth in bytes/s or None)``; the bandwidth comes
        from the profile.

    Raises:
        UsageError: neither given, an unknown profile, a peak that is not positive.
    """
    from flopscope.errors import UsageError

    bandwidth = name = None
    if hardware is not None:
        from flopscope.estimate.hardware import get_hardware
        from flopscope.estimate.profile import dtype_key

        hw = get_hardware(hardware)
        bandwidth = hw.memory_bandwidth
        name = f"{hw.name} {dtype_key(dtype, tf32=tf32)} matrix"
    if peak_tflops is not None:
        return peak_flops(peak_tflops * 1e12), "given", bandwidth
    if hardware is None:
        raise UsageError("a utilization needs a peak: a hardware profile or a peak in TFLOP/s")
    return peak_flops(hardware, dtype, tf32=tf32), name or "", bandwidth


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model (or hardware) FLOPs utilization: ``flops / seconds / peak``.

    Args:
        flops: model FLOPs of the timed work (hardware FLOPs give HFU).
        seconds: its wall time.
        peak: peak FLOP/s (:func:`peak_flops`).

    Returns:
        The fraction of peak (0.5 = 50%); 0 when ``seconds`` is 0.
    """
    if seconds <= 0 or peak <= 0:
        return 0.0
    return flops / seconds / peak


def report_flops(report: Report, figures: AttentionFigures) -> tuple[int, int, int]:
    """Counted, model and hardware FLOPs of a report counted with ``figures`` as observer.

    Model FLOPs: forward, backward and optimizer work with attention read as its visible
    query-key pairs, activation recomputation left out; hardware FLOPs: everything counted with
    attention as the kernels executed it (recomputation included).

    Args:
        report: the count.
        figures: the :class:`AttentionFigures` observer of that count.

    Returns:
        ``(counted, model, hardware)`` FLOPs.
    """
    counted = int(report.total().flops)
    recompute = int(report.total(Phase.RECOMPUTE).flops) if Phase.RECOMPUTE in report.phases else 0
    a_all = figures.total()
    a_model = figures.total((Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER))
    model = counted - recompute - a_model.counted.flops + a_model.model.flops
    hardware = counted - a_all.counted.flops + a_all.executed.flops
    return counted, model, hardware


@dataclass(frozen=True)
class Utilization:
    """How much of a machine's peak a measured run used.

    ``MFU = model FLOPs / seconds / peak`` (PaLM, Chowdhery et al. 2022, appendix B);
    ``HFU = hardware FLOPs / seconds / peak``; ``MBU = bytes / seconds / bandwidth`` with the
    bytes the work cannot avoid moving (for a decode step: the weights plus the KV cache read
    and written, the definition of Databricks' "LLM inference performance engineering", 2023).

    Attributes:
        label: what was timed (``"step"``, ``"prefill"``, ``"decode step"``).
        seconds: its measured wall time.
        model_flops: its model FLOPs.
        hardware_flops: its hardware FLOPs.
        peak: peak FLOP/s.
        peak_name: where the peak comes from (``"h100-sxm bf16 matrix"``).
        tokens: tokens processed (``None``: not a token model).
        bytes: bytes the work must move, for MBU (``None``: no MBU).
        bandwidth: memory bandwidth in bytes/s, for MBU.
    """

    label: str
    seconds: float
    model_flops: int
    hardware_flops: int
    peak: float
    peak_name: str = ""
    tokens: int | None = None
    bytes: int | None = None
    bandwidth: float | None = None

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization (0.5 = 50%)."""
        return mfu(self.model_flops, self.seconds, self.peak)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization."""
        return mfu(self.hardware_flops, self.seconds, self.peak)

    @property
    def mbu(self) -> float | None:
        """Memory-bandwidth utilization (``None`` without bytes or bandwidth)."""
        if self.bytes is None or not self.bandwidth or self.seconds <= 0:
            return None
        return self.bytes / self.seconds / self.bandwidth

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens per second (``None`` without tokens)."""
        if self.tokens is None or self.seconds <= 0:
            return None
        return self.tokens / self.seconds

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the inputs and ``mfu``, ``hfu``, ``mbu``, ``tokens_per_second``,
        ``model_tflops_per_second``."""
        return {"label": self.label, "seconds": self.seconds, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops, "peak_flops": self.peak,
                "peak_name": self.peak_name, "tokens": self.tokens, "bytes": self.bytes,
                "bandwidth": self.bandwidth, "mfu": self.mfu, "hfu": self.hfu, "mbu": self.mbu,
                "tokens_per_second": self.tokens_per_second,
                "model_tflops_per_second": self.model_flops / self.seconds / 1e12
                if self.seconds > 0 else 0.0}

    def line(self) -> str:
        """One line for a report: the rates and the arithmetic they come from."""
        from flopscope.render.units import human

        rate = int(self.model_flops / self.seconds) if self.seconds > 0 else 0
        parts = [f"{self.label} {self.seconds:g} s: model {human(self.model_flops, 'FLOPs')} -> "
                 f"{human(rate, 'FLOP/s')}; MFU {self.mfu:.2%} "
                 f"(HFU {self.hfu:.2%}) of {human(int(self.peak), 'FLOP/s')}"
                 + (f" {self.peak_name}" if self.peak_name else "")]
        tps = self.tokens_per_second
        if tps is not None:
            parts.append(f"{tps:,.1f} tokens/s")
        mbu = self.mbu
        if mbu is not None and self.bytes is not None and self.bandwidth:
            parts.append(f"MBU {mbu:.2%} ({human(self.bytes, 'B')} / {self.seconds:g} s of "
                         f"{human(int(self.bandwidth), 'B/s')})")
        return "; ".join(parts)


def token_count(args: Any, kwargs: Any = None) -> int | None:
    """Tokens of a model's inputs: the elements of ``input_ids``, else of the first integer
    tensor; ``None`` when no integer tensor is given (an image model: no tokens).

    Args:
        args: the inputs (any nesting of tensors, lists, dicts).
        kwargs: more inputs.

    Returns:
        The token count, or ``None``.
    """
    ids = kwargs.get("input_ids") if isinstance(kwargs, dict) else None
    if isinstance(ids, torch.Tensor):
        return int(ids.numel())
    stack: list[Any] = [args, kwargs]
    while stack:
        tree = stack.pop(0)
        if isinstance(tree, torch.Tensor):
            if not (tree.is_floating_point() or tree.is_complex() or tree.dtype is torch.bool):
                return int(tree.numel())
        elif isinstance(tree, dict):
            stack[:0] = list(tree.values())
        elif isinstance(tree, (list, tuple)):
            stack[:0] = list(tree)
    return None


def report_utilization(report: Report, figures: AttentionFigures, inputs: Any, *,
                       seconds: float, peak: tuple[float, str, float | None]) -> Utilization:
    """MFU and HFU of a counted forward (or forward + backward) that took ``seconds``.

    Args:
        report: the count.
        figures: the :class:`AttentionFigures` observer of that count.
        inputs: the inputs counted (a :class:`flopscope.Inputs`, or anything with ``args`` and
            ``kwargs``), for the token count.
        seconds: the measured wall time of the same work.
        peak: ``(peak FLOP/s, name, bandwidth)`` from :func:`resolve_peak`.

    Returns:
        The :class:`Utilization` (no MBU: a count's bytes are per operator, not what a fused
        run must move).
    """
    _, model, hardware = report_flops(report, figures)
    label = "forward + backward" if Phase.BACKWARD in report.phases else "forward"
    tokens = token_count(getattr(inputs, "args", ()), getattr(inputs, "kwargs", {}))
    return Utilization(label, seconds, model, hardware, peak[0], peak[1], tokens)
