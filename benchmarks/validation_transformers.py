"""Small transformers for the counted-vs-executed validation (``docs/validation.md``).

BERT, GPT-2 and a Llama-style decoder from small ``transformers`` configs (random weights, seed 0)
at 1,024 tokens, where attention dominates: hidden size 64, 2 heads of 32, 2 layers, vocabulary
1,000.  All run PyTorch's SDPA (``attn_implementation="sdpa"``), which on the CPU in float64 is
the flash kernel ``_scaled_dot_product_flash_attention_for_cpu``:

- ``bert``: bidirectional, no mask: the kernel computes every query-key block.
- ``gpt2_causal`` / ``llama_causal``: no padding, so ``transformers`` calls SDPA with
  ``is_causal=True`` and no mask; the kernel skips the key blocks above the diagonal (blocks of
  256 queries x 512 keys at this length: 3/4 of the dense scores are computed).
- ``gpt2_padded`` / ``llama_padded``: the same model with the last token marked as padding, so
  ``transformers`` builds an explicit causal + padding mask and the kernel computes every block
  (the model still needs only the causal half).

Each factory returns ``(model, {"input_ids": ..., "attention_mask": ...})`` in float32; the
validation casts the weights to float64.  Two vision transformers stand in for the zoo's
attention models until the 224x224 zoo sweep reaches them: ``vit_tiny`` (the fused
``nn.MultiheadAttention`` fast path) and ``swin_t_64`` (torchvision's swin_t at 64x64).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

SEQ_LEN = 1024
_SMALL: dict[str, Any] = dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=2, intermediate_size=128,
              vocab_size=1000)


def _ids(pad_last: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, _SMALL["vocab_size"], (1, SEQ_LEN), generator=g)
    mask = torch.ones(1, SEQ_LEN, dtype=torch.long)
    if pad_last:
        mask[0, -1] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _build(kind: str) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "bert":
        cfg: Any = tf.BertConfig(**_SMALL, max_position_embeddings=SEQ_LEN)
        cls: Any = tf.BertModel
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_head=2, n_layer=2, n_inner=128, vocab_size=1000,
                            bos_token_id=0, eos_token_id=0,
                            n_positions=SEQ_LEN)
        cls = tf.GPT2Model
    else:
        cfg = tf.LlamaConfig(**_SMALL, num_key_value_heads=2, max_position_embeddings=SEQ_LEN)
        cls = tf.LlamaModel
    cfg._attn_implementation = "sdpa"
    model: nn.Module = cls(cfg).eval()
    return model


def bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """BERT encoder, no padding (every block computed)."""
    return _build("bert"), _ids()


def gpt2_causal() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """GPT-2, no padding: SDPA with ``is_causal=True``."""
    return _build("gpt2"), _ids()


def gpt2_padded() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """GPT-2, last token padded: SDPA with an explicit causal + padding mask."""
    return _build("gpt2"), _ids(pad_last=True)


def llama_causal() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Llama-style decoder, no padding: SDPA with ``is_causal=True``."""
    return _build("llama"), _ids()


def llama_padded() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Llama-style decoder, last token padded: an explicit mask."""
    return _build("llama"), _ids(pad_last=True)


def vit_tiny() -> tuple[nn.Module, torch.Tensor]:
    """torchvision's VisionTransformer, small (2 layers, hidden 64, 2 heads) at 224x224: under
    ``no_grad`` in eval its ``nn.MultiheadAttention`` takes the fused fast path
    (``_native_multi_head_attention``), as vit_b_16 does."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=224, patch_size=16, num_layers=2, num_heads=2,
                              hidden_dim=64, mlp_dim=128).eval()
    return model, torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))


def swin_t_64() -> tuple[nn.Module, torch.Tensor]:
    """torchvision's swin_t at 1x3x64x64 (windowed attention written as matmul + softmax with a
    relative-position bias; feature maps padded up to whole 7x7 windows)."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.swin_t().eval(), torch.randn(
        1, 3, 64, 64, generator=torch.Generator().manual_seed(0))


MODELS = ("bert", "gpt2_causal", "gpt2_padded", "llama_causal", "llama_padded", "vit_tiny",
          "swin_t_64")
"""The factories, in table order."""

DEPTH = {"bert": 6, "gpt2_causal": 4, "gpt2_padded": 4, "llama_causal": 4, "llama_padded": 4,
         "vit_tiny": 4, "swin_t_64": 4}
"""Module depth of the per-module split: the attention modules (``encoder.layer.0.attention.self``,
``h.0.attn``, ``layers.0.self_attn``, ``encoder.layers.encoder_layer_0.self_attention``,
``features.1.0.attn``) are segments of their own.  Segments nest, so where the attention module's
projections are segments too (bert, gpt2, llama: one level deeper) the attention segment is its
own code, the scaled-dot-product-attention call; vit's fused ``nn.MultiheadAttention`` and swin's
windowed attention keep their projections."""
