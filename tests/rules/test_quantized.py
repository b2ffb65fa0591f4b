"""Quantized models (issue 12): ``quantized::`` operators, packed weights as parameters, the
quantized torchvision classifiers against their published ``_ops`` and ``num_params``.

Conventions under test (``flopscope.rules.quantized``): MACs are multiply-accumulates whatever
the data type; an operator from quantized tensors to quantized tensors counts 0 FLOPs; float
work where an operator meets float tensors (quantize 2, dequantize 2 per element; dynamic
quantization: 4 per input element, 1 per output element, 1 more for the bias) is FLOPs.

torchvision's ``quantize=True`` needs downloaded weights, so the models are quantized here the
way torchvision does it (``torchvision.models.quantization.utils.quantize_model``): build the
quantizable model, ``fuse_model()``, ``prepare`` with the backend's default qconfig, one
calibration forward, ``convert``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope.core.params import count_params

torchvision = pytest.importorskip("torchvision")
qmodels = torchvision.models.quantization

_RUN_SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))


def slow(fn: Any) -> Any:
    """Mark ``fn`` slow and skip it unless FLOPSCOPE_SLOW is set."""
    skip = pytest.mark.skipif(not _RUN_SLOW, reason="slow tier: set FLOPSCOPE_SLOW=1")
    return pytest.mark.slow(skip(fn))


def _quiet() -> Any:
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
    return ctx


def quantized_classifier(name: str, *, fuse: bool = True) -> tuple[nn.Module, torch.Tensor, Any]:
    """torchvision's quantized ``name`` (weights=None), quantized as ``quantize=True`` does; returns
    the model, an input at the weights' crop size, and the DEFAULT quantized weights."""
    weights = torchvision.models.get_model_weights(f"quantized_{name}").DEFAULT
    backend = weights.meta["backend"]
    size = weights.transforms.keywords["crop_size"]
    ctx = _quiet()
    try:
        torch.backends.quantized.engine = backend
        # googlenet's published num_params is the model without its auxiliary classifiers, as
        # torchvision builds it with weights; inception_v3's includes them (torchvision keeps
        # AuxLogits in the float model it counted); eval never runs them either way.
        kwargs = {"googlenet": {"aux_logits": False, "init_weights": False},
                  "inception_v3": {"init_weights": False}}.get(name, {})
        model = getattr(qmodels, name)(weights=None, quantize=False, **kwargs).eval()
        if fuse:
            model.fuse_model(is_qat=False)
        model.qconfig = torch.ao.quantization.get_default_qconfig(backend)
        torch.ao.quantization.prepare(model, inplace=True)
        torch.manual_seed(0)
        model(torch.randn(1, 3, size, size))
        torch.ao.quantization.convert(model, inplace=True)
    finally:
        ctx.__exit__(None, None, None)
    return model, torch.randn(1, 3, size, size), weights


def _count(model: nn.Module, *args: Any) -> flopscope.Report:
    ctx = _quiet()
    try:
        return flopscope.count(model, *args)
    finally:
        ctx.__exit__(None, None, None)


def _folded_bn_channels(name: str) -> int:
    """Channels of the batch norms that ``fuse_model()`` folds into a convolution: each loses its
    weight and bias (2 C) and gives its convolution a bias (C), C parameters fewer."""
    kwargs = {"googlenet": {"aux_logits": False, "init_weights": False},
              "inception_v3": {"init_weights": False}}.get(name, {})
    model = getattr(qmodels, name)(weights=None, quantize=False, **kwargs).eval()
    before = sum(p.numel() for p in model.parameters())
    ctx = _quiet()
    try:
        model.fuse_model(is_qat=False)
    finally:
        ctx.__exit__(None, None, None)
    return before - sum(p.numel() for p in model.parameters())


