"""A training plan's plan-wide options in words: what the plan's notes say of a decoder's
data parallelism, optimizer, precision, loss, sequence and loss parallelism, and what each
layout had applied (:func:`applied`)."""

from __future__ import annotations

from collections.abc import Sequence

from flopscope.plan.roles import RoleKey

__all__ = ["applied", "decoder_note"]


def decoder_note(stored: str, mixed: tuple[str, str] | None, sequence_parallel: str,
                 loss_parallel: bool, sequence_applies: bool = True,
                 data_parallel: tuple[str, ...] = ("fsdp",)) -> str:
    """The plan's note on a decoder's training step.

    Args:
        stored: the parameters' dtype.
        mixed: ``(compute, reduce)`` dtypes of FSDP2's mixed precision, or ``None``.
        sequence_parallel: sequence parallelism asked for: ``"off"``, ``"on"`` or
            ``"search"`` (:data:`flopscope.plan.space.SEQUENCE_PARALLEL`).
        loss_parallel: loss parallelism asked for.
        sequence_applies: some layout of the plan is tensor-parallel without stages (where
            sequence parallelism applies).
        data_parallel: the data-parallel kinds tried (``fsdp``, ``ddp``).

    Returns:
        One line.
    """
    kinds = {"fsdp": "FSDP2 (fully_shard per decoder layer and the root)",
             "ddp": ("DDP (DDP in the label: whole replicas, each decoder layer's gradients "
                     "all-reduced in backward, once a step over its microbatches; built as "
                     "FSDP2's hybrid sharding with shards of one)"),
             "zero1": ("ZeRO-1 (Z1 in the label: DDP with AdamW's moments and update split "
                       "over the replicas, gradients reduce-scattered in the last backward and "
                       "the parameters gathered beside the next forward, as Megatron-LM's "
                       "distributed optimizer; the parameters and gradients whole)"),
             "zero2": ("FSDP2 keeping gathered parameters (Z2 in the label: each layer's "
                       "all-gathered in forward and kept through its backward, "
                       "reshard_after_forward=False; no all-gather in backward)")}
    words = [f"data parallelism is {' or '.join(kinds[k] for k in data_parallel)}; "
             "optimizer AdamW (two moments per parameter, in the parameters' dtype); loss: "
             "cross-entropy on the logits upcast to float32 (transformers' ForCausalLMLoss)"]
    if mixed is not None:
        words.append(f"mixed precision: {stored} parameters gathered as {mixed[0]} (FSDP2's "
                     f"MixedPrecisionPolicy, on a group of one too), gradients reduced in "
                     f"{mixed[1]}")
    if sequence_parallel != "off" and not sequence_applies:
        words.append("sequence parallelism asked for, but no layout here is tensor-parallel "
                     "without pipeline stages, where it applies")
    elif sequence_parallel == "on":
        words.append("sequence parallelism on tensor-parallel layouts without stages")
    elif sequence_parallel == "search":
        words.append("sequence parallelism searched: each tensor-parallel layout without "
                     "stages planned with it (SP in its label) and without")
    if loss_parallel:
        words.append("loss parallelism on tensor-parallel layouts (the head column-wise over "
                     "the vocabulary, the loss on the shards; with stages, on the last)")
    return "; ".join(words)


def applied(keys: Sequence[RoleKey]) -> tuple[str, ...]:
    """Which plan-wide parallelisms a layout's roles ran with: sequence parallelism applies to
    tensor-parallel layouts without pipeline stages, loss parallelism to tensor-parallel ones
    on the stage with the head (:func:`flopscope.plan.layout_roles.roles_of`).

    Args:
        keys: the layout's roles.

    Returns:
        ``("sequence", "loss")``, either, or neither.
    """
    return tuple(name for name, on in (("sequence", any(k.sequence_parallel for k in keys)),
                                       ("loss", any(k.loss_parallel for k in keys))) if on)
