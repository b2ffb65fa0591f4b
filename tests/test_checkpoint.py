"""Activation checkpointing (torch.utils.checkpoint): recomputed forward work is counted, charged to
the recomputed modules, in the recompute phase; forward and backward equal the run without
checkpointing, module by module (issue 13)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from flopscope import Counter, Phase, Report, count


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


class Net(nn.Module):
    """x[4,8] -> pre -> blk (checkpointed or not) -> head[2]."""

    def __init__(self, reentrant: bool | None, first: bool = False) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.blk = Block()
        self.head = nn.Linear(8, 2)
        self.reentrant = reentrant
        self.first = first  # the block takes the model's input directly

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.first else self.pre(x)
        if self.reentrant is None:
            h = self.blk(h)
        else:
            h = checkpoint(self.blk, h, use_reentrant=self.reentrant)
        return self.head(h)


def _net(reentrant: bool | None, first: bool = False) -> Net:
    torch.manual_seed(0)
    return Net(reentrant, first)


def _by(r: Report, phase: Phase) -> dict[str, int]:
    return {p: s.self_cost.flops for p, s in r.by_module(phase).items() if s.self_cost.flops}


@contextmanager
def _full_recompute() -> Iterator[None]:
    with set_checkpoint_early_stop(False):
        yield


X = torch.randn(4, 8)
# forward MACs: pre 4*8*8 = 256, blk.a 256, blk.b 256, head 4*8*2 = 64
# backward MACs: head 64 (grad_input) + 64 (grad_weight), blk.b 256 + 256, blk.a 256 + 256,
# pre 256 (grad_weight only: the input needs no grad)
FWD_MACS = 256 + 256 + 256 + 64
BWD_MACS = 128 + 512 + 512 + 256


@pytest.mark.parametrize("shape_only", [False, True])
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_model_flops_equal_the_plain_model_per_module(
    reentrant: bool, shape_only: bool
) -> None:
    plain = count(_net(None), X, backward=True, shape_only=shape_only)
    assert plain.total(Phase.FORWARD).macs == FWD_MACS
    assert plain.total(Phase.BACKWARD).macs == BWD_MACS
    with _full_recompute():
        ck = count(_net(reentrant), X, backward=True, shape_only=shape_only)
    assert _by(ck, Phase.FORWARD) == _by(plain, Phase.FORWARD)
    assert _by(ck, Phase.BACKWARD) == _by(plain, Phase.BACKWARD)
    # exactly the block's forward again, on the block's modules (blk itself: the relu, 4*8)
    fwd = _by(plain, Phase.FORWARD)
    assert _by(ck, Phase.RECOMPUTE) == {p: f for p, f in fwd.items() if p.startswith("blk")}
    assert _by(ck, Phase.RECOMPUTE)["blk"] == 4 * 8
    assert ck.total(Phase.RECOMPUTE).macs == 256 + 256  # blk.a + blk.b
    assert ck.model_flops == plain.flops
    assert ck.hardware_flops == plain.flops + ck.total(Phase.RECOMPUTE).flops
    assert ck.by_module()["blk.a"].calls == 2  # the forward and its recomputation


def test_non_reentrant_early_stop_recomputes_only_what_backward_needs() -> None:
    plain = count(_net(None), X, backward=True)
    ck = count(_net(False), X, backward=True)  # early stop is PyTorch's default
    assert _by(ck, Phase.FORWARD) == _by(plain, Phase.FORWARD)
    assert _by(ck, Phase.BACKWARD) == _by(plain, Phase.BACKWARD)
    # b's saved tensors (its input, relu(a(x))) are recomputed once relu has run: b is not rerun
    rec = _by(ck, Phase.RECOMPUTE)
    assert set(rec) == {"blk.a", "blk"}  # blk: the relu between a and b
    assert rec["blk.a"] == _by(plain, Phase.FORWARD)["blk.a"]
    assert rec["blk"] == 4 * 8  # relu: 1 per element


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad=True:UserWarning")
def test_reentrant_block_at_the_input_has_a_backward() -> None:
    # the block takes x itself; count() makes x take part in autograd (an alias), so the
    # reentrant block's parameters get their backward: 64 MACs before the fix
    plain = count(_net(None, first=True), X, backward=True)
    ck = count(_net(True, first=True), X, backward=True)
    b_plain, b_ck = plain.by_module(Phase.BACKWARD), ck.by_module(Phase.BACKWARD)
    assert b_ck["blk.b"].self_cost == b_plain["blk.b"].self_cost  # 256 + 256 MACs
    assert b_plain["blk.a"].self_cost.macs == 256  # grad_weight only
    # reentrant checkpointing also computes the gradient of the block's input: 4*8*8 more
    assert b_ck["blk.a"].self_cost.macs == 256 + 256
    assert ck.total(Phase.BACKWARD).macs == 128 + 512 + 512
    assert X.grad is None
    model = _net(True, first=True)
    count(model, X, backward=True)
    assert all(p.grad is None for p in model.parameters())  # backward() ran; .grad put back


@pytest.mark.parametrize("reentrant", [True, False])
def test_training_loop_under_a_counter_leaves_no_stale_frames(reentrant: bool) -> None:
    def step(model: Net, opt: torch.optim.Optimizer) -> None:
        loss = nn.functional.mse_loss(model(X), torch.zeros(4, 2))
        loss.backward()
        opt.step()
        opt.zero_grad()

    model = _net(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Counter(model) as one:
        step(model, opt)
    with Counter(model) as two:
        step(model, opt)
        assert two.running is None  # nothing left on the stack between steps
        step(model, opt)
    for phase in Phase:
        assert {p: f * 2 for p, f in _by(one.report, phase).items()} == _by(two.report, phase)
    # the loss (functional, outside any module) stays the root's own forward work:
    # mse: sub, square, sum over 4*2 elements = 3 per element, + 1 for the mean
    assert _by(one.report, Phase.FORWARD)[""] == 3 * 8 + 1
    assert one.report.total(Phase.RECOMPUTE).macs == (512 if reentrant else 256)


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_meta_model(reentrant: bool) -> None:
    with torch.device("meta"):
        model = Net(reentrant)
    r = count(model, X, backward=True)
    assert r.total(Phase.BACKWARD).macs == BWD_MACS
    # reentrant reruns the whole block; non-reentrant stops after a and the relu (early stop)
    assert r.total(Phase.RECOMPUTE).macs == (512 if reentrant else 256)