def test_quantized_resnet18_matches_published_ops() -> None:
    model, x, weights = quantized_classifier("resnet18")
    report = _count(model, x)
    # published _ops 1.814 (GFLOPS = MACs): the float resnet18's 1,814,073,344 MACs, conv and fc
    assert report.macs == 1_814_073_344
    assert round(report.macs / 1e9, 3) == weights.meta["_ops"] == 1.814
    assert report.uncounted == {}
    ops = report.by_op()
    # FLOPs: only the float edges. quantize the 3*224*224 = 150,528 input (2 each) = 301,056;
    # dequantize the 1,000 logits (2 each) = 2,000; everything between is integer work
    assert ops["aten.quantize_per_tensor.default"].cost.flops == 301_056
    assert ops["aten.dequantize.self"].cost.flops == 2_000
    for name, stats in ops.items():
        if name.startswith("quantized."):
            assert stats.cost.flops == 0, name
    assert ops["quantized.linear.default"].cost.macs == 512 * 1000
    # the fc's packed weight (1000*512 int8 = 512,000 B) and float bias (4,000 B) are read,
    # with its 512 quint8 inputs: 516,512 B
    assert ops["quantized.linear.default"].cost.bytes_read == 516_512
    # parameters: the packed conv/fc weights and biases. fuse_model() folds the 20 batch norms
    # (4,800 channels: 64 + 4*64 + 4*128+128 + 4*256+256 + 4*512+512) into conv biases, so the
    # quantized model has 11,689,512 - 4,800 = 11,684,712; torchvision's num_params (11,689,512)
    # is the float model's, before folding
    assert weights.meta["num_params"] == 11_689_512
    assert report.params == 11_684_712 == weights.meta["num_params"] - _folded_bn_channels(
        "resnet18")
    fc = report.by_module()["fc._packed_params"].params
    assert (fc.own, fc.frozen, fc.trainable) == (513_000, 513_000, 0)  # 1000*512 + 1000
    assert report.by_module()["fc"].params.inclusive == 513_000


def test_quantized_resnet18_without_fusion_matches_published_num_params() -> None:
    # without fuse_model() the batch norms stay (quantized::batch_norm2d, weight and bias as
    # parameters) and the convolutions keep no bias: exactly the float model's 11,689,512
    model, x, weights = quantized_classifier("resnet18", fuse=False)
    report = _count(model, x)
    assert report.params == weights.meta["num_params"] == 11_689_512
    assert report.macs == 1_814_073_344
    assert report.uncounted == {}
    assert report.by_op()["quantized.batch_norm2d.default"].calls == 20
    assert report.by_op()["quantized.batch_norm2d.default"].cost.flops == 0


QUANTIZED = ["googlenet", "inception_v3", "mobilenet_v2", "mobilenet_v3_large", "resnet18",
             "resnet50", "resnext101_32x8d", "resnext101_64x4d", "shufflenet_v2_x0_5",
             "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"]


@slow
@pytest.mark.parametrize("name", QUANTIZED)
def test_every_quantized_classifier(name: str) -> None:
    model, x, weights = quantized_classifier(name)
    report = _count(model, x)
    assert round(report.macs / 1e9, 3) == weights.meta["_ops"]
    assert report.uncounted == {}
    # published num_params are the float models' (before batch norms are folded)
    assert report.params == weights.meta["num_params"] - _folded_bn_channels(name)


def _dynamic(dtype: torch.dtype) -> tuple[nn.Module, flopscope.Report]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10, bias=False))
    ctx = _quiet()
    try:
        q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=dtype)
    finally:
        ctx.__exit__(None, None, None)
    return q, _count(q, torch.randn(4, 64))


def test_quantize_dynamic_linear_int8() -> None:
    _, report = _dynamic(torch.qint8)
    # params: 64*32 + 32 + 32*10 = 2,400, as the float model
    assert report.params == 2_400
    assert report.by_module()["0"].params.inclusive == 2_080
    assert report.uncounted == {}
    # MACs: 4*64*32 + 4*32*10 = 8,192 + 1,280 = 9,472
    assert report.macs == 9_472
    first = report.by_module()["0"].inclusive
    # first layer: 4 per input element (min, max, scale, round) on 4*64 = 256 -> 1,024; the
    # int32 accumulator scaled to float and the bias added on 4*32 = 128 outputs -> 256: 1,280
    assert first.flops == 1_280
    # bytes read: 256 float inputs (1,024 B) + int8 weight (2,048 B) + float bias (128 B)
    assert first.bytes_read == 3_200
    second = report.by_module()["2"].inclusive
    # second layer (no bias): 4*128 = 512 + 40 outputs scaled = 552
    assert second.flops == 552
    # total: 1,280 + 128 (ReLU on 128 floats) + 552
    assert report.flops == 1_960


