"""FLOPs per token against the published formulas; the training monitor, its callbacks, frozen
parameters."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import flopscope
from flopscope.execution.copies import meta_twin
from flopscope.llm.flops import (
    megatron_flops_per_token,
    mfu,
    nanogpt_flops_per_token,
    palm_flops_per_token,
    peak_flops,
    token_flops,
)
from flopscope.llm.monitor import TrainingMonitor
from flopscope.sources import load_model

SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))


def test_formulas_published_gpt2() -> None:
    # nanoGPT transformer_sizing: 874.9 GFLOPs per forward+backward sequence at T = 1024
    assert nanogpt_flops_per_token(12, 768, 1024, 50257) * 1024 == 874_944_921_600
    # PaLM: 6N + 12 L H Q T with N = 124,337,664 (GPT-2 without biases): 879.9 GFLOPs
    assert palm_flops_per_token(124_337_664, 12, 12, 64, 1024) * 1024 == 879_894_724_608
    # Megatron's 72 l h^2 (1 + s/6h + V/12lh) is the same matmul count as nanoGPT's
    assert megatron_flops_per_token(12, 768, 1024, 50257) * 1024 == pytest.approx(874_944_921_600)


def test_gpt2_training_flops_per_token() -> None:
    model = load_model("hf:gpt2", shape_only=True).model
    tf = token_flops(model, seq_len=1024)
    fwd, bwd = tf.by_phase[flopscope.Phase.FORWARD], tf.by_phase[flopscope.Phase.BACKWARD]
    # forward products = nanoGPT's forward: 291,648,307,200 / 2 MACs
    assert 2 * fwd.macs == 291_648_307_200
    # backward = 2 x forward + the flash backward's recomputation of Q K^T:
    # 12 layers x 12 heads x 1024^2 x 64 = 9,663,676,416 MACs
    assert bwd.macs == 2 * fwd.macs + 9_663_676_416
    # matmul-only, no recomputation, dense attention = nanoGPT's 874.9 GFLOPs exactly
    assert tf.matmul_flops - 2 * 9_663_676_416 == 874_944_921_600
    # model FLOPs: causal attention (visible pairs) ~ 819.5 GFLOPs per sequence
    assert 0.93 < tf.model_flops / 874_944_921_600 < 0.94


def test_shape_only_token_ids_take_no_memory() -> None:
    pytest.importorskip("transformers")
    config = {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16, "n_positions": 8}
    model = load_model("hf:gpt2", config=config, shape_only=True).model
    # 10^10 x 8 token ids would be 640 GB of int64 if made real (they were: torch.randint)
    tf = token_flops(model, seq_len=8, batch=10**10, train=False)
    small = token_flops(model, seq_len=8, batch=1, train=False)
    assert tf.tokens == 8 * 10**10
    assert tf.by_phase[flopscope.Phase.FORWARD].macs == 10**10 * small.by_phase[
        flopscope.Phase.FORWARD].macs


def test_mfu_and_peaks() -> None:
    assert peak_flops(1e12) == 1e12
    assert peak_flops("h100-sxm", torch.bfloat16) > 5e14
    assert mfu(6e12, 2.0, 1e13) == pytest.approx(0.3)
    with pytest.raises(flopscope.UsageError, match="positive"):
        peak_flops(-1.0)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(ids)))


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_monitor_counts_once_per_signature_and_matches_a_full_count() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = TrainingMonitor(model, peak=1e12)
    shapes = [(4, 16), (4, 16), (4, 16), (4, 8), (4, 16)]
    for s in shapes:
        ids = torch.randint(0, 50, s)
        with monitor.step(ids):
            _train_step(model, opt, ids)
    h = monitor.history
    assert [x.counted for x in h] == [True, False, False, True, False]
    assert [x.new_signature for x in h] == [True, False, False, True, False]
    assert h[1].counted_flops == h[0].counted_flops and h[4].counted_flops == h[0].counted_flops
    assert h[1].tokens == 64 and h[1].mfu is not None
    # the logged figure = a full count of any step with that signature
    ids = torch.randint(0, 50, (4, 16))
    with flopscope.Counter(model, warn=False) as c:
        _train_step(model, opt, ids)
    assert h[2].counted_flops == c.report.flops


class LoRALinear(nn.Module):
    """y = W x + B A x: a base weight and a rank-2 adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(64, 64, bias=False)
        self.a = nn.Linear(64, 2, bias=False)
        self.b = nn.Linear(2, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(x))


