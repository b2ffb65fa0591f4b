"""After any count, every parameter and buffer of the model is bitwise what it was, and no tensor
attribute of a module is replaced (issue 13). One case per kind of module that changes itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

from flopscope import ForwardError, count


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, buffer and tensor attribute, by name, as (object, copy)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, m in model.named_modules():
        for name, t in [*m._parameters.items(), *m._buffers.items(),
                        *((k, v) for k, v in vars(m).items() if isinstance(v, torch.Tensor))]:
            if t is not None:
                out[f"{prefix}.{name}"] = t
    return out


def _same(before: dict[str, tuple[torch.Tensor, torch.Tensor]], model: nn.Module) -> None:
    after = _state(model)
    assert set(after) == set(before)
    for name, (obj, value) in before.items():
        assert after[name] is obj, f"{name} was replaced"
        assert torch.equal(obj.detach(), value), f"{name} changed"
        assert obj.dtype == value.dtype


class EmbeddingMaxNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, max_norm=1.0)  # renormalises looked-up rows in place

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.emb(idx)


class DataWriter(nn.Module):
    """Writes to its weight through .data and through a view, under no_grad."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.lin.weight.data.mul_(2)
            self.lin.bias[:2].add_(1)
        return self.lin(x)


class Replacer(nn.Module):
    """Replaces a parameter and a buffer with new objects."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.w = nn.Parameter(self.w.detach() * 3)
        self.b = self.b + 1
        return x * self.w + self.b


class DataSwapper(nn.Module):
    """Swaps the storage of a parameter and a buffer with `.data =` (no operator runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data = self.lin.weight.data * 2
        self.buf.data = torch.zeros(5)
        return self.lin(x)


def _legacy_spectral() -> nn.Module:
    return nn.utils.spectral_norm(nn.Linear(4, 4))  # power iteration updates u, v and .weight


def _legacy_weight_norm() -> nn.Module:
    return nn.utils.weight_norm(nn.Linear(4, 4))  # sets .weight from g and v on every call


def _param_spectral() -> nn.Module:
    return parametrizations.spectral_norm(nn.Linear(4, 4))  # updates its _u, _v buffers


def _param_orthogonal() -> nn.Module:
    return parametrizations.orthogonal(nn.Linear(4, 4))


def _param_weight_norm() -> nn.Module:
    return parametrizations.weight_norm(nn.Linear(4, 4))


def _batchnorm() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))  # running stats, batch counter


CASES: list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor]]] = [
    ("embedding_max_norm", EmbeddingMaxNorm, lambda: torch.tensor([[1, 2, 3], [3, 4, 5]])),
    ("data_writer", DataWriter, lambda: torch.randn(2, 4)),
    ("replacer", Replacer, lambda: torch.randn(2, 4)),
    ("data_swapper", DataSwapper, lambda: torch.randn(2, 4)),
    ("spectral_norm", _legacy_spectral, lambda: torch.randn(2, 4)),
    ("weight_norm", _legacy_weight_norm, lambda: torch.randn(2, 4)),
    ("parametrized_spectral_norm", _param_spectral, lambda: torch.randn(2, 4)),
    ("orthogonal", _param_orthogonal, lambda: torch.randn(2, 4)),
    ("parametrized_weight_norm", _param_weight_norm, lambda: torch.randn(2, 4)),
    ("batchnorm", _batchnorm, lambda: torch.randn(3, 4)),
]


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm. is deprecated:FutureWarning")
@pytest.mark.parametrize("shape_only", [False, True])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize(("name", "make", "inputs"), CASES, ids=[c[0] for c in CASES])
def test_count_leaves_every_tensor_as_it_was(
    name: str, make: Callable[[], nn.Module], inputs: Callable[[], torch.Tensor],
    backward: bool, shape_only: bool,
) -> None:
    model = make().train()
    x = inputs()
    before = {k: (t, t.detach().clone()) for k, t in _state(model).items()}
    if name == "data_swapper" and shape_only:
        # `.data = <fake tensor>` on a real parameter breaks a fake forward: the count fails
        # loudly, and the model is kept as it was
        with pytest.raises(ForwardError, match="FakeTensorDeviceMismatchError"):
            count(model, x, backward=backward, shape_only=shape_only, train=True, warn=False)
    else:
        count(model, x, backward=backward, shape_only=shape_only, train=True, warn=False)
    _same(before, model)
    assert all(p.grad is None for p in model.parameters())