def test_quantize_dynamic_linear_float16() -> None:
    _, report = _dynamic(torch.float16)
    assert report.params == 2_400
    assert report.macs == 9_472
    # float GEMMs: 2 * 9,472 + 128 bias adds (first layer) + 128 ReLU = 19,200
    assert report.flops == 19_200
    # the first layer's float16 weight is 2,048 * 2 B, bias 128 B, input 1,024 B: 5,248 B
    assert report.by_module()["0"].inclusive.bytes_read == 5_248


def test_quantized_conv1d_transpose_and_embeddings() -> None:
    import torch.ao.nn.quantized as nnq

    ctx = _quiet()
    try:
        torch.backends.quantized.engine = "fbgemm"
        conv1d = nnq.Conv1d(4, 6, 3)
        convt = nnq.ConvTranspose2d(4, 6, 3, stride=2)
        emb = nnq.Embedding(10, 8)
        bag = nnq.EmbeddingBag(10, 8, mode="sum")
        x1 = torch.quantize_per_tensor(torch.randn(2, 4, 10), 0.1, 0, torch.quint8)
        x2 = torch.quantize_per_tensor(torch.randn(1, 4, 5, 5), 0.1, 0, torch.quint8)
    finally:
        ctx.__exit__(None, None, None)
    r = _count(conv1d, x1)
    # weight 6*4*3 = 72 + bias 6 = 78 parameters; output 2 x 6 x 8: 96 outputs * 4*3 = 1,152 MACs
    assert (r.params, r.macs, r.flops) == (78, 1_152, 0)
    r = _count(convt, x2)
    # transposed: every one of the 4*5*5 = 100 inputs is scattered into 6*3*3 = 54 outputs:
    # 5,400 MACs; weight 4*6*3*3 = 216 + bias 6
    assert (r.params, r.macs, r.flops) == (222, 5_400, 0)
    idx = torch.tensor([1, 2, 4, 5, 4, 3])
    r = _count(emb, idx)
    # 10*8 table; 6 rows gathered and dequantized: 6*8 * 2 = 96 FLOPs
    assert (r.params, r.macs, r.flops) == (80, 0, 96)
    r = _count(bag, idx, torch.tensor([0, 2]))
    # 2 bags; 48 gathered elements, dequantize (2) and sum (1) each: 144 FLOPs
    assert (r.params, r.flops) == (80, 144)
    assert r.uncounted == {}


def test_shared_packed_weights_count_once() -> None:
    import torch.ao.nn.quantized as nnq

    ctx = _quiet()
    try:
        torch.backends.quantized.engine = "fbgemm"
        conv = nnq.Conv2d(3, 4, 1)
        tied = nnq.Conv2d(3, 4, 1)
    finally:
        ctx.__exit__(None, None, None)
    tied._packed_params = conv._packed_params  # two modules, one packed object
    # 3*4 weights + 4 biases = 16, counted once, owned by the first module
    stats = count_params(nn.Sequential(conv, tied))
    assert (stats[""].inclusive, stats["0"].own, stats["1"].own) == (16, 16, 0)
    # one module under two paths: 16 once
    assert count_params(nn.Sequential(conv, conv))[""].inclusive == 16
    # a conv with its own packed object: 16 more
    assert count_params(nn.Sequential(conv, nnq.Conv2d(3, 4, 1)))[""].inclusive == 32


