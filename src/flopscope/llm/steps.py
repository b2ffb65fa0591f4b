"""What a generation loop costs, step by step: :class:`Step` (one forward: prefill or decode, its
cost, KV-cache bytes, attention three ways) and :class:`GenerationReport` (the steps, the work
between them, totals per token, utilization of a measured run, a table). Made by
:class:`~flopscope.llm.generate.StepCounter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flopscope.cost import Cost
from flopscope.llm.flops import Utilization
from flopscope.report.report import Report

__all__ = ["GenerationReport", "Step"]


@dataclass(frozen=True)
class Step:
    """One forward of a generation loop.

    Attributes:
        index: 0 for the first forward.
        kind: ``"prefill"`` or ``"decode"``.
        tokens: query tokens processed (batch x new positions).
        context: keys attended per sequence at the end of the step (the cache length); 0 when
            the model returned no cache.
        cost: MACs, FLOPs and bytes of every operator of the step (attention as counted).
        kv_read: KV-cache bytes read (every layer's keys and values after the step).
        kv_written: KV-cache bytes the step added.
        attention_counted_flops: attention FLOPs as the report counts them (dense).
        attention_executed_flops: attention FLOPs the kernels computed.
        attention_model_flops: attention FLOPs of the visible query-key pairs.
    """

    index: int
    kind: str
    tokens: int
    context: int
    cost: Cost
    kv_read: int = 0
    kv_written: int = 0
    attention_counted_flops: int = 0
    attention_executed_flops: int = 0
    attention_model_flops: int = 0

    @property
    def model_flops(self) -> int:
        """The step's FLOPs with attention read as model FLOPs."""
        return self.cost.flops - self.attention_counted_flops + self.attention_model_flops

    @property
    def executed_flops(self) -> int:
        """The step's FLOPs with attention read as executed FLOPs."""
        return self.cost.flops - self.attention_counted_flops + self.attention_executed_flops

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``tokens``, ``macs``, ``flops``, ``bytes_read``, ``bytes_written``, ..."""
        return {"index": self.index, "kind": self.kind, "tokens": self.tokens,
                "context": self.context, **self.cost.to_dict(), "kv_read": self.kv_read,
                "kv_written": self.kv_written, "model_flops": self.model_flops,
                "executed_flops": self.executed_flops,
                "attention": {"counted_flops": self.attention_counted_flops,
                              "executed_flops": self.attention_executed_flops,
                              "model_flops": self.attention_model_flops}}


@dataclass(frozen=True)
class GenerationReport:
    """Per-step costs of a generation loop.

    Attributes:
        steps: one :class:`Step` per forward, in order.
        between: work outside the model's forwards (sampling, logits processing).
        report: the whole run's :class:`~flopscope.Report`.
        notes: approximations met (attention masks without values, ...).
        attention_exact: whether every attention call's visible pairs were known (masks that
            could be read); ``False``: the model figures are the dense ones.
    """

    steps: tuple[Step, ...]
    between: Cost
    report: Report
    notes: tuple[str, ...] = ()
    attention_exact: bool = True

    @property
    def prefill(self) -> tuple[Step, ...]:
        """The prefill step(s)."""
        return tuple(s for s in self.steps if s.kind == "prefill")

    @property
    def decode(self) -> tuple[Step, ...]:
        """The decode steps."""
        return tuple(s for s in self.steps if s.kind == "decode")

    def summary(self) -> dict[str, Any]:
        """Prefill and decode totals, per-token averages and growth over the context.

        Returns:
            ``prefill`` / ``decode``: tokens, MACs, FLOPs, model FLOPs, bytes, KV bytes and per
            token averages; ``growth``: per extra key of context, the change of a decode step's
            FLOPs and KV bytes read (first to last decode step).
        """
        out: dict[str, Any] = {}
        for name, steps in (("prefill", self.prefill), ("decode", self.decode)):
            tokens = sum(s.tokens for s in steps)
            total = sum((s.cost for s in steps), Cost())
            part: dict[str, Any] = {"steps": len(steps), "tokens": tokens, **total.to_dict(),
                    "model_flops": sum(s.model_flops for s in steps),
                    "kv_read": sum(s.kv_read for s in steps),
                    "kv_written": sum(s.kv_written for s in steps)}
            if tokens:
                part["per_token"] = {k: part[k] / tokens for k in
                                     ("macs", "flops", "model_flops", "bytes_read",
                                      "bytes_written", "kv_read")}
            out[name] = part
        dec = self.decode
        if len(dec) >= 2 and dec[-1].context != dec[0].context:
            span = dec[-1].context - dec[0].context
            out["growth"] = {
                "per_context_token_flops": (dec[-1].cost.flops - dec[0].cost.flops) / span,
                "per_context_token_kv_read": (dec[-1].kv_read - dec[0].kv_read) / span,
                "first_decode_flops": dec[0].cost.flops, "last_decode_flops": dec[-1].cost.flops,
            }
        out["between"] = self.between.to_dict()
        return out

    def utilization(self, peak: tuple[float, str, float | None], *,
                    prefill_seconds: float | None = None,
                    decode_seconds: float | None = None,
                    weights: int = 0) -> list[Utilization]:
        """MFU (and MBU) of a measured generation: the prefill from its time (time to first
        token), the decode steps from their mean time each (time per output token).

        Decode: seconds = steps x ``decode_seconds``; model FLOPs = the decode steps' sum
        (attention as visible pairs), hardware FLOPs = as executed; tokens = the steps' tokens;
        bytes for MBU = steps x ``weights`` + the KV cache read and written (every step reads
        all its weights and the whole cache, and writes its new entries).

        Args:
            peak: ``(peak FLOP/s, name, memory bandwidth or None)`` (see
                :func:`flopscope.llm.flops.resolve_peak`).
            prefill_seconds: measured prefill time, or ``None``.
            decode_seconds: measured mean time of one decode step, or ``None``.
            weights: bytes of the weights a decode step reads (:func:`weight_bytes`); 0: no MBU.

        Returns:
            One :class:`Utilization` per time given: the prefill's, then the decode's.
        """
        out = []
        peak_flops, name, bandwidth = peak
        if prefill_seconds is not None and self.prefill:
            steps = self.prefill
            out.append(Utilization(
                "prefill", prefill_seconds, sum(s.model_flops for s in steps),
                sum(s.executed_flops for s in steps), peak_flops, name,
                sum(s.tokens for s in steps)))
        if decode_seconds is not None and self.decode:
            steps = self.decode
            moved = len(steps) * weights + sum(s.kv_read + s.kv_written for s in steps)
            out.append(Utilization(
                f"decode ({len(steps)} x {decode_seconds:g} s)", len(steps) * decode_seconds,
                sum(s.model_flops for s in steps), sum(s.executed_flops for s in steps),
                peak_flops, name, sum(s.tokens for s in steps),
                moved if weights else None, bandwidth))
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{"steps": [...], "summary": {...}, "notes": [...], "report": {...}}``."""
        return {"steps": [s.to_dict() for s in self.steps], "summary": self.summary(),
                "notes": list(self.notes), "report": self.report.to_dict()}

    def table(self, *, max_rows: int = 12,
              columns: Sequence[tuple[str, Sequence[str]]] = ()) -> str:
        """A plain-text table of the steps (the first and last ones when there are many).

        Args:
            max_rows: steps shown at most.
            columns: extra columns: (header, one cell per step).

        Returns:
            The table and a summary, as text.
        """
        from flopscope.render.units import human

        head = ("step", "kind", "tokens", "context", "MACs", "FLOPs", "model FLOPs", "bytes",
                "KV read", "KV written", *(h for h, _ in columns))
        rows: list[tuple[str, ...]] = [head]
        steps = list(self.steps)
        shown: list[Step | None] = list(steps)
        if len(steps) > max_rows:
            half = max_rows // 2
            shown = [*steps[:half], None, *steps[-half:]]
        for s in shown:
            if s is None:
                rows.append(("...",) + ("",) * (len(head) - 1))
                continue
            rows.append((str(s.index), s.kind, str(s.tokens), str(s.context), human(s.cost.macs),
                         human(s.cost.flops), human(s.model_flops), human(s.cost.bytes, "B"),
                         human(s.kv_read, "B"), human(s.kv_written, "B"),
                         *(cells[s.index] for _, cells in columns)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        summ = self.summary()
        for name in ("prefill", "decode"):
            part = summ[name]
            if part.get("per_token"):
                pt = part["per_token"]
                lines.append(f"{name}: {part['steps']} step(s), {part['tokens']} tokens, "
                             f"{human(part['flops'])}FLOPs; per token {human(int(pt['flops']))}"
                             f"FLOPs ({human(int(pt['model_flops']))}FLOPs model), "
                             f"{human(int(pt['bytes_read']), 'B')} read, "
                             f"KV read {human(int(pt['kv_read']), 'B')}")
        if "growth" in summ:
            g = summ["growth"]
            lines.append(f"decode growth per key of context: {g['per_context_token_flops']:.0f} "
                         f"FLOPs, {g['per_context_token_kv_read']:.0f} KV bytes read")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
