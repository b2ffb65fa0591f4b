"""Models on the ``meta`` device run on meta kernels, yet count what a CPU run counts.

``scaled_dot_product_attention`` would take its unfused math form on meta; during a count it runs
the operators the CPU runs (recorded once on fake CPU tensors, replayed on meta). Models holding
``nn.MultiheadAttention`` (a fast path chosen in Python by device) run as fake CPU tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


class _Sdpa(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention, with a choice of mask."""

    def __init__(self, dim: int = 32, heads: int = 4, mask: str = "none") -> None:
        super().__init__()
        self.heads = heads
        self.mask = mask
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.mask == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mask == "bool":
            keep = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        elif self.mask == "float":
            bias = torch.zeros(n, n, device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, c))  # type: ignore[no-any-return]


def _records(report: flopscope.Report) -> dict[tuple[str, str, str], tuple[int, flopscope.Cost]]:
    return {(r.module, r.op, r.phase.value): (r.calls, r.cost) for r in report.records}


def _registered() -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::scaled_dot_product_attention", "AutogradMeta"))


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
@pytest.mark.parametrize("backward", [False, True])
def test_sdpa_on_meta_counts_what_the_cpu_runs(mask: str, backward: bool) -> None:
    torch.manual_seed(0)
    model = _Sdpa(mask=mask)
    x = torch.randn(2, 8, 32)
    real = flopscope.count(model, x, backward=backward)
    meta = flopscope.count(copy.deepcopy(model).to("meta"), x, backward=backward)
    assert _records(meta) == _records(real)
    assert real.by_op()[FLASH].calls == 1
    assert meta.shape_only and not real.shape_only
    assert not _registered()  # the override lives only as long as the count


def test_sdpa_override_removed_when_the_forward_raises() -> None:
    class Broken(_Sdpa):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            super().forward(x)
            raise ValueError("boom")

    with torch.device("meta"):
        model = Broken()
    with pytest.raises(flopscope.ForwardError, match="boom"):
        flopscope.count(model, torch.randn(2, 8, 32))
    assert not _registered()  # meta SDPA outside a count is PyTorch's own again


def test_a_counter_on_meta_tensors_counts_what_the_cpu_runs() -> None:
    """A Counter around a meta model's forward and backward (not only count()) sees the CPU's
    attention kernels: on meta, SDPA alone would take its unfused math form (two bmm)."""
    torch.manual_seed(0)
    model = _Sdpa(mask="causal")
    x = torch.randn(2, 8, 32)
    on_meta = copy.deepcopy(model).to("meta")
    reports = []
    for m, inputs in ((model, x), (on_meta, x.to("meta"))):
        with flopscope.Counter(m) as c:
            m(inputs).sum().backward()
        reports.append(c.report)
        assert not _registered()  # only while a Counter is active
    assert _records(reports[1]) == _records(reports[0])
    assert "aten.bmm.default" not in reports[1].by_op()
    assert reports[1].by_op()[FLASH].calls == 1
    # and counted once, as the count() of the same step
    assert reports[1].macs == flopscope.count(on_meta, x, backward=True).macs


def test_identical_layers_probe_the_cpu_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import flopscope.execution.meta as meta_module

    probes = []
    original = meta_module._record_on_cpu

    def counting(*args: object, **kwargs: object) -> object:
        probes.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(meta_module, "_record_on_cpu", counting)
    with torch.device("meta"):
        model = nn.Sequential(*[_Sdpa(mask="causal") for _ in range(6)])
    report = flopscope.count(model, torch.randn(1, 8, 32))
    assert report.by_op()[FLASH].calls == 6
    assert len(probes) == 1


