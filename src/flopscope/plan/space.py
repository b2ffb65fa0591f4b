"""The search space of a training plan: every layout (tensor x pipeline x data-parallel degrees,
micro-batch, activation checkpointing) that divides the model and the devices.

A layout is built by :func:`flopscope.distributed.apply_layout`: tensor-parallel ranks are
neighbours (the standard Llama plan: column-wise q/k/v and gate/up, row-wise o and down), the
data-parallel ranks are FSDP2 shards, pipeline stages the outermost dimension
(:func:`flopscope.distributed.pipeline.split_layers`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flopscope.errors import UsageError
from flopscope.plan.checkpointing import CHECKPOINTING, KNOWN, LABEL_SUFFIX

__all__ = ["DATA_PARALLEL", "SEQUENCE_PARALLEL", "Choice", "ModelShape", "data_parallel_kinds", "divisors", "enumerate_layouts",
           "expert_count", "expert_degree", "parse_bytes", "sequence_parallel_mode"]

#: How a training plan treats sequence parallelism on tensor-parallel layouts without stages:
#: ``"off"``, ``"on"`` (every such layout has it) or ``"search"`` (each such layout with and
#: without it, so the plan chooses).
SEQUENCE_PARALLEL = ("off", "on", "search")

#: How a layout's data-parallel ranks hold the model: ``"fsdp"`` (FSDP2: parameters, gradients
#: and optimizer state sharded), ``"ddp"`` (DistributedDataParallel: whole replicas, gradients
#: all-reduced once a step), ``"zero1"`` (DDP with AdamW's state sharded over the replicas:
#: ZeRO stage 1, Megatron-LM's distributed optimizer) or ``"zero2"`` (FSDP2 keeping each
#: layer's gathered parameters from its forward to its backward, ``reshard_after_forward=False``:
#: no all-gather in backward; FSDP1's SHARD_GRAD_OP, ZeRO stage 2 from the forward on)
DATA_PARALLEL = ("fsdp", "ddp", "zero1", "zero2")

#: the label's name of each kind's data-parallel degree (``DP4``, ``DDP4``, ``DDP4 Z1``,
#: ``DP4 Z2``)
_DP_LABEL = {"fsdp": "DP{}", "ddp": "DDP{}", "zero1": "DDP{} Z1", "zero2": "DP{} Z2"}



def expert_count(config: Any) -> int:
    """The experts per MoE layer of a transformers config (``num_local_experts``,
    ``num_experts``), 0 for a dense model.

    Args:
        config: the model's config.

    Returns:
        The number of experts.
    """
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 1:
            return value
    return 0


def expert_degree(experts: int, tp: int) -> int | None:
    """How a serving layout of ``tp``-way tensor parallelism holds a mixture of experts: its
    experts sharded over the tensor-parallel ranks (expert parallelism, ``ep = tp``; attention
    tensor-parallel), as :class:`~flopscope.distributed.Layout` builds it.

    Args:
        experts: experts per MoE layer (0: a dense model).
        tp: tensor-parallel degree.

    Returns:
        The expert-parallel degree: 1 for a dense model or one rank, ``tp`` where it divides
        the experts, ``None`` where it does not (no such layout).
    """
    if not experts or tp == 1:
        return 1
    return tp if experts % tp == 0 else None


@dataclass(frozen=True)
class ModelShape:
    """What the layout rules need of a decoder's config.

    Attributes:
        layers: decoder layers (``num_hidden_layers``).
        heads: attention heads.
        kv_heads: key/value heads.
        intermediate: the MLP's hidden size (0 where the config does not give it).
        experts: experts per MoE layer (:func:`expert_count`; 0 for a dense model).
    """

    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    experts: int = 0

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Read a transformers decoder config.

        Args:
            config: the model's ``config``.

        Returns:
            The shape.

        Raises:
            UsageError: the config is not a decoder's (no layers, heads or MLP size).
        """
        try:
            heads = int(config.num_attention_heads)
            # GPT-2's config gives no intermediate size (n_inner may be None): 0, and such a
            # model takes no tensor parallelism (distributed.layout.tp_plan_problem)
            return cls(int(config.num_hidden_layers), heads,
                       int(getattr(config, "num_key_value_heads", None) or heads),
                       int(getattr(config, "intermediate_size", None) or 0),
                       expert_count(config))
        except AttributeError as e:
            raise UsageError(f"plan needs a transformers decoder (Llama, Mistral, Qwen2 ...): "
                             f"its config has no {e.name or 'layer/head count'}") from None


