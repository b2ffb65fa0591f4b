"""flopscope on the whole torchvision classification zoo.

What is checked (issue 2):

* for every classification model (``weights=None``, input ``(1, 3, crop, crop)`` with ``crop`` from
  the DEFAULT weights' transforms), ``report.macs`` equals the published ``meta["_ops"]`` to three
  decimals (torchvision calls them GFLOPS; they are conv/matmul MACs) and ``report.params`` equals
  ``meta["num_params"]``;
* no operator goes uncounted, forward and forward + backward (eval and train mode);
* a representative subset, run for real on the CPU with and without ``torch.no_grad()``, gives the
  published MACs, and exactly the same MACs, FLOPs and bytes as shape-only (fake tensor) and meta
  counts of the same code path;
* ``2 * report.macs`` equals torch's ``FlopCounterMode`` total for ResNet-50 forward + backward
  measured in the same run.

Tiers: the default tier counts the whole zoo forward on the ``meta`` device (cheap: no arithmetic, no
memory), backward for one model per family on ``meta``, and real runs only for the subset. The whole
zoo backward and the whole zoo with fake tensors on real (CPU-built) models are ``slow``.
"""

from __future__ import annotations

import os
import warnings
from functools import cache, partial
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopscope
from flopscope.cost import Cost, OpCall
from flopscope.report import Report
from flopscope.rules import conv
from flopscope.rules._shapes import named_arg

torchvision = pytest.importorskip("torchvision")
from torchvision.models import get_model, get_model_weights, list_models  # noqa: E402
from torchvision.models import regnet as tv_regnet  # noqa: E402

# The default test command runs every test, so the slow tier also needs FLOPSCOPE_SLOW=1:
#   FLOPSCOPE_SLOW=1 .venv/bin/python -m pytest -m slow tests/test_torchvision_zoo.py
_RUN_SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))


def slow(fn: Any) -> Any:
    """Mark ``fn`` slow and skip it unless FLOPSCOPE_SLOW is set."""
    skip = pytest.mark.skipif(not _RUN_SLOW, reason="slow tier: set FLOPSCOPE_SLOW=1")
    return pytest.mark.slow(skip(fn))

ZOO = sorted(list_models(module=torchvision.models))

# The subset run for real on the CPU (issue 2 names vit_b_16, swin_t, convnext_tiny, inception_v3).
REAL_SUBSET = [
    "resnet50", "vit_b_16", "swin_t", "convnext_tiny", "inception_v3", "mobilenet_v3_large",
    "efficientnet_b0",
]

# One model per architecture family (the other members run the same operators at other sizes):
# the default tier checks their backward; the slow tier checks every model's.
FAMILY_REPRESENTATIVES = [
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
    "googlenet", "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small",
    "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnext50_32x4d", "shufflenet_v2_x0_5",
    "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_32", "wide_resnet50_2",
]


@cache
def _weights_meta(name: str) -> tuple[int, float, int]:
    """(crop, published GMACs, published parameters) of the model's DEFAULT weights."""
    weights = get_model_weights(name).DEFAULT
    crop = weights.transforms().crop_size
    return int(crop[0]), float(weights.meta["_ops"]), int(weights.meta["num_params"])


def _kwargs(name: str) -> dict[str, Any]:
    crop = _weights_meta(name)[0]
    kwargs: dict[str, Any] = {}
    if name == "googlenet":
        # Published without the auxiliary heads (num_params 6,624,904).
        kwargs["aux_logits"] = False
    if name in ("googlenet", "inception_v3"):
        # inception_v3 keeps its AuxLogits head: the published 27,161,264 parameters include it,
        # and in eval mode it does not run, so the MACs are the main path's.
        kwargs["init_weights"] = False  # counts do not depend on the initial values
    if name.startswith("vit_"):
        kwargs["image_size"] = crop  # vit_h_14's DEFAULT (SWAG) weights are for 518 x 518
    return kwargs


