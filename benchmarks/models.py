"""The benchmark models: every torchvision classification model and three transformers.

Nothing is downloaded: torchvision models are built with ``weights=None`` (the input size comes from
the DEFAULT weights' metadata) and transformers from config objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# Models at most this heavy (published GMACs) run on real CPU tensors; heavier ones are built on the
# ``meta`` device and every tool counts them there (no arithmetic runs, same shapes).
REAL_GMACS_LIMIT = 2.0
TOKENS = 128  # sequence length of the transformer benchmarks


@dataclass
class Bench:
    """One benchmark model: how to build it and its inputs."""

    name: str
    family: str  # "torchvision" or "transformers"
    build: Callable[[torch.device], nn.Module]
    inputs: Callable[[torch.device], tuple[Any, ...]]
    published_gmacs: float | None = None  # torchvision's ``_ops`` for the DEFAULT weights
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)


def torchvision_benches(names: list[str] | None = None) -> list[Bench]:
    """Every classification model of torchvision (or those in ``names``), in name order."""
    import torchvision
    from torchvision.models import get_model, get_model_weights, list_models

    out = []
    for name in list_models(module=torchvision.models):
        if names is not None and name not in names:
            continue
        weights = get_model_weights(name).DEFAULT
        crop = int(weights.transforms().crop_size[0])
        gmacs = float(weights.meta.get("_ops", 0.0)) or None
        extra: dict[str, Any] = {}
        if name.startswith("vit_"):
            extra["image_size"] = crop  # position embeddings are sized by the weights' image size
        if name in ("googlenet", "inception_v3"):
            extra["aux_logits"] = False
            extra["init_weights"] = False

        def build(device: torch.device, name: str = name, extra: dict[str, Any] = extra) -> nn.Module:
            try:
                with device:
                    return get_model(name, weights=None, **extra).eval()
            except NotImplementedError:  # RegNet computes its widths with tensors: not on meta
                return get_model(name, weights=None, **extra).eval().to(device)

        def inputs(device: torch.device, crop: int = crop) -> tuple[Any, ...]:
            return (torch.randn(1, 3, crop, crop, device=device),)

        device = "cpu" if gmacs is None or gmacs <= REAL_GMACS_LIMIT else "meta"
        out.append(Bench(name, "torchvision", build, inputs, gmacs, device))
    return out


def _ids(vocab: int, tokens: int) -> Callable[[torch.device], tuple[Any, ...]]:
    def inputs(device: torch.device) -> tuple[Any, ...]:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (1, tokens), generator=gen)
        return (ids.to(device),)

    return inputs


def llama_config(**overrides: Any) -> Any:
    """A Llama-style decoder config (grouped-query attention, SwiGLU MLP, RoPE, RMSNorm)."""
    from transformers import LlamaConfig

    base: dict[str, Any] = dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, use_cache=False,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def transformer_benches(tokens: int = TOKENS) -> list[Bench]:
    """BERT-base, GPT-2 (124M) and a Llama-style decoder, from configs (no downloads)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    def hf(config_fn: Callable[[], Any], causal: bool) -> Callable[[torch.device], nn.Module]:
        def build(device: torch.device) -> nn.Module:
            config = config_fn()
            with device:
                cls = AutoModelForCausalLM if causal else AutoModel
                return cls.from_config(config).eval()  # type: ignore[no-any-return]

        return build

    return [
        Bench("bert-base", "transformers",
              hf(lambda: AutoConfig.for_model("bert"), causal=False), _ids(30522, tokens),
              notes=[f"BertModel, default BertConfig (bert-base-uncased shape), {tokens} tokens"]),
        Bench("gpt2", "transformers",
              hf(lambda: AutoConfig.for_model("gpt2", use_cache=False), causal=True), _ids(50257, tokens),
              notes=[f"GPT2LMHeadModel, default GPT2Config (124M), {tokens} tokens"]),
        Bench("llama-style", "transformers", hf(llama_config, causal=True), _ids(32000, tokens),
              notes=[f"LlamaForCausalLM: hidden 1024, MLP 2816, 8 layers, 16 heads, 4 KV heads, "
                     f"vocab 32000, {tokens} tokens"]),
    ]


def tiny_benches() -> list[Bench]:
    """A tiny CNN and a tiny transformer, for the unit tests and ``--quick``."""

    def cnn(device: torch.device) -> nn.Module:
        with device:
            return nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
            ).eval()

    def llama(device: torch.device) -> nn.Module:
        from transformers import AutoModelForCausalLM

        config = llama_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
        with device:
            return AutoModelForCausalLM.from_config(config).eval()  # type: ignore[no-any-return]

    return [
        Bench("tiny-cnn", "tiny", cnn, lambda d: (torch.randn(1, 3, 16, 16, device=d),)),
        Bench("tiny-llama", "tiny", llama, _ids(256, 16)),
    ]