def test_multihead_attention_fast_path_kept_on_meta() -> None:
    """nn.MultiheadAttention picks its fused fast path in Python, for CPU tensors only; a meta model
    holding one runs as fake CPU tensors, so eval + no_grad still counts the fused kernel."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        real = flopscope.count(layer, x)
        meta = flopscope.count(copy.deepcopy(layer).to("meta"), x)
    assert _records(meta) == _records(real)
    assert any("transformer_encoder_layer_fwd" in op or "multi_head_attention" in op
               for op in real.by_op())


def test_number_assigned_into_a_tensor_differs_only_in_bookkeeping() -> None:
    """``mask[:2] = 3`` is ``fill_`` on a CPU tensor but, before torch 2.15, ``scalar_tensor`` +
    ``copy_`` on a meta one (PyTorch's Python bindings special-cased CPU scalars; 2.15 dispatches
    ``fill_.Scalar`` on both): no arithmetic either way."""

    class Fill(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m = x.new_zeros(4, 4)
            m[:2] = 3
            return x * self.scale + m

    x = torch.randn(4, 4)
    real = flopscope.count(Fill(), x)
    meta = flopscope.count(Fill().to("meta"), x)
    bookkeeping = {"aten.fill_.Tensor", "aten.fill_.Scalar", "aten.lift_fresh.default",
                   "aten.copy_.default", "aten.scalar_tensor.default", "aten.expand.default",
                   "aten.view.default"}
    assert set(real.by_op()) ^ set(meta.by_op()) <= bookkeeping
    assert {"aten.fill_.Tensor", "aten.fill_.Scalar"} & set(real.by_op())
    # x * scale + m: 16 multiplies + 16 adds on both devices
    assert real.flops == meta.flops == 32 and real.macs == meta.macs == 0


def test_forward_that_cannot_run_on_meta_falls_back_to_fake_cpu() -> None:
    """transformers checks position ids for packed sequences with a data-dependent ``.all()`` unless
    it sees fake tensors; on meta that raises, so the count runs again on fake CPU tensors."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 50, (1, 8))
    with torch.device("meta"):
        meta_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    real = flopscope.count(model, ids, use_cache=False)
    fake = flopscope.count(model, ids, use_cache=False, shape_only=True)
    meta = flopscope.count(meta_model, ids, use_cache=False)
    # transformers skips the check on fake tensors, and so builds its attention mask another way
    # than the real run (which did the check): the meta count is the fake-CPU one, with the real
    # run's MACs (only the mask's elementwise FLOPs differ)
    assert _records(meta) == _records(fake)
    assert meta.macs == real.macs
    assert meta.by_op()[FLASH].calls == 1
    assert not _registered()


class _Seen:
    """An observer that keeps every call's tensors."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []

    def on_call(self, path: str, phase: object, op: str, call: object, cost: object) -> None:
        assert call is not None
        self.inputs += call.inputs  # type: ignore[attr-defined]
        self.outputs += call.outputs  # type: ignore[attr-defined]


def test_observers_of_a_shape_only_count_see_the_models_own_tensors() -> None:
    """A real model counted shape-only with observers runs on meta copies of its tensors, like one
    without (no fake CPU tensors), and observers are shown the model's own parameters and buffers
    in place of the copies, so that peak memory (which registers them before the count) is the
    real count's. The caller's inputs are shown in place of their meta copies too."""
    from flopscope.estimate.memory import MemoryTracker

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    seen = _Seen()
    real_memory, shape_memory = MemoryTracker(), MemoryTracker()
    for tracker in (real_memory, shape_memory):
        tracker.register(model.parameters(), "parameters")
        tracker.register(model.buffers(), "buffers")
    with torch.no_grad():
        real = flopscope.count(model, x, observers=[real_memory])
        shape_only = flopscope.count(model, x, shape_only=True, observers=[seen])
        flopscope.count(model, x, shape_only=True, observers=[shape_memory])  # nothing kept alive
    assert shape_only.to_dict()["records"] == real.to_dict()["records"]
    # it ran on meta: every output a plain meta tensor (a fake CPU count makes FakeTensors)
    assert seen.outputs and all(type(t) is torch.Tensor and t.is_meta for t in seen.outputs)
    # every parameter, and the input, reached the observer as itself (a meta copy never did)
    read = {id(t) for t in seen.inputs if not t.is_meta}
    assert read == {id(p) for p in model.parameters()} | {id(x)}
    # the same lifetimes, so the same peak: parameters (16*32 + 32 + 2*32 + 32*8 + 8 floats =
    # 3,488 bytes, registered, not counted again under their copies) and activations
    shape_profile, real_profile = shape_memory.profile(), real_memory.profile()
    assert shape_profile.at_peak["parameters"] == real_profile.at_peak["parameters"] == 3_488
    assert shape_profile.peak_bytes == real_profile.peak_bytes
    assert shape_profile.at_peak == real_profile.at_peak
    assert all(not t.is_meta for t in model.parameters())
