"""Counting per thread: module hooks are process-global, so every Counter must ignore the modules
that run in threads it does not count (issue 13)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import flopscope
from flopscope import Counter, count


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(8, width)
        self.down = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x).relu())


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean((2, 3)))


def _modules(r: flopscope.Report) -> dict[str, tuple[int, flopscope.Cost]]:
    return {p: (s.calls, s.self_cost) for p, s in r.by_module().items()}


def test_two_threads_counting_different_models_never_mix() -> None:
    mlp, conv = Mlp(32), Conv()
    xm, xc = torch.randn(2, 8), torch.randn(1, 3, 10, 10)
    serial = {"mlp": _modules(count(mlp, xm, backward=True)),
              "conv": _modules(count(conv, xc, backward=True))}
    # mlp: up 2*8*32 = 512 MACs forward, grad_weight 8*32*2 = 512 backward (x needs no grad)
    assert serial["mlp"]["up"][1].macs == 512 + 512
    # conv: 1*4*8*8 outputs * 3*3*3 = 6912 MACs forward, the same again for grad_weight
    assert serial["conv"]["conv"][1].macs == 2 * 6912
    seen: dict[str, list[dict[str, tuple[int, flopscope.Cost]]]] = {"mlp": [], "conv": []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(name: str, model: nn.Module, x: torch.Tensor) -> None:
        try:
            start.wait()
            for _ in range(30):
                seen[name].append(_modules(count(model, x, backward=True)))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=("mlp", mlp, xm)),
               threading.Thread(target=work, args=("conv", conv, xc))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for name in ("mlp", "conv"):
        assert len(seen[name]) == 30
        assert all(r == serial[name] for r in seen[name])


def test_dispatch_modes_are_per_thread_already() -> None:
    # what the design relies on: PyTorch keeps the dispatch-mode stack per thread
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    inside: list[int] = []
    with Counter():
        t = threading.Thread(target=lambda: inside.append(len(_get_current_dispatch_mode_stack())))
        t.start()
        t.join()
    assert inside == [0]


def test_worker_thread_is_not_counted_unless_attached() -> None:
    model = Mlp(16)
    x = torch.randn(2, 8)

    def run() -> None:
        model(x)

    with pytest.warns(flopscope.FlopscopeWarning, match=r"ran 3 time\(s\) in another thread.*attach"):
        with Counter(model) as c:
            t = threading.Thread(target=run)
            t.start()
            t.join()
    assert c.report.macs == 0

    def attached() -> None:
        with c2.attach():
            model(x)

    with Counter(model) as c2:
        t = threading.Thread(target=attached)
        t.start()
        t.join()
    # up 2*8*16 = 256, down 2*16*8 = 256
    by = c2.report.by_module()
    assert by["up"].self_cost.macs == 256 and by["down"].self_cost.macs == 256
    assert by[""].calls == 1


def test_attach_needs_an_active_counter() -> None:
    c = Counter()
    with pytest.raises(flopscope.UsageError, match=r"attach\(\) needs an active Counter"):
        with c.attach():
            pass


class _Hooked(nn.Module):
    """A layer whose own hooks compute: its input shifted before, its output doubled after."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin.register_forward_pre_hook(lambda m, args: (args[0] + 1,))
        self.lin.register_forward_hook(lambda m, args, out: out * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def test_work_in_a_modules_own_hooks_is_the_modules() -> None:
    r = flopscope.count(_Hooked(), torch.randn(3, 4))
    by = r.by_module_and_op()
    # the pre-hook's add (3 * 4 = 12 elements) and the hook's mul (12) are lin's, not the root's
    assert by[("lin", "aten.add.Tensor")].cost.flops == 12
    assert by[("lin", "aten.mul.Tensor")].cost.flops == 12
    assert not {op for path, op in by if path == ""} & {"aten.add.Tensor", "aten.mul.Tensor"}


def test_nested_counters_both_see_module_calls_and_leave_module_call_as_it_was() -> None:
    call = nn.Module._call_impl
    model = _Hooked()
    with flopscope.Counter(model) as outer:
        with flopscope.Counter(model) as inner:
            model(torch.randn(3, 4))
        assert nn.Module._call_impl is not call  # the outer Counter still sees module calls
        model(torch.randn(3, 4))
    assert nn.Module._call_impl is call
    # lin: 3 * 4 * 4 = 48 MACs per call; the inner Counter saw one call, the outer both
    assert inner.report.by_module()["lin"].self_cost.macs == 48
    assert outer.report.by_module()["lin"].self_cost.macs == 96
    assert outer.report.by_module()["lin"].calls == 2


def test_a_counter_left_in_another_thread_does_not_stop_this_ones() -> None:
    call = nn.Module._call_impl
    model = _Hooked()
    started, finish = threading.Event(), threading.Event()

    def other() -> None:
        with flopscope.Counter(model):
            started.set()
            finish.wait(10)

    t = threading.Thread(target=other)
    t.start()
    started.wait(10)
    with flopscope.Counter(model) as mine:
        finish.set()
        t.join(10)  # the other Counter exits first, while this one is active
        model(torch.randn(3, 4))
    assert mine.report.by_module()["lin"].self_cost.macs == 48
    assert nn.Module._call_impl is call
