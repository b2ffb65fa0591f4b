"""Peak memory from storage lifetimes: exact small cases, views, training, shape-only."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import MemoryTracker, peak_memory


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


def test_inference_peak_is_exact() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, mem = peak_memory(model, x)
    # parameters 2 x (256*256 + 256) x 4 B = 526,336; input 4*256*4 = 4,096.
    # relu: its input (linear 0's output, 4,096) and its output (4,096) are both live;
    # linear 2: relu's output and its own output (linear 0's was freed): 2 x 4,096 either way.
    assert mem.at_peak == {"parameters": 526_336, "inputs": 4_096, "activations": 8_192}
    assert mem.peak_bytes == 526_336 + 4_096 + 8_192 == 538_624
    assert mem.peak_phase == "forward" and mem.peak_module == "1"
    assert mem.by_module["1"] == 538_624 and mem.by_module[""] == 538_624


def test_views_share_storage_and_inplace_allocates_nothing() -> None:
    tracker = MemoryTracker()
    x = torch.randn(1024)  # 4,096 B, registered as an input
    tracker.register([x], "inputs")
    with flopscope.Counter(warn=False, observers=[tracker]):
        y = x.view(32, 32).t()  # views: no storage
        z = y + 1  # 4,096 B
        z.mul_(2)  # in place: nothing new
        del z  # freed
        w = x * 3  # 4,096 B
    mem = tracker.profile()
    assert mem.peak_bytes == 8_192
    assert mem.end_bytes == 8_192
    del w


def test_register_rejects_unknown_category() -> None:
    with pytest.raises(ValueError, match="unknown memory category 'weights'"):
        MemoryTracker().register([], "weights")


def test_training_step_categories() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    before = [p.detach().clone() for p in model.parameters()]
    _, mem = peak_memory(model, x, train=True, optimizer="sgd")
    # SGD with momentum: one buffer per parameter; gradients as large as the parameters
    assert mem.at_peak["parameters"] == 526_336
    assert mem.at_peak["gradients"] == 526_336
    assert mem.at_peak["optimizer_state"] == 526_336
    assert mem.train and "SGD" in mem.note
    # the model is left as it was
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert model.training


def test_shape_only_training_matches_real() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, real = peak_memory(model, x, train=True, optimizer="adamw")
    report, meta = peak_memory(model, x, train=True, optimizer="adamw", shape_only=True)
    assert meta.peak_bytes == real.peak_bytes
    assert meta.at_peak == real.at_peak
    assert report.shape_only
    assert next(model.parameters()).device.type == "cpu"


def test_shape_only_inference_matches_real() -> None:
    model = _mlp()
    x = torch.randn(4, 256)
    _, real = peak_memory(model, x)
    _, fake = peak_memory(model, x, shape_only=True)
    assert fake.peak_bytes == real.peak_bytes


def test_adamw_state_is_twice_the_parameters() -> None:
    _, mem = peak_memory(_mlp(), torch.randn(4, 256), train=True, optimizer="adamw")
    # exp_avg and exp_avg_sq per parameter (526,336 each) + one 4-byte step counter per
    # parameter tensor (4 tensors)
    assert mem.at_peak["optimizer_state"] == 2 * 526_336 + 4 * 4


def test_bad_optimizer() -> None:
    with pytest.raises(UsageError, match="unknown optimizer 'lion'"):
        peak_memory(_mlp(), torch.randn(1, 256), train=True, optimizer="lion")


def _profiler_peak_above_start(fn: object) -> int:
    """The most bytes allocated and not yet freed at once while ``fn()`` runs, from
    torch.profiler's allocation events in time order (every CPU allocation, kernel scratch
    included): an independent measurement of the same run."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    assert callable(fn)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas: list[tuple[int, int]] = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.tag == _EventType.Allocation:
            deltas.append((node.start_time_ns, node.extra_fields.alloc_size))
        todo.extend(node.children)
    current = peak = 0
    for _, delta in sorted(deltas):
        current += delta
        peak = max(peak, current)
    return peak