@dataclass(frozen=True)
class Choice:
    """One layout of a training step.

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline stages.
        dp: data-parallel (FSDP2) degree.
        micro_batch: sequences per microbatch on a rank.
        microbatches: microbatches per step (pipelined, or accumulated without stages).
        checkpoint: ``"none"``, ``"block"`` (every decoder block recomputed in backward) or
            ``"selective"`` (inside each block, what is not a matrix product, attention or a
            tensor-parallel collective recomputed: :mod:`flopscope.plan.checkpointing`).
        data_parallel: ``"fsdp"`` (FSDP2: parameters sharded over the data-parallel ranks),
            ``"ddp"`` (parameters replicated, gradients all-reduced once a step:
            :attr:`flopscope.distributed.Layout.replicate`), ``"zero1"`` (DDP with AdamW's
            state and update sharded over the replicas) or ``"zero2"`` (FSDP2 keeping the
            gathered parameters from forward to backward:
            :attr:`flopscope.distributed.Layout.keep_gathered`; :data:`DATA_PARALLEL`).
        ep: expert-parallel degree (a mixture of experts' experts over ``ep`` ranks;
            :mod:`flopscope.plan.experts`).
        sequence_parallel: the norms' activations sharded along the sequence over the
            tensor-parallel ranks (tensor parallelism without stages only;
            :attr:`flopscope.distributed.Layout.sequence_parallel`).
    """

    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    checkpoint: str
    data_parallel: str = "fsdp"
    ep: int = 1
    sequence_parallel: bool = False

    @property
    def gpus(self) -> int:
        """Devices the layout uses."""
        return self.tp * self.pp * self.dp

    @property
    def replicas(self) -> bool:
        """The data-parallel ranks hold whole parameters and all-reduce their gradients (DDP,
        with or without ZeRO-1)."""
        return self.data_parallel in ("ddp", "zero1") and self.dp > 1

    @property
    def keeps_gathered(self) -> bool:
        """FSDP2 keeps each layer's gathered parameters from its forward to its backward
        (``zero2``)."""
        return self.data_parallel == "zero2" and self.dp > 1

    @property
    def optimizer_shards(self) -> int:
        """Over how many ranks AdamW's state and update are split beyond the parameters' own
        sharding: the data-parallel degree with ZeRO-1, else 1."""
        return self.dp if self.data_parallel == "zero1" else 1

    def optimizer_share(self, amount: int) -> int:
        """A rank's share of ``amount`` (bytes, elements) of AdamW's state or update:
        ``amount / optimizer_shards``, rounded up."""
        return -(-amount // self.optimizer_shards)

    @property
    def label(self) -> str:
        """A short name: ``TP2 PP1 DP4 mb2x4 ckpt`` (``DDP4``: data parallel by DDP, ``DDP4
        Z1`` with ZeRO-1, ``DP4 Z2`` FSDP2 keeping gathered parameters; ``EP4``: experts over
        4 ranks; ``SP``: sequence parallelism,
        ``TP2 PP1 DP4 SP mb2x4``)."""
        dp = _DP_LABEL[self.data_parallel].format(self.dp)
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        sp = " SP" if self.sequence_parallel else ""
        return (f"TP{self.tp} PP{self.pp} {dp}{ep}{sp} "
                f"mb{self.micro_batch}x{self.microbatches}"
                + LABEL_SUFFIX[self.checkpoint])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch": self.micro_batch,
                "microbatches": self.microbatches, "checkpoint": self.checkpoint,
                "data_parallel": self.data_parallel, "ep": self.ep,
                "sequence_parallel": self.sequence_parallel}


def sequence_parallel_mode(value: bool | str) -> str:
    """A plan's ``sequence_parallel`` argument as one of :data:`SEQUENCE_PARALLEL`.

    Args:
        value: ``False`` / ``"off"``, ``True`` / ``"on"``, or ``"search"``.

    Returns:
        ``"off"``, ``"on"`` or ``"search"``.

    Raises:
        UsageError: anything else.
    """
    if value is True or value is False:
        return "on" if value else "off"
    if value not in SEQUENCE_PARALLEL:
        raise UsageError(f"sequence_parallel must be True, False or one of "
                         f"{', '.join(map(repr, SEQUENCE_PARALLEL))}, got {value!r}")
    return str(value)


