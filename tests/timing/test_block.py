"""``flopscope.profiling``: any block of code counted and measured in one run (three AdamW steps
of an MLP): the count is a plain Counter's, the run's numbers are the uncounted run's, every
call's time is its operator's own event below the counting mode, and the parts add up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.cost import Phase


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters())


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int = 3) -> None:
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    for _ in range(n):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def test_a_training_loop_is_counted_as_a_counter_counts_it_and_measured() -> None:
    model, opt = _mlp()
    with flopscope.Counter(model) as plain:
        _steps(model, opt)
    model, opt = _mlp()
    with flopscope.profiling(model, hardware="this-machine") as p:
        _steps(model, opt)
    assert p.report is not None and p.timing is not None
    # the count is the Counter's, to the FLOP, in every phase
    assert {ph: p.report.total(ph) for ph in Phase} == {
        ph: plain.report.total(ph) for ph in Phase}
    assert p.report.phases == (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
    t = p.timing
    # one counted call per operator call of the three steps, each found in the profile
    assert len(t.calls) == sum(s.calls for s in plain.report.by_op().values())
    assert t.unmatched == 0
    # the parts: the calls' own times and the time outside them are the block's wall time; the
    # counting mode's share is measured and inside the time outside the calls
    assert sum(c.seconds for c in t.calls) + t.outside_s == pytest.approx(t.wall_s, rel=1e-9)
    assert t.counting_s is not None and 0 < t.counting_s < t.outside_s
    section = p.report.section("measured")
    assert section is not None and section.to_dict()["counting_s"] == t.counting_s
    assert "one counted run of the block" in str(p.report)


def test_profiling_changes_no_number_the_block_computes() -> None:
    model, opt = _mlp()
    _steps(model, opt)
    expected = [q.detach().clone() for q in model.parameters()]
    model, opt = _mlp()
    with flopscope.profiling(model):
        _steps(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected, strict=True))


def test_a_block_without_a_model_is_the_roots_and_bad_uses_are_errors() -> None:
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with flopscope.profiling() as p:
        a @ b
    assert p.report is not None and p.report.macs == 16 * 16 * 16  # one 16x16x16 product
    with pytest.raises(flopscope.UsageError, match="ran no operator"), flopscope.profiling():
        pass
    with torch.device("meta"):
        meta = nn.Linear(4, 4)
    with pytest.raises(flopscope.UsageError, match="meta tensors"), flopscope.profiling(meta):
        pass
    # an error in the block is the block's, and the profiler is stopped after it
    with pytest.raises(ZeroDivisionError), flopscope.profiling():
        _ = 1 / 0
    with flopscope.profiling() as again:
        a @ b
    assert again.timing is not None and len(again.timing.calls) == 1


def test_the_blocks_trace_has_every_call_and_the_module_spans() -> None:
    from flopscope.timing.trace import measured_trace

    model, opt = _mlp()
    with flopscope.profiling(model) as p:
        _steps(model, opt, n=2)
    assert p.timing is not None
    events = measured_trace(p.timing)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e["tid"] == 1]
    modules = [e["name"] for e in events if e.get("ph") == "X" and e["tid"] == 2]
    # every call with an event of its own (autograd's detach of a saved tensor has none)
    assert len(ops) == sum(c.runs[0] is not None for c in p.timing.calls) > 0
    # two forwards: the root and its three layers each entered twice
    assert sorted(modules) == sorted(["(root)", "0", "1", "2"] * 2)