def test_quantized_rule_directly_on_ops() -> None:
    ctx = _quiet()
    try:
        torch.backends.quantized.engine = "fbgemm"
        a = torch.quantize_per_tensor(torch.randn(2, 3, 4), 0.1, 0, torch.quint8)
        b = torch.quantize_per_tensor(torch.randn(2, 4, 5), 0.1, 0, torch.quint8)
    finally:
        ctx.__exit__(None, None, None)

    class MatMul(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.ops.quantized.matmul(x, y, 0.1, 0)

    r = _count(MatMul(), a, b)
    # 2 batches of (3x4) @ (4x5): 2*3*5*4 = 120 integer MACs, 0 FLOPs
    assert (r.macs, r.flops) == (120, 0)


# --- recurrent layers: quantize_dynamic on nn.LSTM / GRU / LSTMCell / GRUCell / RNNCell ---------
# The quantized step is the float step with its two products done by a quantized linear kernel.
# Per (step, batch row), layer and direction, with I inputs, H hidden units and G gates, int8
# weights add to the float model's element-wise FLOPs, instead of the products' 2 FLOPs per MAC:
# 4 per input element of each product (choose qparams: min, max; quantize: scale, round), 4*(I+H),
# and the int32 accumulators' scale to float, 2*G*H (the bias adds are in both counts). float16
# weights run float GEMMs: exactly the float model's FLOPs.

def _recurrent(kind: str) -> tuple[nn.Module, torch.Tensor, list[tuple[int, int, int]]]:
    """A float recurrent model, its input, and (rows, I, G*H) for every layer and direction."""
    torch.manual_seed(0)
    if kind == "lstm":  # 2 layers, 5 steps x batch 3 = 15 rows; layer 1 reads layer 0's H = 32
        return nn.LSTM(16, 32, num_layers=2), torch.randn(5, 3, 16), [(15, 16, 128), (15, 32, 128)]
    if kind == "lstm_bidirectional":  # batch first; layer 1 reads both directions: 2H = 64
        return (nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True),
                torch.randn(3, 5, 16), [(15, 16, 128)] * 2 + [(15, 64, 128)] * 2)
    if kind == "gru":
        return nn.GRU(16, 32), torch.randn(5, 3, 16), [(15, 16, 96)]
    cells: dict[str, tuple[nn.Module, int]] = {
        "lstm_cell": (nn.LSTMCell(16, 32), 128), "gru_cell": (nn.GRUCell(16, 32), 96),
        "rnn_tanh_cell": (nn.RNNCell(16, 32), 32),
        "rnn_relu_cell": (nn.RNNCell(16, 32, nonlinearity="relu"), 32)}
    cell, gates = cells[kind]
    return cell, torch.randn(3, 16), [(3, 16, gates)]


RECURRENT = ["lstm", "lstm_bidirectional", "gru", "lstm_cell", "gru_cell", "rnn_tanh_cell",
             "rnn_relu_cell"]


@pytest.mark.parametrize("kind", RECURRENT)
def test_quantize_dynamic_recurrent_against_float(kind: str) -> None:
    model, x, layers = _recurrent(kind)
    float_report = _count(model.eval(), x)
    ctx = _quiet()
    try:
        int8 = torch.ao.quantization.quantize_dynamic(nn.Sequential(model), {type(model)})
        fp16 = torch.ao.quantization.quantize_dynamic(nn.Sequential(model), {type(model)},
                                                      dtype=torch.float16)
    finally:
        ctx.__exit__(None, None, None)
    r8, r16 = _count(int8, x), _count(fp16, x)
    assert r8.uncounted == r16.uncounted == float_report.uncounted == {}
    assert r8.macs == r16.macs == float_report.macs
    hidden = 32
    assert float_report.macs == sum(rows * gh * (i + hidden) for rows, i, gh in layers)
    assert r16.flops == float_report.flops
    extra = sum(rows * (4 * (i + hidden) + 2 * gh) for rows, i, gh in layers)
    assert r8.flops == float_report.flops - 2 * float_report.macs + extra