def data_parallel_kinds(value: str | None, decoder: bool = True) -> tuple[str, ...]:
    """A plan's ``data_parallel`` argument as the kinds its layouts try.

    Args:
        value: one of :data:`DATA_PARALLEL`, ``"search"`` (every one) or ``None``: the
            model's default, FSDP2 for a decoder (as before DDP was built for decoders; its
            layouts need no simulation more) and FSDP2 and DDP for a vision model.
        decoder: the model is planned as a decoder.

    Returns:
        Kinds of :data:`DATA_PARALLEL`.

    Raises:
        UsageError: anything else.
    """
    if value is None:
        return ("fsdp",) if decoder else ("fsdp", "ddp")
    if value == "search":
        return DATA_PARALLEL
    if value not in DATA_PARALLEL:
        raise UsageError(f"data_parallel must be one of {', '.join(map(repr, DATA_PARALLEL))} "
                         f"or 'search' (every one), got {value!r}")
    return (value,)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(
    gpus: int,
    shape: ModelShape,
    global_batch: int,
    checkpointing: Sequence[str] = CHECKPOINTING,
    sequence_parallel: str = "off",
    data_parallel: Sequence[str] = ("fsdp",),
) -> list[Choice]:
    """Every layout of ``gpus`` devices for a model of ``shape`` and a step of ``global_batch``
    sequences.

    The rules: ``tp x pp x dp = gpus``; ``tp`` divides the attention heads, the key/value heads
    and the MLP size (each rank holds whole heads and an equal share of the MLP); ``pp`` is at
    most the number of layers; ``dp`` divides the global batch; the micro-batch divides each
    data-parallel rank's ``global_batch / dp`` sequences, the rest being microbatches; with
    pipeline stages at least ``pp`` microbatches (torch's 1F1B schedule needs them); sequence
    parallelism on tensor-parallel layouts without stages, as ``sequence_parallel`` says
    (``"search"``: each such layout without it, then with it); a layout with data
    parallelism in each of the ``data_parallel`` kinds (:data:`DATA_PARALLEL`; one without
    has none to choose: ``fsdp``, as it is built).

    Args:
        gpus: devices.
        shape: the model's shape.
        global_batch: sequences per step.
        checkpointing: the checkpointing choices to try (:data:`CHECKPOINTING`).
        sequence_parallel: one of :data:`SEQUENCE_PARALLEL`.
        data_parallel: the data-parallel kinds to try (``fsdp``, ``ddp``).

    Returns:
        The layouts, by tp, pp, micro-batch, checkpointing (sequence parallelism, and the
        data-parallel kind).

    Raises:
        UsageError: a bad checkpointing choice.
    """
    bad = [c for c in checkpointing if c not in KNOWN]
    if bad:
        raise UsageError(f"unknown checkpointing {bad[0]!r}; use one of {', '.join(KNOWN)}")
    out: list[Choice] = []
    for tp in divisors(gpus):
        if shape.heads % tp or shape.kv_heads % tp or shape.intermediate % tp:
            continue
        for pp in divisors(gpus // tp):
            if pp > shape.layers:
                continue
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            per_rank = global_batch // dp
            for micro in divisors(per_rank):
                count = per_rank // micro
                if pp > 1 and count < pp:
                    continue
                sp = ((False,) if tp == 1 or pp > 1 or sequence_parallel == "off"
                      else (True,) if sequence_parallel == "on" else (False, True))
                kinds = data_parallel if dp > 1 else ("fsdp",)
                out += [Choice(tp, pp, dp, micro, count, c, k, sequence_parallel=s)
                        for c in checkpointing for s in sp for k in kinds]
    return out


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """A memory size: ``80GiB``, ``80 GB``, ``1.5TiB``, ``85899345920``.

    Args:
        text: the size.

    Returns:
        Bytes.

    Raises:
        UsageError: not a size.
    """
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS or float(found.group(1)) <= 0:
        raise UsageError(f"{text!r} is not a memory size: write e.g. 80GiB, 80GB or 1.5TiB")
    return int(float(found.group(1)) * _UNITS[unit])
