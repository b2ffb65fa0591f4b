"""Shared modules per call path, pytree outputs for backward, shape-only data-dependent code, lazy
forwards and TorchScript modules: loud or right, never a silent zero (issue 13)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import flopscope
from flopscope import Counter, ForwardError, Phase, UsageError, count


# -- shared modules ---------------------------------------------------------------------------------
class Parent(nn.Module):
    def __init__(self, sub: nn.Module) -> None:
        super().__init__()
        self.submod = sub

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.submod(x)


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear(10, 10, bias=False)
        self.submod1 = Parent(lin)
        self.submod2 = Parent(lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.submod2(self.submod1(x))


def test_shared_module_is_charged_to_the_path_it_was_called_through() -> None:
    r = count(Shared(), torch.randn(1, 10))
    by = r.by_module()
    # each call: 1 x 10 x 10 = 100 MACs, under the parent that made it (fvcore, FlopCounterMode)
    assert by["submod1.submod"].inclusive.macs == 100 and by["submod1.submod"].calls == 1
    assert by["submod2.submod"].inclusive.macs == 100 and by["submod2.submod"].calls == 1
    assert by["submod1"].inclusive.macs == by["submod2"].inclusive.macs == 100
    assert r.macs == 200
    assert r.params == 100  # the shared weight once


def test_shared_module_backward_follows_the_call_path() -> None:
    r = count(Shared(), torch.randn(1, 10), backward=True)
    bwd = r.by_module(Phase.BACKWARD)
    # submod2's call: grad_input 100 + grad_weight 100; submod1's: grad_weight only (x needs none)
    assert bwd["submod2.submod"].self_cost.macs == 200
    assert bwd["submod1.submod"].self_cost.macs == 100


def test_module_rule_by_second_path_of_a_shared_module() -> None:
    r = count(Shared(), torch.randn(1, 10), rules={"submod2.submod": lambda m, i, o: 7})
    assert r.by_module()["submod2.submod"].inclusive.macs == 7
    assert r.by_module()["submod1.submod"].inclusive.macs == 100


# -- backward through pytrees -----------------------------------------------------------------------
@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    extra: dict[str, torch.Tensor]
    n: int = 0


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class DataclassNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.aux = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> Out:
        return Out(self.fc(x), {"aux": self.aux(x)})


class NamedTupleNet(DataclassNet):
    def forward(self, x: torch.Tensor) -> Pair:  # type: ignore[override]
        return Pair(self.fc(x), self.aux(x))


@pytest.mark.parametrize("net", [DataclassNet, NamedTupleNet])
def test_backward_finds_tensors_in_dataclasses_and_named_tuples(net: type[nn.Module]) -> None:
    r = count(net(), torch.randn(2, 4), backward=True)
    bwd = r.by_module(Phase.BACKWARD)
    # grad_weight only (x needs no grad): fc 3*4*2 = 24 MACs, aux 2*4*2 = 16 MACs
    assert bwd["fc"].self_cost.macs == 24
    assert bwd["aux"].self_cost.macs == 16


# -- shape-only counting of data-dependent code -------------------------------------------------------
class NonZero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.nonzero()


def test_shape_only_nonzero_names_the_operator() -> None:
    with pytest.raises(ForwardError, match=r"shape-only counting cannot run operator "
                       r"aten\.nonzero\.default in module '' \(NonZero\).*Count with real tensors"):
        count(NonZero(), torch.randn(3), shape_only=True)
    assert count(NonZero(), torch.randn(3)).flops == 0  # a real count works


def test_shape_only_packed_lstm_counts_like_the_real_run() -> None:
    lstm = nn.LSTM(4, 5)
    seq = pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    # 5 time steps in all (3 + 2); each: input 4x20 + hidden 5x20 = 180 MACs; the batch sizes
    # are in the PackedSequence, so a shape-only count knows them
    assert count(lstm, seq).macs == count(lstm, seq, shape_only=True).macs == 5 * (4 * 20 + 5 * 20)


# -- lazy forwards ----------------------------------------------------------------------------------
class Lazy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
        yield self.l(x)


class LazyInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = Lazy()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.gen(x))


def test_count_refuses_a_forward_that_returns_a_generator() -> None:
    with pytest.raises(UsageError, match=r"Lazy\.forward returned a generator, so its work has not "
                       r"run yet.*list\(model\(x\)\)"):
        count(Lazy(), torch.randn(1, 2))


def test_counter_warns_about_a_module_that_returns_a_generator() -> None:
    model = LazyInside()
    with pytest.warns(flopscope.FlopscopeWarning, match=r"returned a lazy object.*'gen' \(generator\)"):
        with Counter(model) as c:
            model(torch.randn(1, 2))
    # the work runs when list() consumes it, inside the parent: 1*2*2 = 4 MACs, on the root
    assert c.report.macs == 4


# -- TorchScript --------------------------------------------------------------------------------------
@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..* is deprecated:FutureWarning")
@pytest.mark.parametrize("how", ["script", "trace"])
def test_scripted_modules_are_reported_as_unattributed(how: str) -> None:
    eager = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(1, 4)
    model = torch.jit.script(eager) if how == "script" else torch.jit.trace(eager, x)
    with pytest.warns(flopscope.FlopscopeWarning, match=r"TorchScript modules .*submodules show no "
                      r"calls: '' \(the model\)\. Count the eager"):
        r = count(model, x)
    assert r.macs == 16  # 1*4*4: the total is right, charged to the scripted module itself
    assert r.by_module()["0"].calls == 0


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\..* is deprecated:FutureWarning")
def test_scripted_submodule_of_an_eager_model_is_named() -> None:
    class Host(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
            self.head = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(x))

    with pytest.warns(flopscope.FlopscopeWarning, match=r"submodules show no calls: 'enc'\."):
        r = count(Host(), torch.randn(1, 4))
    by = r.by_module()
    assert by["enc"].inclusive.macs == 16  # 1*4*4, charged to the scripted module
    assert by["enc.0"].calls == 0
    assert by["head"].self_cost.macs == 8
