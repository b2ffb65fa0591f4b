"""Pipeline parallelism: a decoder split into stages, one stage per rank of a pipeline group, run
by torch's own pipelining runtime (``torch.distributed.pipelining``: ``PipelineStage`` with static
metadata, ``ScheduleGPipe`` / ``Schedule1F1B``) on the fake process group, and counted per stage.

The split (:func:`split_layers`, :class:`DecoderStage`): the decoder layers in contiguous runs, as
even as possible, the extra layers on the earliest stages (``numpy.array_split``'s rule); the
embedding on the first stage, the final norm and the vocabulary head on the last; every stage
computes the rotary embedding's cos/sin table for its own layers (as torchtitan's stages do with
their ``freqs_cis``). Module paths are the whole model's (``model.layers.5.mlp``).

What a stage sends: per microbatch, the activations it hands to the next stage in forward and the
gradient of its input it hands back in backward (point-to-point ``send``/``recv``, bus bytes =
payload), issued outside any module and autograd node: attributed to the stage's root and to the
phase of what they carry (activations forward, gradients backward).

The bubble: the order in which torch's schedule ran each stage's forward and backward
microbatches (noted by the stage as it runs them) replayed with each action lasting its stage's
counted FLOPs per microbatch (every rank running at the same FLOP rate; communication time left
out), so the idle fraction is that of the counted work. With equal stages and backward = 2 x forward it is the textbook
``(p - 1) / (m + p - 1)`` for both GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from flopscope.cost import Phase
from flopscope.errors import UsageError
from flopscope.report.report import Report

__all__ = ["SCHEDULES", "DecoderStage", "PipelineReport", "bubble", "split_layers"]

#: pipeline schedules by name -> the torch class name in ``torch.distributed.pipelining``
SCHEDULES: dict[str, str] = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def split_layers(n_layers: int, stages: int) -> list[range]:
    """Contiguous runs of layer indices, one per stage, as even as possible (the first
    ``n_layers % stages`` stages take one more).

    Args:
        n_layers: decoder layers.
        stages: pipeline stages.

    Returns:
        One ``range`` per stage.

    Raises:
        UsageError: more stages than layers.
    """
    if stages > n_layers:
        raise UsageError(f"--pp {stages} is more pipeline stages than the model's {n_layers} "
                         "decoder layers: every stage needs at least one layer")
    base, extra = divmod(n_layers, stages)
    out: list[range] = []
    start = 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


class DecoderStage(nn.Module):
    """One pipeline stage of a transformers decoder LM (``model.embed_tokens``, ``model.layers``,
    ``model.norm``, ``model.rotary_emb``, ``lm_head``): the stage's layers, the embedding on the
    first stage, the norm and head on the last. Built from ``model`` by taking its modules (the
    model is consumed: its layer list becomes a ``ModuleDict`` of the stage's layers, keyed by
    their indices, so the paths stay those of the whole model).

    Args:
        model: a transformers causal LM (built for this stage alone).
        stage: this stage's index.
        stages: the number of stages.
        sequence_shards: the stages pass sequence shards of this many tensor-parallel ranks
            (sequence parallelism: a later stage's input is ``1 / sequence_shards`` of the
            sequence; its rotary positions are the whole sequence's).

    Raises:
        UsageError: the model does not have that structure, or has fewer layers than stages.
    """
    def __init__(self, model: nn.Module, stage: int, stages: int,
                 sequence_shards: int = 1) -> None:
        super().__init__()
        self.sequence_shards = sequence_shards
        base = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if (base is None or not isinstance(getattr(base, "layers", None), nn.ModuleList)
                or not all(hasattr(base, n) for n in needed)
                or not isinstance(getattr(model, "lm_head", None), nn.Module)):
            raise UsageError(
                f"{type(model).__name__} is not split into pipeline stages: --pp is written for "
                "transformers decoders with model.embed_tokens, model.layers, model.norm, "
                "model.rotary_emb and lm_head (Llama, Mistral, Qwen2 ...)")
        layers = base.layers
        self.first = stage == 0
        self.last = stage == stages - 1
        self.layer_indices = split_layers(len(layers), stages)[stage]
        base.layers = nn.ModuleDict({str(i): layers[i] for i in self.layer_indices})
        if not self.first:
            base.embed_tokens = None
        if not self.last:
            base.norm = None
        self.model = base
        self.lm_head = model.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states -> hidden states (logits on the last stage).

        Attention runs without a mask, causal (``is_causal``), as the whole model does for an
        unpadded batch."""
        base: Any = self.model
        h = base.embed_tokens(x) if self.first else x
        tokens = h.shape[1] if self.first else h.shape[1] * self.sequence_shards
        position_ids = torch.arange(tokens, device=h.device).unsqueeze(0)
        position_embeddings = base.rotary_emb(h, position_ids=position_ids)
        for layer in base.layers.values():
            h = layer(h, attention_mask=None, position_embeddings=position_embeddings,
                      position_ids=position_ids)
        if self.last:
            head: Any = self.lm_head
            h = head(base.norm(h))
        return h


@dataclass(frozen=True)
class PipelineReport:
    """Every stage of a pipeline: its rank's report, and the schedule's bubble.

    Attributes:
        schedule: ``gpipe`` or ``1f1b``.
        microbatches: microbatches per step (m).
        ranks: the rank counted for each stage (one pipeline group).
        stages: the reports, in stage order (each with its point-to-point communication).
        bubble: the idle fraction of the pipeline group (see :func:`bubble`).
        stage_bubbles: the idle fraction of each stage.
    """

    schedule: str
    microbatches: int
    ranks: tuple[int, ...]
    stages: tuple[Report, ...]
    bubble: Fraction
    stage_bubbles: tuple[Fraction, ...]

    def p2p_per_microbatch(self, stage: int) -> dict[str, int]:
        """Bytes stage ``stage`` sends and receives per microbatch.

        Returns:
            ``{"send_forward", "recv_forward", "send_backward", "recv_backward"}``: payload
            bytes per microbatch (forward: activations; backward: gradients).
        """
        out = {f"{k}_{p.value}": 0 for p in (Phase.FORWARD, Phase.BACKWARD) for k in
               ("send", "recv")}
        for r in self.stages[stage].communication:
            if r.kind in ("send", "recv") and r.phase in (Phase.FORWARD, Phase.BACKWARD):
                out[f"{r.kind}_{r.phase.value}"] += r.payload_bytes // self.microbatches
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready: schedule, microbatches, bubble (float and exact fraction), and per stage
        its rank, idle fraction, MACs, FLOPs, bus bytes of its collectives and point-to-point
        bytes per microbatch."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "bubble": float(self.bubble),
            "bubble_fraction": str(self.bubble),
            "stages": [
                {"stage": s, "rank": self.ranks[s], "bubble": float(self.stage_bubbles[s]),
                 "macs": r.macs, "flops": r.flops,
                 "bus_bytes": r.communication_total().bus_bytes,
                 "p2p_bytes_per_microbatch": self.p2p_per_microbatch(s)}
                for s, r in enumerate(self.stages)],
        }

    def to_dict(self) -> dict[str, Any]:
        """:meth:`summary` with every stage's whole report (``Report.to_dict``)."""
        out = self.summary()
        for entry, r in zip(out["stages"], self.stages, strict=True):
            entry["report"] = r.to_dict()
        return out