def test_matrix_product_layout_copy_is_workspace() -> None:
    """The gradient of ``out.sum()`` is an expanded tensor (strides (0, 0)); the backward of
    ``mm`` hands it to BLAS, which takes only row- or column-major matrices, so ATen copies it
    to a dense (64, 4096) matrix while the call runs (``addmm_impl_cpu_``)."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4096, bias=False)
    x = torch.randn(64, 16)
    _, mem = peak_memory(model, x, train=True, optimizer=None)
    # weight 4096*16*4 = 262,144; input 64*16*4 = 4,096; in the backward mm: the weight's
    # gradient (262,144) and the copy of the expanded output gradient 64*4096*4 = 1,048,576;
    # the loss and its seed gradient, 4 B each. The forward holds only 1,048,576 of output.
    assert mem.at_peak == {"parameters": 262_144, "inputs": 4_096, "gradients": 262_144,
                           "activations": 8, "workspace": 1_048_576}
    assert mem.peak_bytes == 1_576_968
    assert (mem.peak_phase, mem.peak_op) == ("backward", "aten.mm.default")
    _, meta = peak_memory(model, x, train=True, optimizer=None, shape_only=True)
    assert meta.at_peak == mem.at_peak

    def step() -> None:
        model(x).sum().backward()

    measured = _profiler_peak_above_start(step)
    model.weight.grad = None
    assert 262_144 + 4_096 + measured == mem.peak_bytes


def test_blas_ready_operands_are_not_copied() -> None:
    from flopscope.cost import OpCall, Phase
    from flopscope.estimate.memory import layout_copy_bytes

    a = torch.randn(8, 4)
    b = torch.randn(6, 4).t()  # column-major (strides (1, 4)): BLAS takes it transposed
    mm = torch.ops.aten.mm.default

    def copied(x: torch.Tensor, y: torch.Tensor) -> int:
        return layout_copy_bytes(OpCall(mm, (x, y), {}, mm(x, y), Phase.FORWARD, False))

    assert copied(a, b) == 0
    assert copied(a[:, ::2], b[::2]) == 8 * 2 * 4 + 2 * 6 * 4  # steps of 2: both copied
    assert copied(a, torch.ones(4, 1).expand(4, 6)) == 4 * 6 * 4  # stride 0
    add = torch.ops.aten.add.Tensor
    assert layout_copy_bytes(OpCall(add, (a, a), {}, a + a, Phase.FORWARD, False)) == 0


def _tiny_gpt2(device: str = "cpu") -> nn.Module:
    """Two GPT-2 blocks of width 32; its output projection is tied to the token embedding."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=32)
    torch.manual_seed(0)
    with torch.device(device):  # built on meta: tied as on the CPU (.to("meta") unties)
        return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("optimizer", ["adamw", None])
def test_shape_only_training_step_of_a_model_that_cannot_run_on_meta(
        optimizer: str | None) -> None:
    """transformers reads position ids with .item() on meta (packed-sequence detection, with
    use_cache=False, as the command line passes) and
    skips that on fake tensors: the shape-only step falls back to fake CPU tensors, as
    count() does, and sizes the same step as the real run, category by category (without an
    optimizer there is no warm-up step: the meta attempt fails in the tracked step, whose
    registrations of meta copies must not stay). The meta copy of the real model keeps the
    tied embedding tied (it was counted twice)."""
    model = _tiny_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 64, (1, 16))
    _, real = peak_memory(model, input_ids=ids, use_cache=False, train=True, optimizer=optimizer)
    # parameters 114,176 bytes: 2 blocks x 12,704 params (ln 64+64, attention 32x96+96 and
    # 32x32+32, MLP 32x128+128 and 128x32+32) + embeddings 64x32 (tied) + 32x32 + final ln 64
    # = 28,544 floats
    assert real.at_peak["parameters"] == 114_176
    report, fake = peak_memory(model, input_ids=ids, use_cache=False, train=True, optimizer=optimizer, shape_only=True)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.at_peak == real.at_peak
    assert report.shape_only
    # a model on meta: the same, and the model is left on meta with no gradients
    meta = _tiny_gpt2("meta")
    _, on_meta = peak_memory(meta, input_ids=ids, use_cache=False, train=True, optimizer=optimizer)
    assert on_meta.peak_bytes == real.peak_bytes
    assert all(p.is_meta and p.grad is None for p in meta.parameters())
    assert meta.training