def test_frozen_parameters_cost_what_they_cost() -> None:
    """Frozen weights have no weight-gradient product (the LoRA example of docs/llm.md)."""
    model, x = LoRALinear(), torch.randn(8, 64)
    full = flopscope.count(model, x, backward=True, warn=False)
    model.base.weight.requires_grad_(False)
    lora = flopscope.count(model, x, backward=True, warn=False)
    # full fine-tuning backward: dW_base 8*64*64 = 32,768; dW_a 8*64*2 = 1,024; dW_b 8*2*64 =
    # 1,024; d(a's output) 8*64*2 = 1,024 (x needs no gradient): 35,840 MACs
    assert full.total("backward").macs == 35_840
    # LoRA: the frozen base weight gets no gradient: 3,072 MACs
    assert lora.total("backward").macs == 3_072
    assert lora.total("forward") == full.total("forward")
    monitor = TrainingMonitor(model)
    with monitor.step(x):
        model(x).sum().backward()
    model.base.weight.requires_grad_(True)
    with monitor.step(x):
        model(x).sum().backward()
    # requires_grad is part of the signature: two counts, each what ran
    assert [s.counted for s in monitor.history] == [True, True]
    assert monitor.history[1].counted_flops > monitor.history[0].counted_flops


def test_hf_trainer_callback_logs(tmp_path: object) -> None:
    transformers = pytest.importorskip("transformers")
    from flopscope.llm.integrations.hf import FlopscopeCallback

    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      vocab_size=64)
    model = transformers.LlamaForCausalLM(config)
    data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))}
            for _ in range(8)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                          max_steps=4, logging_steps=1, report_to=[],
                                          use_cpu=True, save_strategy="no")
    cb = FlopscopeCallback(peak=1e12)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb])
    trainer.train()
    logged = [e for e in trainer.state.log_history if "flopscope/flops_per_step" in e]
    assert len(logged) == 4
    for key in ("flopscope/flops_per_step", "flopscope/tokens_per_second", "flopscope/mfu"):
        assert logged[-1][key] > 0
    assert cb.monitor is not None and len(cb.monitor.cache) == 1  # one signature, one count
    assert cb.monitor.shadow_path == "meta"  # counted on a meta twin of the model
    # the logged FLOPs = a full forward+backward count of such a batch, as the Trainer calls the
    # model (with num_items_in_batch: the loss is a sum divided by it)
    batch = {"input_ids": torch.randint(0, 64, (2, 16)), "labels": torch.randint(0, 64, (2, 16)),
             "num_items_in_batch": torch.tensor(32)}
    model.train()
    ref = flopscope.count(model, flopscope.Inputs(**batch), backward=True, shape_only=True,
                          warn=False)
    assert logged[-1]["flopscope/flops_per_step"] == ref.flops


def test_lightning_callback_logs(tmp_path: object) -> None:
    L = pytest.importorskip("lightning")
    from flopscope.llm.integrations.lightning import FlopscopeLightningCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Tiny()

        def training_step(self, batch: torch.Tensor, idx: int) -> torch.Tensor:
            out = self.net(batch)
            return nn.functional.cross_entropy(out.flatten(0, 1), batch.flatten())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = torch.utils.data.DataLoader(torch.randint(0, 50, (16, 12)), batch_size=4)
    cb = FlopscopeLightningCallback(peak=1e12)
    trainer = L.Trainer(max_steps=4, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), accelerator="cpu")
    trainer.fit(Module(), loader)
    metrics = trainer.callback_metrics
    for key in ("flopscope/flops_per_step", "flopscope/tokens_per_second", "flopscope/mfu"):
        assert float(metrics[key]) > 0
    assert cb.monitor is not None and [s.counted for s in cb.monitor.history] == [True, False,
                                                                                  False, False]
    # live count: forward + loss + backward + SGD step
    assert cb.monitor.history[3].counted_flops == cb.monitor.history[0].counted_flops


