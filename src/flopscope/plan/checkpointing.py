"""Activation checkpointing of a plan's decoder blocks: none, every block, or selective by
operator class.

- ``block``: every decoder block's forward is run again in backward (transformers' own switch,
  non-reentrant ``torch.utils.checkpoint``); only each block's input is kept.
- ``selective``: the same switch with PyTorch's selective activation checkpointing
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): inside each block the
  outputs of the operators of :data:`SAVED_CLASSES` are kept from the forward (matrix products,
  attention kernels, the tensor-parallel all-reduces and reduce-scatters of DTensor), and
  everything else (element-wise work, norms, activations, views, and sequence parallelism's
  all-gathers, whose outputs are the tensor-parallel degree times their inputs) is run again.
  The expensive FLOPs are not repeated; the cheap, memory-heavy intermediates are (the policy
  torchtitan calls "selective op" checkpointing, less its every-other-matmul rule).
- ``selective-half``: the same, but of each block's matrix products only the first, third,
  fifth ... are kept (the even ones run again): the rule of torchtitan's "op" policy, with
  which its published Llama 3 runs were made (less memory than ``selective``, more
  recomputation).

Which operators a class holds is decided from the operator's name alone (the policy is asked
about every call inside a block, before it runs): :func:`saved_class`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from torch import nn

from flopscope.errors import UsageError

__all__ = ["CHECKPOINTING", "KNOWN", "LABEL_SUFFIX", "SAVED_CLASSES", "SELECTIVE_NOTE", "enable",
           "saved_class"]

#: the choices a plan tries unless told otherwise: none, or every decoder block recomputed
CHECKPOINTING = ("none", "block")

#: every choice a plan knows (``selective`` is tried when asked: ``--checkpointing
#: none,block,selective``)
KNOWN = ("none", "block", "selective", "selective-half")

#: a layout label's suffix per choice (``TP2 PP1 DP4 mb2x4 ckpt``)
LABEL_SUFFIX = {"none": "", "block": " ckpt", "selective": " sac", "selective-half": " sac/2"}

#: operator classes whose outputs selective checkpointing keeps, with the ATen operators (by
#: name) each holds
SAVED_CLASSES: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm", "_int_mm"),
    "attention": ("_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                  "_efficient_attention_forward"),
    "collective": ("all_reduce", "reduce_scatter_tensor", "all_to_all_single"),
}
#: the plan's note when selective checkpointing was tried
SELECTIVE_NOTE = ("sac: selective activation checkpointing (torch.utils.checkpoint's "
                  "create_selective_checkpoint_contexts): inside each decoder block the outputs "
                  "of matrix products, attention and tensor-parallel all-reduces and "
                  "reduce-scatters are kept, the rest run again in backward; sac/2: the same "
                  "with only every other matrix product kept (torchtitan's 'op' policy)")
_CLASS_OF = {(("_c10d_functional" if cls == "collective" else "aten"), name): cls
             for cls, names in SAVED_CLASSES.items() for name in names}


def saved_class(func: Any) -> str | None:
    """The :data:`SAVED_CLASSES` class of an operator, or ``None`` (recomputed).

    Collectives are the functional ones (``torch.ops._c10d_functional``: what DTensor's
    redistributions run) that reduce; an all-gather (sequence parallelism's, before each norm's
    consumer) is run again, as is whatever FSDP2 (``c10d``) runs for a recomputed block.

    Args:
        func: an ``OpOverload`` (``torch.ops.aten.mm.default``) or a report's operator name
            (``"aten.mm.default"``).

    Returns:
        The class name, or ``None``.
    """
    if isinstance(func, str):
        namespace, _, rest = func.partition(".")
        return _CLASS_OF.get((namespace, rest.partition(".")[0]))
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    namespace, _, name = schema.name.partition("::")
    return _CLASS_OF.get((namespace, name))


def _contexts(every: int) -> Any:
    """A block's contexts (``context_fn``): of its matrix products every ``every``-th is run
    again (1: none, ``selective``; 2: the second, fourth ..., ``selective-half``), the other
    :data:`SAVED_CLASSES` kept, the rest run again. Made once per checkpointed call, so the
    count of products starts at each block, in its forward and in its recomputation alike (the
    policy is asked about the same calls in the same order both times)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    products = {False: 0, True: 0}  # by ctx.is_recompute

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        cls = saved_class(func)
        if cls == "matmul" and every > 1:
            products[ctx.is_recompute] += 1
            if products[ctx.is_recompute] % every == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return (CheckpointPolicy.MUST_SAVE if cls is not None
                else CheckpointPolicy.PREFER_RECOMPUTE)

    return create_selective_checkpoint_contexts(policy)


def enable(model: nn.Module, how: str, source: str) -> None:
    """Checkpoint ``model``'s decoder blocks as ``how`` says, through transformers' own switch
    (``activation_checkpointing_enable`` or ``gradient_checkpointing_enable``), non-reentrant.

    Args:
        model: a transformers model.
        how: one of :data:`KNOWN`.
        source: the SOURCE string, for the error.

    Raises:
        UsageError: an unknown choice, or a model without the switch.
    """
    if how not in KNOWN:
        raise UsageError(f"unknown checkpointing {how!r}; use one of {', '.join(KNOWN)}")
    if how == "none":
        return
    switch = (getattr(model, "activation_checkpointing_enable", None)
              or getattr(model, "gradient_checkpointing_enable", None))
    if switch is None:
        raise UsageError(f"{source}: the model has no activation checkpointing switch "
                         "(transformers' activation_checkpointing_enable)")
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if how != "block":
        kwargs["context_fn"] = functools.partial(_contexts, 1 if how == "selective" else 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        switch(kwargs)