# -- the bubble ----------------------------------------------------------------------------------
def bubble(
    order: Sequence[Sequence[tuple[str, int]]],
    forward: Sequence[Fraction | int],
    backward: Sequence[Fraction | int],
) -> tuple[Fraction, tuple[Fraction, ...]]:
    """Replay a pipeline's actions with given durations and measure the idle time.

    Each stage runs its actions in order; a forward of stage s on microbatch i starts when stage
    s-1 has finished that microbatch's forward, a backward when stage s+1 has finished its
    backward (the last stage: its own forward).

    Args:
        order: per stage, its actions in the order it ran them: ``("F", microbatch)`` or
            ``("B", microbatch)``.
        forward: duration of one microbatch's forward per stage.
        backward: duration of one microbatch's backward per stage.

    Returns:
        The group's idle fraction (1 - busy / (stages x makespan)) and each stage's.

    Raises:
        RuntimeError: the order deadlocks (an action waits for one that never comes first).
    """
    p = len(order)
    # replayed in integers: every duration over their common denominator (a float's is a power
    # of two), so each start and end is exact as with fractions, at integer speed (a 64-stage
    # pipeline of 256 microbatches is 32,768 actions)
    durations = [Fraction(d) for d in (*forward, *backward)]
    scale = math.lcm(*(d.denominator for d in durations)) if durations else 1
    ticks = [d.numerator * (scale // d.denominator) for d in durations]
    fwd, bwd = ticks[:len(forward)], ticks[len(forward):]
    # when each stage finished each microbatch's forward and backward (absent: not yet)
    f_done: list[dict[int, int]] = [{} for _ in range(p)]
    b_done: list[dict[int, int]] = [{} for _ in range(p)]
    clock = [0] * p
    busy = [0] * p
    pos = [0] * p
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            actions, at, now = order[s], pos[s], clock[s]
            while at < len(actions):
                kind, i = actions[at]
                if kind == "F":
                    ready = f_done[s - 1].get(i) if s > 0 else 0
                else:
                    ready = b_done[s + 1].get(i) if s < p - 1 else f_done[s].get(i)
                if ready is None:
                    break
                length = fwd[s] if kind == "F" else bwd[s]
                now = (ready if ready > now else now) + length
                (f_done if kind == "F" else b_done)[s][i] = now
                busy[s] += length
                at += 1
                progressed = True
            pos[s], clock[s] = at, now
        if not progressed:
            raise RuntimeError("the pipeline's actions deadlock when replayed")
    span = max(clock)
    if span == 0:
        return Fraction(0), tuple(Fraction(0) for _ in range(p))
    return (1 - Fraction(sum(busy), p * span),
            tuple(1 - Fraction(b, span) for b in busy))