def build(name: str, device: str = "cpu") -> nn.Module:
    """The model with ``weights=None``, built on ``device``, in eval mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name.startswith("regnet_") and device == "meta":
            # RegNet computes its block widths with tensor arithmetic and .tolist(), which has no
            # data on the meta device: compute them on the CPU, then build the modules on meta.
            with mock.patch.object(tv_regnet, "_regnet", lambda params, *a, **k: params):
                params = get_model(name, weights=None)
            with torch.device("meta"):
                norm = partial(nn.BatchNorm2d, eps=1e-05, momentum=0.1)  # as torchvision's _regnet
                model = tv_regnet.RegNet(params, norm_layer=norm)
        else:
            with torch.device(device):
                model = get_model(name, weights=None, **_kwargs(name))
    return model.eval()


def image(name: str, batch: int = 1) -> torch.Tensor:
    crop = _weights_meta(name)[0]
    return torch.randn(batch, 3, crop, crop, generator=torch.Generator().manual_seed(0))


def count(model: nn.Module, *args: Any, **kwargs: Any) -> Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchvision / fake-tensor chatter
        warnings.simplefilter("error", flopscope.FlopscopeWarning)  # uncounted ops fail loudly
        return flopscope.count(model, *args, **kwargs)


def gmacs(report: Report) -> float:
    return round(report.macs / 1e9, 3)


def costs(report: Report) -> tuple[int, int, int, int]:
    return report.macs, report.flops, report.bytes_read, report.bytes_written


def assert_meta_matches(meta: Report, cpu: Report) -> None:
    """A meta-device count equals a CPU count in MACs and FLOPs, module by module; bytes agree
    within 0.1%. (Where Python assigns a number into a tensor, ``mask[i] = 3``, PyTorch's bindings
    write it with ``fill_`` on the CPU but ``scalar_tensor`` + ``copy_`` on meta: swin's attention
    masks.)"""
    arith = {p: (s.inclusive.macs, s.inclusive.flops) for p, s in meta.by_module().items()}
    assert arith == {p: (s.inclusive.macs, s.inclusive.flops) for p, s in cpu.by_module().items()}
    assert abs(meta.bytes_read - cpu.bytes_read) <= cpu.bytes_read // 1000
    assert abs(meta.bytes_written - cpu.bytes_written) <= cpu.bytes_written // 1000


def fcm_blind_macs(report: Report) -> int:
    """MACs of the operators torch's FlopCounterMode has no formula for."""
    known = {str(packet) for packet in FlopCounterMode(display=False).flop_registry}
    return sum(
        stats.cost.macs for op, stats in report.by_op().items() if op.rsplit(".", 1)[0] not in known
    )


def test_zoo_is_listed() -> None:
    assert len(ZOO) >= 80
    assert set(REAL_SUBSET) <= set(ZOO)
    assert set(FAMILY_REPRESENTATIVES) <= set(ZOO)


# -- every model, forward, on the meta device ---------------------------------------------------


@pytest.mark.parametrize("name", ZOO)
def test_published_macs_and_params_on_meta(name: str) -> None:
    _, published_gmacs, published_params = _weights_meta(name)
    model = build(name, "meta")
    with FlopCounterMode(display=False) as fcm:
        report = count(model, image(name))
    assert report.shape_only
    assert report.uncounted == {}
    assert gmacs(report) == published_gmacs, f"{name}: {report.macs} MACs"
    assert report.params == published_params
    # torch's FlopCounterMode agrees exactly wherever it has a formula; the one operator of the zoo
    # it had none for before torch 2.15 is the CPU flash-attention kernel of the ViTs (hence its
    # 16.85 GMAC for vit_b_16 there); 2.15 has one
    blind = fcm_blind_macs(report)
    assert blind == 0 or name.startswith("vit_")
    assert fcm.get_total_flops() == 2 * (report.macs - blind)


# -- backward: every operator counted -----------------------------------------------------------


def _check_backward(name: str, train: bool) -> None:
    """Forward + backward on meta: every operator counted, and FlopCounterMode's total explained.

    FlopCounterMode has no formula for the CPU flash-attention kernels (forward and backward), and it
    computes grad_weight of a convolution with ``groups`` > 1 as if every input
    channel met every output channel (``groups`` times the real product); flopscope counts the
    real product once. Everything else agrees exactly, so
    ``fcm_total == 2 * (macs + sum over grouped grad_weight of (groups - 1) * forward MACs)``.
    """
    extra = [0]

    def conv_backward(call: OpCall) -> Cost:
        cost = conv.convolution_backward(call)
        groups = int(named_arg(call, "groups", 1))
        if named_arg(call, "output_mask")[1] and groups > 1:
            grad_out, x, w = call.args[0], call.args[1], call.args[2]
            transposed = bool(named_arg(call, "transposed", False))
            extra[0] += (groups - 1) * conv.conv_macs(x.shape, w.shape, grad_out.shape, transposed)
        return cost

    model = build(name, "meta")
    # batch 2: some heads (inception's AuxLogits) batch-normalize a 1 x 1 map in training
    with FlopCounterMode(display=False) as fcm:
        report = count(model, image(name, batch=2), backward=True, train=train,
                       rules={"aten::convolution_backward": conv_backward})
    assert report.uncounted == {}
    assert report.total("backward").macs > 0
    assert not model.training  # the mode is restored
    assert fcm.get_total_flops() == 2 * (report.macs - fcm_blind_macs(report) + extra[0])


