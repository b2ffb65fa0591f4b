"""Shared builders for the distributed tests."""

from __future__ import annotations

from typing import Any

import torch

# hidden 256, 8 heads of 32, 4 KV heads, intermediate 512, 2 layers, vocab 512
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4)
BATCH, SEQ = 2, 64


def tiny_llama(device: str = "meta") -> Any:
    """(model, args, kwargs) of a tiny transformers Llama and a 2 x 64 batch of token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device=device)
    return model, (), {"input_ids": ids}
