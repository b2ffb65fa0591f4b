"""Query-key pairs: how many an attention kernel computes (PyTorch's CPU flash kernel, the
FlashAttention-2 forward's block skipping) and how many a mask leaves visible (causal, sliding
window). The arithmetic behind :mod:`flopscope.llm.attention`'s executed and model figures; its
module docstring says where each model comes from.
"""

from __future__ import annotations

__all__ = [
    "CPU_FLASH_KV_BLOCK",
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