def test_the_embedding_would_change_without_flopscope() -> None:
    # what is being guarded against: the forward itself renormalises rows 1..5
    model = EmbeddingMaxNorm()
    w = model.emb.weight.detach().clone()
    model(torch.tensor([[1, 2, 3], [3, 4, 5]]))
    assert not torch.equal(model.emb.weight.detach(), w)


def test_only_written_parameters_are_copied() -> None:
    # copy on write: one Linear of 4 writes, the other 1000x1000 is never copied
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.Linear(1000, 1000)
            self.emb = nn.Embedding(10, 4, max_norm=1.0)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.emb(idx)

    from flopscope import Counter

    model = Two()
    before = model.emb.weight.detach().clone()
    c = Counter(model)
    c.protect(list(model.parameters()))
    with c:
        model(torch.tensor([1, 2]))
    assert not torch.equal(model.emb.weight, before)  # max_norm renormalised rows in place
    # one tensor was copied and put back: the embedding (the 1000 x 1000 linear never)
    assert c.restore() == 1
    assert torch.equal(model.emb.weight, before)


class MetaDataSwapper(nn.Module):
    """Swaps a meta parameter's and a meta buffer's storage for others of another shape with
    `.data =` (no operator runs; every meta data pointer is 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4, device="meta")
        self.register_buffer("buf", torch.ones(3, device="meta"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data = torch.empty(8, 4, device="meta")
        self.buf.data = torch.empty(5, device="meta")
        return x * 2


@pytest.mark.parametrize("shape_only", [False, True])
def test_a_meta_model_keeps_its_storages_and_shapes(shape_only: bool) -> None:
    model = MetaDataSwapper()
    weight, buf = model.lin.weight, model.buf
    alias = weight.detach()  # shares the parameter's storage
    count(model, torch.randn(2, 4, device="meta"), shape_only=shape_only, warn=False)
    assert model.lin.weight is weight and model.buf is buf
    assert weight.shape == (4, 4) and buf.shape == (3,)
    assert weight.untyped_storage()._cdata == alias.untyped_storage()._cdata  # the same storage


def test_count_runs_with_the_heap_frozen() -> None:
    """count() freezes the objects that exist when it starts (gc.freeze), so that full
    collections during the count do not rescan torch and the model; it unfreezes after."""
    import gc

    seen: list[int] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(gc.get_freeze_count())
            return x * 2

    before = gc.get_freeze_count()
    count(Probe(), torch.randn(2), warn=False)
    assert seen and seen[0] > before
    assert gc.get_freeze_count() == before


@pytest.mark.parametrize(("train", "copies"), [(False, 0), (True, 3)])
def test_buffers_are_copied_only_when_an_operator_writes_them(train: bool, copies: int) -> None:
    # copy on write of buffers: batch norm's kernel updates running_mean and running_var (its
    # schema does not say so) and the module bumps num_batches_tracked only in training mode:
    # 3 buffers saved and put back; in eval mode none
    from flopscope import Counter

    model = nn.BatchNorm1d(4).train(train)
    before = {name: b.clone() for name, b in model.named_buffers()}
    c = Counter(model, warn=False)
    c.protect([*model.parameters(), *model.buffers()])
    with c:
        model(torch.randn(3, 4))
    assert c.restore() == copies
    for name, b in model.named_buffers():
        assert torch.equal(b, before[name]), name


class SharedStorage(nn.Module):
    """Two buffers that are views of one storage; the forward writes the first one."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.zeros(6)
        self.register_buffer("a", base[:3])
        self.register_buffer("b", base[3:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a.add_(1)
        return x + self.a + self.b


def test_buffers_sharing_a_storage_are_put_back() -> None:
    model = SharedStorage()
    count(model, torch.randn(3), warn=False)
    assert torch.equal(model.a, torch.zeros(3)) and torch.equal(model.b, torch.zeros(3))
