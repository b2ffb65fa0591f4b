"""Transformers models for the GPU check (``benchmarks/gpu_check.py``, ``benchmarks/gpu_predict.py``):
built from their configs (no weights), each returning one tensor so that a backward is one sum."""

from __future__ import annotations

import gc

import torch
from torch import nn


class Hidden(nn.Module):
    """A transformers model returning one tensor (its ``attr`` output), so a backward is one sum."""

    def __init__(self, model: nn.Module, attr: str) -> None:
        super().__init__()
        self.model, self.attr = model, attr

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(ids), self.attr)


def hf_model(kind: str, dry: bool, device: str) -> tuple[nn.Module, torch.Tensor]:
    """BERT-base, GPT-2 small or a Llama-style model from its config (no weights), and its ids.

    ``kind``: ``bert``, ``gpt2`` (with its LM head), ``llama_layer`` (one decoder layer of a
    2B-shaped Llama with grouped-query attention) or ``llama`` (4 layers, its LM head)."""
    import transformers as tf

    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_hidden_layers": 1, "vocab_size": 256}
    seq = 16 if dry else 512
    if kind == "bert":
        cfg = tf.BertConfig(**tiny) if dry else tf.BertConfig()
        model, attr, seq = tf.BertModel(cfg), "last_hidden_state", 16 if dry else 128
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=256) if dry else tf.GPT2Config()
        model, attr = tf.GPT2LMHeadModel(cfg), "logits"
    else:
        shape = tiny if dry else {"hidden_size": 2048, "intermediate_size": 5632,
                                  "num_attention_heads": 16, "num_key_value_heads": 4,
                                  "num_hidden_layers": 1 if kind == "llama_layer" else 4,
                                  "vocab_size": 32000}
        cfg = tf.LlamaConfig(**shape)
        model = tf.LlamaModel(cfg) if kind == "llama_layer" else tf.LlamaForCausalLM(cfg)
        attr = "last_hidden_state" if kind == "llama_layer" else "logits"
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    return Hidden(model, attr).to(device).eval(), ids


def free() -> None:
    """Collect garbage and empty CUDA's cache between workloads. Without CUDA (the dry mode)
    nothing: the dry shapes are small, and a full collection in a process holding the test
    suite's objects took 0.3-0.5 s each, 44 of them in one dry run."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
