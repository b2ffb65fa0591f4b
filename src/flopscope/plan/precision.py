"""Mixed precision in a training plan: the parameters (their shards, gradients and AdamW's
moments) kept in one dtype, the computation in another, the gradients reduced in a third, as
published runs train (torchtitan: FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)`` over float32 parameters; Megatron-LM: bfloat16 with float32 main
parameters and gradients). The plan builds the model in the parameters' dtype and gives every
``fully_shard`` FSDP2's policy (:attr:`flopscope.distributed.Layout.mixed_precision`), so the
simulated rank holds float32 shards, all-gathers and computes in bfloat16 and reduce-scatters
gradients in the reduce dtype: memory, collectives and compute follow from the mechanism.
"""

from __future__ import annotations

from flopscope.errors import SourceError, UsageError

__all__ = ["mixed_precision", "precision_words"]


def mixed_precision(dtype: str, param_dtype: str | None, reduce_dtype: str | None
                    ) -> tuple[str, tuple[str, str] | None]:
    """The dtype a plan builds the model in, and FSDP2's mixed precision for its ranks.

    Args:
        dtype: the compute dtype.
        param_dtype: the parameters' (and optimizer state's) dtype, ``None``: ``dtype``.
        reduce_dtype: the gradients' reduce dtype, ``None``: ``param_dtype``.

    Returns:
        ``(the parameters' dtype name, (compute, reduce) or None)``: ``(dtype, None)`` when
        every dtype is ``dtype`` (no policy: the model runs in its dtype).

    Raises:
        UsageError: a name that is not a floating-point dtype.
    """
    from flopscope.sources import parse_dtype

    names = []
    for what, name in (("--dtype", dtype), ("--param-dtype", param_dtype or dtype),
                       ("--reduce-dtype", reduce_dtype or param_dtype or dtype)):
        try:
            names.append(str(parse_dtype(name, what=what, floating=True)).removeprefix("torch."))
        except SourceError as e:
            raise UsageError(str(e)) from None
    compute, stored, reduced = names
    if stored == compute and reduced == compute:
        return dtype, None  # as given: the role caches' key
    return stored, (compute, reduced)


def precision_words(dtype: str, param_dtype: str | None, reduce_dtype: str | None) -> str:
    """A plan's dtypes in words.

    Args:
        dtype: the compute dtype.
        param_dtype: the parameters' dtype (``None``: ``dtype``).
        reduce_dtype: the gradients' reduce dtype (``None``: ``param_dtype``).

    Returns:
        ``bfloat16``, or with mixed precision ``bfloat16 compute, float32 parameters and
        optimizer state, gradients reduced in float32``.
    """
    stored = param_dtype or dtype
    reduced = reduce_dtype or stored
    if stored == dtype and reduced == dtype:
        return dtype
    return (f"{dtype} compute, {stored} parameters and optimizer state, gradients reduced in "
            f"{reduced}")