def test_monitor_lists_parameters_once_and_again_on_a_new_signature() -> None:
    """A step with a cached signature does not walk the model's modules (model.parameters() was
    most of the per-step cost); a new signature lists them again, so adapters added later with
    the base frozen are seen and counted."""
    model = LoRALinear()
    del model.a, model.b  # a plain linear ...
    model.forward = lambda x: model.base(x)  # type: ignore[method-assign]
    walks = []
    real_parameters = model.parameters

    def parameters(recurse: bool = True) -> Iterator[nn.Parameter]:
        walks.append(1)
        return real_parameters(recurse)

    model.parameters = parameters  # type: ignore[method-assign]
    x = torch.randn(8, 64)
    monitor = TrainingMonitor(model)
    assert len(walks) == 1
    for _ in range(3):  # no zero_grad: gradients accumulate from the second step on
        with monitor.step(x):
            model(x).sum().backward()
    # step 0: a new signature (listed again); steps 1, 2: cached, no walk
    assert len(walks) == 2 and [s.counted for s in monitor.history] == [True, False, False]
    # what the signature leaves out: adding into an existing .grad (gradient accumulation) is
    # one add per weight element, 64 * 64 = 4,096 FLOPs, not in step 0's count
    with flopscope.Counter(model, warn=False) as c:
        model(x).sum().backward()
    assert c.report.flops - monitor.history[2].counted_flops == 4_096
    model.zero_grad()
    # with zero_grad (the usual loop) the cached figure = a full count of the step; its backward
    # of y = x W^T (x without grad) is dW only: 8 * 64 * 64 = 32,768 MACs
    with flopscope.Counter(model, warn=False) as c:
        model(x).sum().backward()
    assert monitor.history[2].counted_flops == c.report.flops
    assert c.report.total("backward").macs == 32_768
    # ... then given a rank-2 adapter, the base frozen (LoRA): the base's requires_grad changed,
    # so the signature is new, the parameters are listed again and the adapter is counted
    model.a, model.b = nn.Linear(64, 2, bias=False), nn.Linear(2, 64, bias=False)
    model.forward = lambda x: model.base(x) + model.b(model.a(x))  # type: ignore[method-assign]
    model.base.weight.requires_grad_(False)
    model.zero_grad()
    before = len(walks)
    with monitor.step(x):
        model(x).sum().backward()
    assert monitor.history[3].counted and len(walks) == before + 1
    model.zero_grad()
    with flopscope.Counter(model, warn=False) as c:
        model(x).sum().backward()
    # = the LoRA test's figure: backward 3,072 MACs (dW_a, dW_b, d(a's output))
    assert c.report.total("backward").macs == 3_072
    assert monitor.history[3].counted_flops == c.report.flops


def test_callbacks_share_options_and_check_the_peak_early() -> None:
    from flopscope.llm.integrations.base import MonitorCallback

    with pytest.raises(flopscope.UsageError, match="unknown hardware 'h900'"):
        MonitorCallback(peak="h900")
    cb = MonitorCallback(peak=2e12, recount_every=5, prefix="x/")
    assert cb.metrics() == {}
    monitor = cb.make_monitor(Tiny())
    assert cb.monitor is monitor and monitor.peak == 2e12 and monitor.recount_every == 5
    hf = pytest.importorskip("flopscope.llm.integrations.hf")
    assert issubclass(hf.FlopscopeCallback, MonitorCallback)
    lightning = pytest.importorskip("flopscope.llm.integrations.lightning")
    assert issubclass(lightning.FlopscopeLightningCallback, MonitorCallback)


def test_shadow_count_on_a_meta_twin_equals_a_shape_only_count() -> None:
    """The transformers callback's way: a forward hook records a new signature, the step is
    counted afterwards on a copy of the model on meta (no weights copied); it equals a
    shape-only count of the real model, which is left as it was."""
    model = Tiny()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = len(model._forward_pre_hooks)
    ids = torch.randint(0, 50, (4, 16))
    monitor = TrainingMonitor(model)
    monitor.attach()
    for _ in range(2):
        monitor.begin()
        model(ids).sum().backward()
        monitor.end()
    monitor.detach()
    assert [s.counted for s in monitor.history] == [True, False]
    assert monitor.shadow_path == "meta"
    ref = flopscope.count(model, ids, backward=True, shape_only=True, warn=False)
    assert monitor.history[1].counted_flops == ref.flops
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert len(model._forward_pre_hooks) == hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the twin: meta tensors of the same shapes, the tied structure kept, nothing copied
    twin = meta_twin(model, keep={id(monitor): monitor})
    assert all(p.is_meta for p in twin.parameters())
    assert [p.shape for p in twin.parameters()] == [p.shape for p in model.parameters()]
