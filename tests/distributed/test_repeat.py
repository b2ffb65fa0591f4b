"""simulate() from three small layer counts (flopscope.distributed.repeat): the same report as
counting every layer, record for record, or every layer counted where the layers differ."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from flopscope.cost import Phase
from flopscope.distributed import Layout, simulate
from flopscope.distributed.repeat import alike

# 14 layers (more than the 3 + 4 + 5 of the small runs), hidden 64, 4 heads of 16, 2 KV heads
CONFIG: dict[str, Any] = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=14, num_attention_heads=4, num_key_value_heads=2)


class Builds:
    """A build function that keeps what it built (to see whether the fast path cut it)."""

    def __init__(self, checkpoint: bool = False) -> None:
        self.models: list[nn.Module] = []
        self.checkpoint = checkpoint

    def __call__(self) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        from transformers import LlamaConfig, LlamaForCausalLM

        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**CONFIG))
        if self.checkpoint:
            model.activation_checkpointing_enable({"use_reentrant": False})
        model.train()
        self.models.append(model)
        return model, (), {"input_ids": torch.zeros(2, 32, dtype=torch.long, device="meta")}


def _sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


@pytest.mark.parametrize(("layout", "backward", "logical", "checkpoint"), [
    (Layout(8, tp=2, fsdp=4), True, True, False),
    (Layout(4, fsdp=4), True, False, True),
    (Layout(8, tp=2, fsdp=4, sequence_parallel=True), True, True, False),
    (Layout(2, tp=2), False, True, False),
])
def test_small_layer_counts_give_the_whole_report(layout: Layout, backward: bool, logical: bool,
                                                  checkpoint: bool) -> None:
    fast_builds, slow_builds = Builds(checkpoint), Builds(checkpoint)
    fast = simulate(fast_builds, layout, backward=backward, logical=logical, warn=False)
    slow = simulate(slow_builds, layout, backward=backward, logical=logical, warn=False,
                    repeat_layers=False)
    # the fast path built the model once and counted copies of it cut to 3, 4 and 5 layers:
    # the model built is left as it was (not sharded, 14 layers); counting every layer shards
    # the model it builds for the rank
    assert len(fast_builds.models) == 1 and not _sharded(fast_builds.models[0])
    assert len(fast_builds.models[0].model.layers) == 14
    assert fast_builds.models[0].config.num_hidden_layers == 14
    assert _sharded(slow_builds.models[0])
    assert fast == slow  # every record, collective, module and parameter entry, in order
    assert any(r.module == "model.layers.13.mlp.down_proj" for r in fast.records)
    if layout.dp > 1:
        # FSDP2 gathers the root's parameters and each of the 14 layers' once in forward
        gathers = [c for c in fast.communication if c.kind == "all_gather"
                   and c.phase is Phase.FORWARD and c.group_size == layout.dp]
        assert sum(c.calls for c in gathers) == 1 + 14


class _Layer(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        return x * 2 if self.index % 2 else x  # odd layers do one more operation


class _Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(i) for i in range(n))
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _stack() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    with torch.device("meta"):
        return _Stack(14), (torch.zeros(4, 16, device="meta"),), {}


def test_layers_alike_in_structure_but_not_in_work_are_counted_whole() -> None:
    # the layers look alike (``index`` holds each layer's own index, so it is not compared),
    # but odd layers multiply: the small runs' middle layers differ, every layer is counted
    assert alike(list(_stack()[0].layers))
    fast = simulate(_stack, Layout(2, fsdp=2), backward=True, warn=False)
    slow = simulate(_stack, Layout(2, fsdp=2), backward=True, warn=False, repeat_layers=False)
    assert fast == slow
    muls = {r.module for r in fast.records
            if r.op == "aten.mul.Tensor" and r.phase is Phase.FORWARD}
    assert muls == {f"layers.{i}" for i in range(1, 14, 2)}


def test_layers_that_differ_in_shape_are_not_alike() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    layers = list(model.model.layers)
    assert alike(layers)
    layers[7].mlp.up_proj = nn.Linear(64, 96, bias=False, device="meta")
    assert not alike(layers)
    layers[7].mlp.up_proj = nn.Linear(64, 128, bias=False, device="meta")
    layers[7].self_attn.scaling = 0.5  # a plain attribute no other layer has this value of
    assert not alike(layers)