def test_relabel_takes_the_live_storage_not_a_freed_one_at_the_same_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage's key is its address. An activation live at the peak and freed afterwards can
    leave its address to a gradient made later: relabelling the gradient must not turn the
    activation into a gradient too (it did: at_peak's split changed from run to run)."""
    from flopscope.estimate import memory

    activation, gradient = torch.empty(256), torch.empty(64)  # 1,024 and 256 bytes
    st_a, st_g = activation.untyped_storage(), gradient.untyped_storage()
    keys = {id(activation): (7, 1_024, st_a), id(gradient): (7, 256, st_g)}  # one address
    monkeypatch.setattr(memory, "_storage", lambda t: keys.get(id(t)))
    tracker = memory.MemoryTracker()
    tracker.register([activation], "activations")  # the peak: 1,024 bytes
    tracker._died(tracker._live[7])  # freed: its address is free again
    tracker.register([gradient], "temporaries")
    profile = tracker.profile(relabel={"gradients": [gradient]})
    assert profile.peak_bytes == 1_024
    assert profile.at_peak == {"activations": 1_024}
    assert profile.end_bytes == 256


def test_shape_only_inference_that_falls_back_to_fake_tensors_keeps_the_categories() -> None:
    """A meta model whose forward cannot run on meta (GPT-2 with use_cache=False reads its
    position ids with .item()) is counted again on fake CPU tensors: the tracker forgets the
    abandoned attempt but not the parameters and inputs registered before it, and sees the
    model's own tensors where the run used fake stand-ins for them (they showed as 'other')."""
    ids = torch.randint(0, 64, (1, 16))
    _, real = peak_memory(_tiny_gpt2(), input_ids=ids, use_cache=False)
    _, meta = peak_memory(_tiny_gpt2("meta"), input_ids=ids, use_cache=False)
    assert meta.at_peak["parameters"] == real.at_peak["parameters"] == 114_176
    assert meta.at_peak["inputs"] == real.at_peak["inputs"] == 128  # 16 int64 ids
    assert set(meta.at_peak) == {"parameters", "inputs", "activations"}
    # transformers takes another code path on fake tensors than on real ones (its
    # packed-sequence check runs on real tensors only): a few small tensors differ, 45,440
    # against 45,184 bytes of activations
    assert abs(meta.at_peak["activations"] - real.at_peak["activations"]) <= 256


def test_storage_resized_outside_operators_is_freed_and_allocated_again() -> None:
    # FSDP2 frees a layer's unsharded parameters with storage.resize_(0) after its forward and
    # allocates them again with resize_(size) for backward; no dispatch mode sees either
    tracker = MemoryTracker()
    with flopscope.Counter(warn=False, observers=[tracker]):
        a = torch.zeros(1000)  # 4,000 B
        b = a + 1  # 4,000 B: 8,000 live
        a.untyped_storage().resize_(0)  # freed: 4,000 live
        c = b * 2  # 4,000 B: 8,000 live (16,000 were a still charged: the old count)
        a.untyped_storage().resize_(4000 * 2)  # allocated again, 8,000 B: 16,000 live
        d = b + c  # 4,000 B: 20,000 live
    mem = tracker.profile()
    assert mem.peak_bytes == 20_000
    assert mem.end_bytes == 20_000
    assert torch.UntypedStorage.resize_.__name__ != "_resize_"  # put back when closed
    del a, b, c, d


def test_storage_an_operator_resizes_after_the_peak_keeps_its_size_at_the_peak() -> None:
    # an out= argument grows in place after the peak: it was 0 B then, so the peak's breakdown
    # (and every earlier call's) holds 0 B of it, and the breakdown adds up to the peak
    tracker = MemoryTracker()
    with flopscope.Counter(warn=False, observers=[tracker]):
        out = torch.empty(0)  # 0 B
        a = torch.zeros(1000)  # 4,000 B
        b = a + 1  # 4,000 B: the peak, 8,000 live
        del a, b  # 0 live
        s = torch.ones(10)  # 40 B
        torch.mul(s, 2, out=out)  # out grows to 40 B: 80 live
    mem = tracker.profile()
    assert mem.peak_bytes == sum(mem.at_peak.values()) == 8_000
    assert mem.end_bytes == 40 + 40
    del out, s


def test_simulated_fsdp_rank_frees_its_unsharded_layers_after_forward() -> None:
    # a 2-layer Llama, FSDP2 over 2 simulated ranks: after forward every layer's unsharded
    # parameters are freed (resize_(0)); at the peak (the head's backward) only the root's
    # gathered parameters (embedding and head, unsharded: 2 x 256 x 64 x 4 B + the norm) stay
    from flopscope.distributed import Layout, simulate
    from flopscope.sources import load_model

    def build() -> tuple[nn.Module, tuple[object, ...], dict[str, object]]:
        loaded = load_model("hf:llama", batch=1, seq_len=16, shape_only=True, config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256))
        return loaded.model, tuple(loaded.inputs.args), dict(loaded.inputs.kwargs)

    peaks: list[Any] = []
    for layers_freed in (True, False):
        tracker = MemoryTracker()
        if not layers_freed:  # the old count: resizes not followed
            from flopscope.estimate.resizes import follow_resizes

            follow_resizes(tracker, False)
        simulate(build, Layout(2, fsdp=2), backward=True, logical=False, observers=[tracker],
                 warn=False)
        peaks.append(tracker.profile())
    followed, old = peaks
    # each layer's parameters: q, o 64x64, k, v 32x64, gate, up, down 128x64, two norms 64:
    # 4,096 x 2 + 2,048 x 2 + 8,192 x 3 + 128 = 36,992 x 4 B = 147,968 B per layer; the old
    # count kept both layers' gathered parameters among the forward's storages at its peak
    assert old.at_peak["activations"] - followed.at_peak["activations"] == 2 * 147_968
    assert followed.peak_bytes < old.peak_bytes
    # the peak is now where backward gathers layer 0's parameters again
    assert (followed.peak_module, followed.peak_phase, followed.peak_op) == (
        "model.layers.0", "backward", "resize_")
