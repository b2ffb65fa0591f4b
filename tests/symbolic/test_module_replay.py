"""Whole repeated modules replayed in a symbolic count (flopscope.core.replay): the report is
the one a count that runs every layer makes, record by record, and the model is left as it was."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
from torch import nn

import flopscope
import flopscope.core.replay as module_replay
from flopscope.symbolic import count_symbolic

SYMBOLS = {"batch": (0, 0), "seq_len": (0, 1)}


class Block(nn.Module):
    def __init__(self, d: int, index: int, odd_doubles: bool = False) -> None:
        super().__init__()
        self.layer_idx = index  # names the layer (as transformers' layers do): not structure
        self.odd_doubles = odd_doubles
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.up(x).view(b, t, 2, d).sum(2)  # sizes computed from symbolic sizes
        if self.odd_doubles and self.layer_idx % 2:  # work that depends on the index at run time
            h = h * 2
        return x + self.down(torch.cat([h, h], -1))


class Stack(nn.Module):
    def __init__(self, n: int = 6, d: int = 8, **block: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d, i, **block) for i in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[module_replay.ModuleReplay]:
    """The ModuleReplay objects of the counts in a test."""
    made: list[module_replay.ModuleReplay] = []
    install = module_replay.ModuleReplay.install

    def spy(self: module_replay.ModuleReplay) -> None:
        made.append(self)
        install(self)

    monkeypatch.setattr(module_replay.ModuleReplay, "install", spy)
    return made


def _records(rep: Any) -> dict[tuple[str, str, str], tuple[int, tuple[Any, ...]]]:
    return {(r.module, r.op, r.phase.value): (r.calls, tuple(
        sympy.expand(v) for v in (r.cost.macs, r.cost.flops, r.cost.bytes_read, r.cost.bytes_written)))
        for r in rep.records}


def test_repeated_layers_are_replayed_and_the_report_is_unchanged(
        replays: list[module_replay.ModuleReplay], monkeypatch: pytest.MonkeyPatch) -> None:
    model = Stack().eval()
    x = torch.randn(2, 5, 8)
    rep = count_symbolic(model, x, symbolic=SYMBOLS)
    # six layers of one structure: layer 0 runs on the model's input, layers 1-5 on an output
    # that requires grad (another key); layers 0 and 1 run and do the same, layers 2-5 are made
    # from memory
    assert [r.replayed for r in replays] == [4]
    monkeypatch.setattr(module_replay, "candidates", lambda model, shared: {})
    every_layer = count_symbolic(model, x, symbolic=SYMBOLS)
    assert _records(rep) == _records(every_layer)
    assert rep.report.modules == every_layer.report.modules  # module call counts included
    # per layer: up 8x16 and down 16x8 = 256 MACs per token; the head 8x3 = 24
    b, t = rep.symbols["batch"], rep.symbols["seq_len"]
    assert sympy.expand(rep.total().macs - (6 * 256 + 24) * b * t) == 0
    for batch, seq in [(2, 2), (3, 17)]:
        concrete = flopscope.count(model, torch.randn(batch, seq, 8))
        assert rep.evaluate(batch=batch, seq_len=seq).total() == concrete.total()
        assert {p: s.inclusive for p, s in rep.evaluate(batch=batch, seq_len=seq).by_module().items()} \
            == {p: s.inclusive for p, s in concrete.by_module().items()}
    for layer in model.layers:  # the wrappers are gone
        assert "forward" not in layer.__dict__


def test_layers_that_differ_at_run_time_are_not_replayed(
        replays: list[module_replay.ModuleReplay]) -> None:
    model = Stack(odd_doubles=True).eval()
    rep = count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    # layers 0 and 1 did different work (on different keys: no verdict), 1 and 2 too (one key)
    assert [r.replayed for r in replays] == [0]
    concrete = flopscope.count(model, torch.randn(2, 9, 8))
    evaluated = rep.evaluate(batch=2, seq_len=9)
    assert evaluated.total() == concrete.total()
    # the three odd layers' doubling: 2 * 9 * 8 elements each
    assert evaluated.by_op()["aten.mul.Tensor"].cost.flops == 3 * 2 * 9 * 8


def test_layers_of_different_structure_are_grouped_apart(
        replays: list[module_replay.ModuleReplay]) -> None:
    model = Stack(n=8).eval()
    for i, layer in enumerate(model.layers):
        layer.sliding = i % 2 == 0  # set at construction, as transformers does for sliding windows
    groups = module_replay.candidates(model, set())
    assert len(set(groups.values())) == 2 and len(groups) == 8
    rep = count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    # even layers: 0 (the model's input) and 2 run, 4 and 6 replayed; odd: 1 and 3 run, 5 and 7
    assert [r.replayed for r in replays] == [4]
    concrete = flopscope.count(model, torch.randn(2, 6, 8))
    assert rep.evaluate(batch=2, seq_len=6).total() == concrete.total()


def test_hooks_and_instance_forwards(replays: list[module_replay.ModuleReplay]) -> None:
    model = Stack().eval()
    seen: list[int] = []
    handle = model.layers[3].down.register_forward_hook(lambda m, a, o: seen.append(1))
    assert model.layers[3] not in module_replay.candidates(model, set())  # a hook inside
    count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    assert seen == [1]  # the hooked layer ran
    handle.remove()
    own = model.layers[2].forward
    model.layers[2].forward = own  # an instance attribute of the user's (as accelerate sets)
    count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    assert model.layers[2].__dict__["forward"] is own
    assert all("forward" not in layer.__dict__ for i, layer in enumerate(model.layers) if i != 2)


def test_model_is_left_as_it_was_when_the_forward_raises() -> None:
    class Failing(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            super().forward(x)
            raise RuntimeError("after the layers")

    model = Failing().eval()
    with pytest.raises(flopscope.ForwardError, match="after the layers"):
        count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    assert all("forward" not in layer.__dict__ for layer in model.layers)


def test_concrete_and_backward_counts_run_every_layer(
        replays: list[module_replay.ModuleReplay]) -> None:
    model = Stack()
    flopscope.count(model, torch.randn(2, 5, 8))
    assert replays == []  # only symbolic counts replay modules
    rep = count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS, backward=True)
    assert replays == []  # with backward the autograd graph must be built
    concrete = flopscope.count(model, torch.randn(2, 7, 8), backward=True)
    assert rep.evaluate(batch=2, seq_len=7).total() == concrete.total()


def test_layers_that_change_metadata_in_place_are_not_replayed(
        replays: list[module_replay.ModuleReplay]) -> None:
    class Transposing(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x)
            x.transpose_(0, 1).transpose_(0, 1)  # the argument's metadata, changed and back
            return y

    model = Stack()
    model.layers = nn.ModuleList(Transposing(8, i) for i in range(6))
    rep = count_symbolic(model.eval(), torch.randn(2, 5, 8), symbolic=SYMBOLS)
    assert [r.replayed for r in replays] == [0]
    assert rep.evaluate(batch=2, seq_len=4).total() == \
        flopscope.count(model, torch.randn(2, 4, 8)).total()


def test_a_replayed_output_takes_in_place_operators(
        replays: list[module_replay.ModuleReplay]) -> None:
    class Acting(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu_(layer(x))  # in place on each layer's output, as mobilenet's
            return self.head(x)  # ReLU(inplace=True) after a block does

    model = Acting().eval()
    rep = count_symbolic(model, torch.randn(2, 5, 8), symbolic=SYMBOLS)
    assert [r.replayed for r in replays] == [4]
    assert rep.evaluate(batch=2, seq_len=3).total() == \
        flopscope.count(model, torch.randn(2, 3, 8)).total()


def test_an_attribute_equal_to_the_index_by_coincidence_is_compared() -> None:
    model = Stack()
    for layer in model.layers:
        layer.heads = 4  # equals layer 4's index: still compared (the same in every layer)
    groups = module_replay.candidates(model, set())
    assert len(groups) == 6 and len(set(groups.values())) == 1
    model.layers[5].heads = 2  # now it differs: layer 5 is a group of its own (not replayed)
    assert model.layers[5] not in module_replay.candidates(model, set())