def test_quantize_dynamic_lstm_exact() -> None:
    model, x, _ = _recurrent("lstm")
    ctx = _quiet()
    try:
        q = torch.ao.quantization.quantize_dynamic(nn.Sequential(model), {nn.LSTM})
    finally:
        ctx.__exit__(None, None, None)
    report = _count(q, x)
    assert "aten.quantized_lstm.input" in report.by_op()
    # MACs: 15 rows x 4*32 gates x (16 + 32) = 92,160 (layer 0) + 15 x 128 x (32 + 32) = 122,880
    assert report.macs == 215_040
    # FLOPs per row: layer 0: quantize x and h, 4*(16 + 32) = 192; scale and bias on 2 x 128
    # gate outputs, 512; the cell, 22*32 = 704: 1,408; layer 1: 4*64 + 512 + 704 = 1,472;
    # 15 * (1,408 + 1,472) = 43,200
    assert report.flops == 43_200
    cost = report.by_op()["aten.quantized_lstm.input"].cost
    # bytes read: the input 5*3*16 floats (960 B), h0 and c0 (2 x 2*3*32 floats, 1,536 B), int8
    # weights 128*16 + 128*32 + 2 * 128*32 = 14,336 B, four float biases of 128 (2,048 B)
    assert cost.bytes_read == 960 + 1_536 + 14_336 + 2_048


def test_quantize_dynamic_lstm_packed_sequence() -> None:
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32)
    ctx = _quiet()
    try:
        q = torch.ao.quantization.quantize_dynamic(nn.Sequential(lstm), {nn.LSTM})[0]
    finally:
        ctx.__exit__(None, None, None)
    packed = pack_padded_sequence(torch.randn(5, 3, 16), torch.tensor([5, 3, 2]))

    class Packed(nn.Module):
        def forward(self, data: torch.Tensor, batch_sizes: torch.Tensor) -> torch.Tensor:
            return q(PackedSequence(data, batch_sizes))[0].data

    report = _count(Packed(), packed.data, packed.batch_sizes)
    assert "aten.quantized_lstm.data" in report.by_op()
    # 5 + 3 + 2 = 10 rows (not 5*3 = 15): 10 * 128 * (16 + 32) = 61,440 MACs; per row
    # 4*48 (quantize x, h) + 4*128 (scale and bias of both products) + 22*32 (the cell) = 1,408
    # FLOPs: 14,080
    assert (report.macs, report.flops) == (61_440, 14_080)
    assert report.uncounted == {}


def test_legacy_fbgemm_linear_layers() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 16), torch.randn(32, 16), torch.randn(32)
    qw, col_offsets, scale, zero_point = torch.fbgemm_linear_quantize_weight(w)
    packed = torch.fbgemm_pack_quantized_matrix(qw)
    packed16 = torch.fbgemm_pack_gemm_matrix_fp16(w)

    def legacy() -> None:
        torch.fbgemm_linear_int8_weight_fp32_activation(x, qw, packed, col_offsets, scale,
                                                        zero_point, b)
        torch.fbgemm_linear_fp16_weight_fp32_activation(x, packed16, b)

    # composite operators whose kernels call FBGEMM directly: they reach the counter as
    # themselves under inference_mode and are costed by their rules, not as the allocation that
    # is all their "decomposition" dispatches
    with torch.inference_mode(), flopscope.Counter(warn=False) as counter:
        legacy()
    ops = counter.report.by_op()
    int8 = ops["aten.fbgemm_linear_int8_weight_fp32_activation.default"].cost
    # 6 x 16 @ 16 x 32: 3,072 MACs; float: 4 per input element (384) and scale + bias per output
    # element (2 * 192 = 384): 768
    assert (int8.macs, int8.flops) == (3_072, 768)
    fp16 = ops["aten.fbgemm_linear_fp16_weight_fp32_activation.default"].cost
    # float GEMM: 2 * 3,072 + 192 bias adds = 6,336
    assert (fp16.macs, fp16.flops) == (3_072, 6_336)
    assert counter.report.uncounted == {}
