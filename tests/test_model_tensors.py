"""The per-count reads of a model (issue 25, seventh round): a Counter reads the model's module tables
and tensors once (:class:`~flopscope.core.model_index.ModelTensors`), and the stamp, the snapshot,
``on_meta`` and the write guard work from those lists. These tests pin that the lists are the
model as it is at each count (nothing read at an earlier count is trusted) and that the fast
paths give what the per-module walks gave."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from flopscope import Counter, count
from flopscope.core.integrity import WriteGuard
from flopscope.core.model_index import ModelTensors
from flopscope.execution.how import on_meta
from flopscope.execution.snapshot import ModelSnapshot


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, max_norm=1.0)  # renormalises looked-up rows in place
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.lin.register_parameter("unused", None)  # an entry set to None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(self.emb(idx)).reshape(-1, 3))  # (rows, 3)


def _walk(model: nn.Module) -> tuple[list[str], list[Any], list[str], list[Any]]:
    """Parameter and buffer names and entries, module by module (the walk ModelTensors replaces)."""
    pn, pv, bn, bv = [], [], [], []
    for m in model.modules():
        pn += list(m._parameters)
        pv += list(m._parameters.values())
        bn += list(m._buffers)
        bv += list(m._buffers.values())
    return pn, pv, bn, bv


def test_model_tensors_are_the_modules_tables_in_order() -> None:
    model = _Net()
    model.lin.register_forward_hook(lambda m, a, o: None)
    t = ModelTensors(list(model.modules()))
    pn, pv, bn, bv = _walk(model)
    assert t.plain
    assert t.param_names == pn and t.buffer_names == bn
    assert all(a is b for a, b in zip(t.params, pv, strict=True))
    assert all(a is b for a, b in zip(t.buffers, bv, strict=True))
    assert None in t.params  # lin.unused
    assert t.hooked == [model.lin]
    assert not t.on_meta()
    # emb.weight 10*4, lin.weight 3*4, lin.bias 3, bn.weight 3, bn.bias 3
    assert [p.numel() for p in t.params if p is not None] == [40, 12, 3, 3, 3]


def test_on_meta_from_the_tables_and_from_the_modules_agree() -> None:
    model = _Net()
    assert on_meta(ModelTensors(list(model.modules()))) is on_meta(model.modules()) is False
    model.bn.register_buffer("extra", torch.empty(2, device="meta"))  # one meta buffer
    assert on_meta(ModelTensors(list(model.modules()))) is on_meta(model.modules()) is True


def test_a_scripted_submodule_makes_the_tables_not_plain() -> None:
    with warnings.catch_warnings():  # (torch.jit.script is deprecated in newer torch)
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(nn.Linear(4, 2))
    model = nn.Sequential(nn.Linear(4, 4), scripted)
    t = ModelTensors(list(model.modules()))
    assert not t.plain
    assert model[0] in t.eager and model[1] not in t.eager
    # every module's tensors still listed: 4*4 + 4 (eager Linear), 2*4 + 2 (scripted)
    assert sum(p.numel() for p in t.params if p is not None) == 30
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = count(model, torch.randn(2, 4))
    assert r.macs == 2 * 4 * 4 + 2 * 4 * 2  # 32 + 16
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_storage_swapped_between_two_counts_is_protected_at_the_second() -> None:
    """The write guard's table and the snapshot's aliases are made from the model as it is at
    each count: after ``weight.data = other`` between two counts, the second count's in-place
    renormalisation (``nn.Embedding(max_norm=...)``) of the new storage is undone."""
    torch.manual_seed(0)
    model = _Net().train()
    idx = torch.tensor([[1, 2, 3]])
    count(model, idx, warn=False)
    model.emb.weight.data = torch.randn(10, 4) * 10  # rows far above max_norm
    weight, storage = model.emb.weight, model.emb.weight.untyped_storage().data_ptr()
    value = weight.detach().clone()
    stats = model.bn.running_mean.clone()
    count(model, idx, warn=False)
    assert model.emb.weight is weight
    assert model.emb.weight.untyped_storage().data_ptr() == storage
    assert torch.equal(model.emb.weight.detach(), value)
    assert torch.equal(model.bn.running_mean, stats)
    # without flopscope the forward would have changed both
    model(idx)
    assert not torch.equal(model.emb.weight.detach(), value)


def test_a_parameter_replaced_between_two_counts_is_the_one_restored() -> None:
    torch.manual_seed(0)
    model = _Net().train()
    idx = torch.tensor([[4, 5]])
    count(model, idx, warn=False)
    model.emb.weight = nn.Parameter(torch.randn(10, 4) * 10)  # a new object: a new stamp
    new = model.emb.weight
    value = new.detach().clone()
    r = count(model, idx, warn=False)
    assert model.emb.weight is new and torch.equal(new.detach(), value)
    # emb 40 + lin 12 + 3 + bn 3 + 3
    assert r.params == 61


def test_the_write_guard_table_one_tensor_per_storage_and_shared() -> None:
    a, b = torch.zeros(3), torch.ones(2)
    guard = WriteGuard([a, b])
    assert {k: list(v) for k, v in guard.protected.items()} == {
        a.untyped_storage().data_ptr(): [a], b.untyped_storage().data_ptr(): [b]}
    view = a[1:]  # a second tensor on a's storage, a listed twice, an empty tensor
    guard = WriteGuard([a, view, a, torch.zeros(0)])
    assert {k: list(v) for k, v in guard.protected.items()} == {
        a.untyped_storage().data_ptr(): [a, view]}


def test_the_write_guard_keys_a_view_at_an_offset_by_its_storage() -> None:
    # the table read from the tensors' data pointers holds only where each starts its storage:
    # c starts 2 floats (8 bytes) into its storage, so its key is the storage's address, not c's
    a, c = nn.Parameter(torch.zeros(3)), torch.zeros(5)[2:]
    assert c.data_ptr() == c.untyped_storage().data_ptr() + 8
    guard = WriteGuard([a, c])
    assert {k: list(v) for k, v in guard.protected.items()} == {
        a.untyped_storage().data_ptr(): [a], c.untyped_storage().data_ptr(): [c]}


def test_restore_puts_back_a_storage_swapped_during_the_count() -> None:
    model = _Net()
    modules = list(model.modules())
    snap = ModelSnapshot(modules, ModelTensors(modules))
    snap.keep_values(buffers=False)
    weight, original = model.lin.weight, model.lin.weight.data
    weight.data = torch.zeros(3, 4)
    model.bn.running_var.data = torch.zeros(3)
    snap.restore()
    assert model.lin.weight is weight and weight.data.data_ptr() == original.data_ptr()
    assert model.bn.running_var.sum().item() == 3.0  # ones again


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_restores_check_is_not_seen_by_a_users_mode() -> None:
    """The snapshot's in-place check is an operator call (``aten.is_set_to``), made with the
    dispatch modes off: a mode active around a restore sees nothing of it."""
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    modules = list(model.modules())
    snap = ModelSnapshot(modules, ModelTensors(modules))
    snap.keep_values(buffers=False)
    seen = _Seen()
    with seen:
        snap.restore()
        torch.zeros(2).add_(1)  # (the mode sees operators)
    assert seen.names == ["aten.zeros.default", "aten.add_.Tensor"]


def test_counter_reads_the_model_tables_once() -> None:
    model = _Net()
    c = Counter(model)
    t = c.model_tensors
    assert t is not None and t.modules == list(model.modules())
    assert Counter().model_tensors is None