@pytest.mark.parametrize("name", FAMILY_REPRESENTATIVES)
def test_backward_fully_counted(name: str) -> None:
    _check_backward(name, train=True)


@slow
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", ZOO)
def test_backward_fully_counted_whole_zoo(name: str, train: bool) -> None:
    _check_backward(name, train)


# -- real CPU runs of the subset ----------------------------------------------------------------


@pytest.mark.parametrize("name", REAL_SUBSET)
def test_real_runs_match_published_and_shape_only(name: str) -> None:
    published_gmacs = _weights_meta(name)[1]
    torch.manual_seed(0)
    model = build(name)
    x = image(name)
    with torch.no_grad():
        real_no_grad = count(model, x)
        fake_no_grad = count(model, x, shape_only=True)
    real = count(model, x)
    fake = count(model, x, shape_only=True)
    meta = count(build(name, "meta"), x)
    for report in (real_no_grad, fake_no_grad, real, fake, meta):
        assert report.uncounted == {}
        assert gmacs(report) == published_gmacs
    # Shape-only runs on meta copies of the parameters (fake CPU tensors for a model with
    # nn.MultiheadAttention): the same integers as a model built on meta, and the real run's
    # arithmetic module by module (bytes within the meta tolerance, see assert_meta_matches).
    assert costs(fake) == costs(meta)
    assert_meta_matches(fake_no_grad, real_no_grad)
    assert_meta_matches(fake, real)
    # A meta model runs the autograd-enabled path: same as the real run with grad.
    assert_meta_matches(meta, real)
    # With or without grad the arithmetic is the same (bytes may differ: in-place ops, fused
    # kernels), also where no_grad takes a fused fast path.
    assert (real_no_grad.macs, real_no_grad.flops) == (real.macs, real.flops)


def test_vit_b_16_fused_fast_path_is_costed() -> None:
    """Under no_grad in eval, nn.MultiheadAttention runs the fused ``_native_multi_head_attention``
    (torch's FlopCounterMode then reports 16.85 GMAC); flopscope costs it: 17.564 GMAC."""
    model = build("vit_b_16")
    with torch.no_grad():
        report = count(model, image("vit_b_16"))
    ops = report.by_op()
    assert ops["aten._native_multi_head_attention.default"].calls == 12
    # 12 layers x (QKV 3*197*768^2 + QK^T and PV 2*12*197^2*64 + out 197*768^2) MACs
    per_layer = 3 * 197 * 768 * 768 + 2 * 12 * 197 * 197 * 64 + 197 * 768 * 768
    assert ops["aten._native_multi_head_attention.default"].cost.macs == 12 * per_layer
    assert report.macs == 17_563_828_224


def test_resnet50_forward_backward_equals_flop_counter_mode() -> None:
    """2 * MACs == FlopCounterMode's total on one real forward + backward (train mode)."""
    model = build("resnet50").train()
    x = image("resnet50")
    fcm = FlopCounterMode(display=False)
    with flopscope.Counter(model) as counter, fcm:
        model(x).sum().backward()
    report = counter.report
    assert report.uncounted == {}
    assert report.total("backward").macs > report.total("forward").macs
    assert 2 * report.macs == fcm.get_total_flops()


# -- every model with fake tensors on a real model (slow: builds every model on the CPU) ---------


@slow
@pytest.mark.parametrize("name", ZOO)
def test_shape_only_equals_meta_whole_zoo(name: str) -> None:
    _, published_gmacs, published_params = _weights_meta(name)
    fake = count(build(name), image(name), shape_only=True)
    meta = count(build(name, "meta"), image(name))
    assert fake.uncounted == {}
    assert gmacs(fake) == published_gmacs
    assert fake.params == published_params
    assert_meta_matches(meta, fake)
