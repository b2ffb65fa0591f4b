"""A 7B Llama on an H100 SXM, shape-only (meta): a decode step with a 4k KV cache is
memory-bound at about (weights + KV cache) / bandwidth; a 4k-token prefill is compute-bound."""

from __future__ import annotations

import pytest
import torch

from flopscope.estimate import roofline
from flopscope.llm.kv_cache import cache_keyword

transformers = pytest.importorskip("transformers")

CTX = 4096
BW = 3.35e12  # H100 SXM HBM3, bytes/s


@pytest.fixture(scope="module")
def llama7b() -> torch.nn.Module:
    config = transformers.LlamaConfig(attn_implementation="sdpa")  # Llama-2-7B shapes
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def test_decode_step_is_memory_bound(llama7b: torch.nn.Module) -> None:
    config = llama7b.config
    cache = transformers.DynamicCache()
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        k = torch.empty(1, heads, CTX, dim, dtype=torch.bfloat16, device="meta")
        cache.update(k, k.clone(), layer)
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    with torch.no_grad():
        _, est = roofline(llama7b, ids, use_cache=True, **{cache_keyword(llama7b): cache},
                          cache_position=torch.tensor([CTX], device="meta"), hardware="h100-sxm")
    assert est.total.bound == "memory"
    # weights read by the matrix products: every linear weight + the LM head, bf16
    # = (6,738,415,616 params - 131,072,000 embedding rows never read whole) * 2 B
    # = 13,214,687,232 B (+ the one-token activations)
    weights = (6_738_415_616 - 32_000 * 4_096) * 2
    kv = config.num_hidden_layers * 2 * CTX * heads * dim * 2  # 2,147,483,648 B
    mm, sdpa = est.by_op["aten.mm.default"], est.by_op[
        "aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert mm.bound == sdpa.bound == "memory"
    # (weights + KV) / bandwidth = 15,362,170,880 B / 3.35e12 = 4.59 ms
    assert mm.time_s + sdpa.time_s == pytest.approx((weights + kv) / BW, rel=0.01)
    # the rest is DynamicCache's torch.cat of the whole cache each step (read + write the KV)
    cat = est.by_op["aten.cat.default"]
    assert cat.bytes == pytest.approx(2 * kv, rel=0.01)
    assert est.total.time_s == pytest.approx((weights + 3 * kv) / BW, rel=0.02)  # 5.88 ms


def test_prefill_is_compute_bound(llama7b: torch.nn.Module) -> None:
    ids = torch.zeros(1, CTX, dtype=torch.long, device="meta")
    with torch.no_grad():
        _, est = roofline(llama7b, ids, hardware="h100-sxm")
    assert est.total.bound == "compute"
    mm = est.by_op["aten.mm.default"]
    # 2 * 4096 tokens * 6.6e9 matrix parameters = 54.1 TFLOP at 989.5 TFLOP/s = 54.7 ms
    assert mm.bound == "compute"
    assert mm.time_s == pytest.approx(2 * CTX * (6_738_415_616 - 32_000 * 4_096) / 989.5e12,
                                      rel=0.01)
