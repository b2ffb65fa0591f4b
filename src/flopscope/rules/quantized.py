"""Quantized operators (``quantized::`` and ATen's quantize/dequantize): eager-mode static and
dynamic quantization (``torch.ao.quantization``), the quantized torchvision classifiers.

Conventions. **MACs** are multiply-accumulates whatever the data type: an int8 convolution or
linear layer does the same sums of products as the float one, so a quantized model has its float
model's MACs (torchvision publishes the same ``_ops`` for both). **FLOPs** are floating-point
operations only: an operator that takes and returns quantized tensors is integer work and counts
0 FLOPs, whatever a particular backend does inside (fbgemm/x86 requantize the int32 accumulator
with a float multiply and compute some activations on dequantized values in float vector
registers; qnnpack uses fixed-point arithmetic and lookup tables): the model's quantized
arithmetic is integer arithmetic by definition, and the count does not depend on the backend.
Where an operator meets float tensors, that float arithmetic is FLOPs: quantizing a float tensor
(``x * (1/scale)`` and a round: 2 per element; the zero-point add and the clamp are on the
integer), dequantizing one (``(q - zero_point) * scale``: 2 per element), choosing dynamic
quantization parameters (a min and a max pass: 2 per element), and dynamic quantization's float
epilogue (the int32 accumulator times ``input_scale * weight_scale``: 1 per output element, the
float bias add: 1 more). **Bytes**: inputs and outputs as usual, plus the packed weight and bias
(read from the packed-parameter object, which is not a tensor argument).
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.conv import conv_macs
from flopscope.rules.misc import CELL_FLOPS
from flopscope.rules.registry import rule

# These rules state integer and float work themselves (read by the counter's number-kind
# adjustment: it leaves them as they are).
COUNTS_REAL_NUMBERS = True


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size()) if isinstance(t, torch.Tensor) else 0


def packed(call: OpCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (weight, bias) of the packed-parameter object among ``call``'s arguments (a
    ``ScriptObject`` such as ``Conv2dPackedParamsBase``/``LinearPackedParamsBase``), by its
    ``unpack()`` method. Raises ``ValueError`` when there is none."""
    for a in call.args:
        if isinstance(a, torch.ScriptObject) and a._has_method("unpack"):  # type: ignore[attr-defined]
            obj: Any = a
            weight, bias = obj.unpack()
            return weight, bias
    raise ValueError(f"{call.name}: no packed parameters among the arguments")


def _with_weights(call: OpCall, macs: int, flops: int, weight: Any, bias: Any) -> Cost:
    read, written = call.io_bytes()
    return Cost(macs, flops, read + _nbytes(weight) + _nbytes(bias), written)


_CONV_STATIC = ["quantized::conv1d", "quantized::conv2d", "quantized::conv3d",
                "quantized::conv1d_relu", "quantized::conv2d_relu", "quantized::conv3d_relu",
                "quantized::conv2d_add", "quantized::conv2d_add_relu",
                "quantized::conv_transpose1d", "quantized::conv_transpose2d",
                "quantized::conv_transpose3d"]
_CONV_DYNAMIC = ["quantized::conv1d_dynamic", "quantized::conv2d_dynamic",
                 "quantized::conv3d_dynamic", "quantized::conv_transpose1d_dynamic",
                 "quantized::conv_transpose2d_dynamic", "quantized::conv_transpose3d_dynamic"]


def _conv(call: OpCall) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    weight, bias = packed(call)
    x = call.args[0]
    transposed = "transpose" in call.op._schema.name
    if weight.dim() == x.dim() - 1:  # conv1d packs its weight as a 2d one with a unit height
        weight = weight.unsqueeze(-2)
    x_shape = tuple(x.shape) if weight.dim() == x.dim() else (*x.shape[:2], 1, *x.shape[2:])
    out = call.output
    out_shape = tuple(out.shape) if weight.dim() == out.dim() else \
        (*out.shape[:2], 1, *out.shape[2:])
    return conv_macs(x_shape, tuple(weight.shape), out_shape, transposed), weight, bias


@rule(*_CONV_STATIC)
def quantized_conv(call: OpCall) -> Cost:
    """Static quantized convolution (int8 activations and weights, int32 accumulation): the float
    convolution's MACs (``conv_macs`` with the unpacked weight's shape: N * out_spatial * C_out *
    C_in/groups * prod(k)), 0 FLOPs (integer kernel; the fused bias, ReLU and ``conv2d_add``
    accumulate are part of its requantization). Bytes: input, output, packed weight and bias."""
    macs, weight, bias = _conv(call)
    return _with_weights(call, macs, 0, weight, bias)


@rule(*_CONV_DYNAMIC)
def quantized_conv_dynamic(call: OpCall) -> Cost:
    """Dynamically quantized convolution (float input and output): the convolution's MACs
    (integer), and in float: choose the input's quantization parameters (min and max: 2 per input
    element), quantize the input (2 per input element), scale the int32 result back (1 per output
    element), add the bias (1 per output element when there is one)."""
    macs, weight, bias = _conv(call)
    out = call.out_numel()
    flops = 4 * call.args[0].numel() + out + (out if bias is not None else 0)
    return _with_weights(call, macs, flops, weight, bias)


def _linear_macs(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Y[m, n] = sum_k X[m, k] W[n, k]: M*K*N MACs, M = every leading dimension of X."""
    return int(x.numel()) * int(weight.shape[0])


@rule("quantized::linear", "quantized::linear_relu", "quantized::linear_leaky_relu",
      "quantized::linear_tanh")
def quantized_linear(call: OpCall) -> Cost:
    """Static quantized linear layer: Y = X W^T (+ b), M*K*N MACs (integer), 0 FLOPs (the bias
    and the fused activation are part of the integer kernel's requantization). Bytes: input,
    output, packed weight and bias."""
    weight, bias = packed(call)
    return _with_weights(call, _linear_macs(call.args[0], weight), 0, weight, bias)


@rule("quantized::linear_dynamic", "quantized::linear_relu_dynamic")
def quantized_linear_dynamic(call: OpCall) -> Cost:
    """Dynamically quantized linear layer (``quantize_dynamic``: float X, int8 W, float Y):
    M*K*N integer MACs; float work: choose X's quantization parameters (min and max: 2 per input
    element), quantize X (2 per input element), scale the int32 accumulator to float (1 per
    output element), add the float bias (1 per output element with a bias), the fused ReLU (1 per
    output element)."""
    weight, bias = packed(call)
    x, out = call.args[0], call.out_numel()
    relu = "relu" in call.op._schema.name
    flops = 4 * x.numel() + out * (1 + int(bias is not None) + int(relu))
    return _with_weights(call, _linear_macs(x, weight), flops, weight, bias)


@rule("quantized::linear_with_input_q_dq_qweight_dq_output_fp32",
      "quantized::linear_with_input_q_dq_qweight_dq_relu_output_fp32")
def quantized_linear_qdq(call: OpCall) -> Cost:
    """Linear layer with a float input quantized by given parameters and a float output: M*K*N
    integer MACs; float work: quantize X (2 per input element), scale the accumulator (1 per output
    element), bias (1 per output element with one), fused ReLU (1 per output element)."""
    weight, bias = packed(call)
    x, out = call.args[0], call.out_numel()
    relu = "relu" in call.op._schema.name
    flops = 2 * x.numel() + out * (1 + int(bias is not None) + int(relu))
    return _with_weights(call, _linear_macs(x, weight), flops, weight, bias)


@rule("quantized::linear_dynamic_fp16", "quantized::linear_relu_dynamic_fp16",
      "quantized::linear_dynamic_fp16_unpacked_weight")
def quantized_linear_fp16(call: OpCall) -> Cost:
    """Linear layer with float16 weights and float32 activations (``quantize_dynamic`` with
    ``dtype=torch.float16``): a float GEMM, M*K*N MACs and 2*M*K*N FLOPs, + 1 per output element
    for the bias and 1 for a fused ReLU. Bytes: the packed weight at 2 bytes per element."""
    if named_arg(call, "weight") is not None:
        weight, bias = call.args[1], named_arg(call, "bias")
    else:
        weight, bias = packed(call)
    x, out = call.args[0], call.out_numel()
    macs = _linear_macs(x, weight)
    relu = "relu" in call.op._schema.name
    flops = 2 * macs + out * (int(bias is not None) + int(relu))
    if named_arg(call, "weight") is not None:
        return call.cost(macs=macs, flops=flops)
    read, written = call.io_bytes()  # the pack holds float16 weights (unpacked as float32)
    return Cost(macs, flops, read + 2 * int(weight.numel()) + _nbytes(bias), written)


@rule("quantized::matmul")
def quantized_matmul(call: OpCall) -> Cost:
    """Quantized (batched) matrix product C = A B: one MAC per (batch, m, n, k) (integer),
    0 FLOPs."""
    k = int(call.args[0].shape[-1])
    return call.cost(macs=call.out_numel() * k, flops=0)


@rule("quantized::int4mm_packed_weight_cpu")
def int4mm(call: OpCall) -> Cost:
    """Float activations times int4 weights (group-wise scales and zeros, dequantized in float
    inside the kernel): a float GEMM, M*K*N MACs, 2*M*K*N FLOPs."""
    x = call.args[0]
    k = int(x.shape[-1])
    return call.cost(macs=call.out_numel() * k)


@rule("quantized::add", "quantized::add_relu", "quantized::add_out", "quantized::add_relu_out",
      "quantized::add_scalar", "quantized::add_scalar_relu", "quantized::add_scalar_out",
      "quantized::add_scalar_relu_out", "quantized::mul", "quantized::mul_relu",
      "quantized::mul_out", "quantized::mul_relu_out", "quantized::mul_scalar",
      "quantized::mul_scalar_relu", "quantized::mul_scalar_out", "quantized::mul_scalar_relu_out",
      "quantized::hardswish", "quantized::relu6", "quantized::sigmoid", "quantized::elu",
      "quantized::celu", "quantized::leaky_relu", "quantized::threshold", "quantized::clamp",
      "quantized::prelu", "quantized::dropout", "quantized::softmax",
      "quantized::batch_norm", "quantized::batch_norm1d", "quantized::batch_norm2d",
      "quantized::batch_norm3d", "quantized::batch_norm_relu", "quantized::batch_norm1d_relu",
      "quantized::batch_norm2d_relu", "quantized::batch_norm3d_relu", "quantized::layer_norm",
      "quantized::group_norm", "quantized::instance_norm", "aten::quantized_batch_norm",
      "quantized::cat", "quantized::cat_relu", "quantized::cat_out", "quantized::cat_relu_out",
      "quantized::max_pool1d", "quantized::max_pool2d", "aten::quantized_max_pool1d",
      "aten::quantized_max_pool2d", "aten::quantized_max_pool3d")
def quantized_integer(call: OpCall) -> Cost:
    """Operators from quantized tensors to quantized tensors that are not sums of products:
    element-wise arithmetic (add, mul, their ReLU and scalar forms), activations, normalization,
    softmax, concatenation, max pooling. Integer work: 0 MACs, 0 FLOPs (whatever a backend does
    inside, see the family's convention); bytes of the inputs and outputs."""
    return call.cost(flops=0)


@rule("aten::quantize_per_tensor", "aten::quantize_per_channel")
def quantize(call: OpCall) -> Cost:
    """Quantize a float tensor with given parameters: q = clamp(round(x * (1/scale)) + zp):
    2 FLOPs per element (the multiply and the round; the zero-point add and the clamp are on the
    integer). A list of tensors (``quantize_per_tensor.tensors``) counts each."""
    n = sum(int(t.numel()) for t in call.outputs)
    return call.cost(flops=2 * n)


@rule("aten::quantize_per_tensor_dynamic")
def quantize_dynamic(call: OpCall) -> Cost:
    """Quantize a float tensor with parameters chosen from it: a min and a max pass (2 per
    element), then quantize (2 per element): 4 FLOPs per element."""
    return call.cost(flops=4 * call.args[0].numel())


@rule("aten::_choose_qparams_per_tensor", "aten::choose_qparams_optimized")
def choose_qparams(call: OpCall) -> Cost:
    """Quantization parameters of a float tensor: its min and max, 2 FLOPs per element (the
    scale and zero point from them are a handful of scalar operations, not counted).
    ``choose_qparams_optimized`` searches ``n_bins`` ranges; it is counted as the same single
    min/max pass (a lower bound)."""
    return call.cost(flops=2 * call.args[0].numel())


@rule("aten::dequantize")
def dequantize(call: OpCall) -> Cost:
    """Dequantize: x = (q - zero_point) * scale, 2 FLOPs per element (a float subtract and a
    multiply, or one fused multiply-add). A list of tensors counts each."""
    n = sum(int(t.numel()) for t in call.outputs)
    return call.cost(flops=2 * n)


@rule("aten::q_scale", "aten::q_zero_point", "aten::q_per_channel_scales",
      "aten::q_per_channel_zero_points", "aten::q_per_channel_axis", "aten::qscheme",
      "aten::int_repr", "aten::_make_per_tensor_quantized_tensor",
      "aten::_make_per_channel_quantized_tensor", "aten::_empty_affine_quantized",
      "aten::_empty_per_channel_affine_quantized", "aten::empty_quantized",
      "quantized::conv_prepack", "quantized::conv1d_prepack", "quantized::conv2d_prepack",
      "quantized::conv3d_prepack", "quantized::conv_transpose1d_prepack",
      "quantized::conv_transpose2d_prepack", "quantized::conv_transpose3d_prepack",
      "quantized::conv_unpack", "quantized::conv1d_unpack", "quantized::conv2d_unpack",
      "quantized::conv3d_unpack", "quantized::conv_transpose1d_unpack",
      "quantized::conv_transpose2d_unpack", "quantized::conv_transpose3d_unpack",
      "quantized::conv2d_unpack_sizes", "quantized::linear_prepack",
      "quantized::linear_prepack_legacy", "quantized::linear_prepack_fp16",
      "quantized::linear_prepack_fp16_legacy", "quantized::linear_unpack",
      "quantized::linear_unpack_fp16", "quantized::embedding_bag_prepack",
      "quantized::embedding_bag_unpack")
def quantized_bookkeeping(call: OpCall) -> Cost:
    """Quantization bookkeeping: reading scales and zero points, the integer representation,
    wrapping integers as a quantized tensor, packing an already quantized (or float16) weight
    for a kernel and unpacking it: no arithmetic, 0 FLOPs; bytes of the tensor inputs and
    outputs."""
    return call.cost(flops=0)


_EMBEDDING_BAG = ["quantized::embedding_bag_byte", "quantized::embedding_bag_4bit",
                  "quantized::embedding_bag_byte_rowwise_offsets",
                  "quantized::embedding_bag_4bit_rowwise_offsets",
                  "quantized::embedding_bag_2bit_rowwise_offsets"]


@rule("quantized::embedding_byte", "quantized::embedding_4bit", *_EMBEDDING_BAG)
def quantized_embedding(call: OpCall) -> Cost:
    """Quantized embedding lookup (row-wise int8/int4/int2 table, float output): every gathered
    element is dequantized (q * scale + bias: 2 FLOPs); a bag also reduces (sum/mean: 1 add, max:
    1 compare per gathered element; per-sample weights 1 multiply more; mean 1 divide per output
    element). Bytes read: the indices (and offsets) and the gathered rows only, one output-row's
    worth of table bytes per index (the table's row bytes are its packed row: data, scale and
    bias)."""
    table, idx = call.args[0], call.args[1]
    name = call.op._schema.name
    out = call.output
    dim = int(out.shape[-1])
    rows = int(idx.numel())
    gathered = rows * dim
    flops = 2 * gathered
    if "bag" in name:
        flops += gathered * (1 + int(named_arg(call, "per_sample_weights") is not None))
        if named_arg(call, "mode", 0) == 1:
            flops += int(out.numel())
    if isinstance(table, torch.Tensor):  # fused rows: [rows, packed data + scale and bias]
        row_bytes = int(table.shape[-1]) * int(table.element_size())
    else:
        weight = table.unpack()
        row_bytes = int(weight.numel() // max(1, int(weight.shape[0]))) * \
            int(weight.element_size())
    offsets = named_arg(call, "offsets")
    read = rows * row_bytes + _nbytes(idx) + _nbytes(offsets) + \
        _nbytes(named_arg(call, "per_sample_weights"))
    return Cost(0, flops, read, _nbytes(out))


@rule("quantized::embedding_bag_byte_prepack", "quantized::embedding_bag_4bit_prepack",
      "quantized::embedding_bag_2bit_prepack",
      "quantized::embedding_bag_byte_prepack_with_rowwise_min_max",
      "quantized::embedding_bag_4bit_prepack_with_rowwise_min_max",
      "quantized::embedding_bag_2bit_prepack_with_rowwise_min_max")
def embedding_prepack(call: OpCall) -> Cost:
    """Row-wise quantization of a float embedding table: each row's min and max (2 per element;
    given instead in the ``with_rowwise_min_max`` forms, 0), then quantize (2 per element)."""
    weight = call.args[0]
    per = 2 if "min_max" in call.op._schema.name else 4
    return call.cost(flops=per * int(prod(weight.shape)))


@rule("quantized::embedding_bag_byte_unpack", "quantized::embedding_bag_4bit_unpack",
      "quantized::embedding_bag_2bit_unpack")
def embedding_unpack(call: OpCall) -> Cost:
    """Dequantize a row-wise quantized table to float: q * scale + bias, 2 FLOPs per element."""
    return call.cost(flops=2 * call.out_numel())


# --- Recurrent layers and cells (``quantize_dynamic`` on nn.LSTM/GRU/LSTMCell/GRUCell/RNNCell) --
#
# A quantized recurrent step is the float step (``flopscope.rules.misc.CELL_FLOPS``) with its two
# products x W_ih^T + b_ih and h W_hh^T + b_hh done by a dynamically quantized (int8) or
# float16-weight linear kernel (aten/src/ATen/native/RNN.cpp: ``QuantizedCellParamsDynamic``,
# ``QuantizedCellParamsFP16`` and the legacy ``QuantizedCellParams``; the bias is in the pack and
# is added by the linear kernel). Per (step, batch row) and layer direction, with I inputs, H
# hidden units and G gates (LSTM 4, GRU 3, RNN 1):
#   MACs = G*H*(I + H), as the float layer;
#   int8 weights: each product is ``quantized::linear_dynamic`` -- choose the input's
#     quantization parameters and quantize it (4 per input element: 4*I and 4*H), scale the int32
#     accumulator (G*H each) and add the bias (G*H each): 4*(I + H) + 4*G*H float FLOPs;
#   float16 weights: float GEMMs, 2*MACs + the bias adds (2*G*H);
#   plus the cell's element-wise FLOPs, CELL_FLOPS * H.
# So int8 FLOPs = the float model's FLOPs - 2*MACs + 4*(I + H) + 2*G*H per row, and float16 FLOPs
# equal the float model's.


def cell_params(obj: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                    torch.Tensor | None]:
    """``(w_ih, w_hh, b_ih, b_hh)`` of a quantized recurrent layer's parameters, a
    ``torch.classes.rnn.CellParamsBase`` script object (one per layer and direction, read through
    its pickled state: ``(kind, tensors, doubles, longs, packed linear params)``). The weights are
    int8 (a quantized tensor, or plain ``int8`` for the legacy ``"quantized"`` kind) or, for the
    ``"quantized_fp16"`` kind, float (their float16 values, unpacked as float32).

    Raises:
        ValueError: ``obj`` is not a recurrent cell's parameters.
    """
    try:
        state = obj.__getstate__()
    except (AttributeError, RuntimeError) as e:
        raise ValueError(f"not recurrent cell parameters: {type(obj).__name__}") from e
    if len(state) == 2 and isinstance(state[1], str):  # (state, class name) from the pickler
        state = state[0]
    _, tensors, _, _, packs = state
    if len(packs) == 2:  # "quantized_dynamic", "quantized_fp16": weight and bias in each pack
        (w_ih, b_ih), (w_hh, b_hh) = (p.unpack() for p in packs)
        return w_ih, w_hh, b_ih, b_hh
    if len(tensors) >= 4:  # legacy "quantized": int8 weights, float biases, column offsets
        return tensors[0], tensors[1], tensors[2], tensors[3]
    raise ValueError(f"recurrent cell parameters of an unknown layout: {state[0]!r}")


def _int8(weight: torch.Tensor) -> bool:
    return bool(weight.is_quantized) or weight.dtype == torch.int8


def _weight_bytes(weight: torch.Tensor) -> int:
    """Bytes of a recurrent weight as its kernel reads it: 1 per int8 element, 2 per float16
    element (a float16 pack unpacks as float32)."""
    return int(weight.numel()) * (1 if _int8(weight) else 2)


def _rnn_linear(rows: int, weight: torch.Tensor, bias: Any) -> tuple[int, int]:
    """(MACs, FLOPs) of ``rows`` rows times a recurrent weight [G*H, K] plus bias: rows*G*H*K
    MACs; int8: 4 per input element (choose qparams, quantize) and 1 per output (scale) + 1 per
    output with a bias; float16 weights: 2 per MAC + 1 per output with a bias."""
    out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
    macs = rows * out_features * in_features
    biased = int(isinstance(bias, torch.Tensor))
    if _int8(weight):
        return macs, 4 * rows * in_features + rows * out_features * (1 + biased)
    return macs, 2 * macs + rows * out_features * biased


def _rnn_kind(call: OpCall) -> str:
    name = call.op._schema.name.split("::")[1]
    for kind in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        if kind in name:
            return kind
    raise ValueError(f"{call.name}: not a recurrent operator")


def _rnn_cost(call: OpCall, rows: int, weights: list[tuple[Any, Any, Any, Any]]) -> Cost:
    """Cost of ``rows`` rows through every (w_ih, w_hh, b_ih, b_hh) of ``weights``."""
    kind = _rnn_kind(call)
    macs = flops = extra = 0
    for w_ih, w_hh, b_ih, b_hh in weights:
        hidden = int(w_hh.shape[1])
        for weight, bias in ((w_ih, b_ih), (w_hh, b_hh)):
            m, f = _rnn_linear(rows, weight, bias)
            macs, flops = macs + m, flops + f
            extra += _weight_bytes(weight) + _nbytes(bias)
        flops += CELL_FLOPS[kind] * rows * hidden
    read, written = call.io_bytes()
    return Cost(macs, flops, read + extra, written)


@rule("aten::quantized_lstm.input", "aten::quantized_lstm.data", "aten::quantized_gru.input",
      "aten::quantized_gru.data")
def quantized_rnn(call: OpCall) -> Cost:
    """A dynamically quantized (int8 or float16 weights) multi-layer LSTM/GRU over a sequence
    (``torch.ao.nn.quantized.dynamic.LSTM``/``GRU``). For every layer and direction, every
    (step, batch row) -- T*B rows of a [T, B, I] input, the packed sequence's rows for ``.data``
    -- with G gates (LSTM 4, GRU 3), H hidden units and I_l inputs to the layer: the two products
    x W_ih^T + b_ih and h W_hh^T + b_hh, G*H*(I_l + H) MACs as in the float layer; their float
    work: int8 weights, quantize x and h (4 per element: min, max, scale, round) and scale and
    bias each product's G*H outputs: 4*(I_l + H) + 4*G*H; float16 weights, float GEMMs: 2 per
    MAC + 2*G*H bias adds; then the cell's element-wise FLOPs per hidden unit (LSTM 22: the
    gates' sum 4, 3 sigmoids 12, 2 tanh, 3 multiplies, 1 add; GRU 16). So float16 counts exactly
    as the float model, and int8 as the float model minus 2 per MAC plus 4*(I_l + H) + 2*G*H per
    row. Bytes: inputs, outputs, the int8 (1 B) or float16 (2 B) weights and the float biases,
    each read once."""
    x = call.args[0]
    rows = int(x.shape[0]) if call.op._overloadname == "data" else \
        int(x.numel()) // max(1, int(x.shape[-1]))
    params = named_arg(call, "params")
    return _rnn_cost(call, rows, [cell_params(p) for p in params])


@rule("quantized::quantized_lstm_cell_dynamic", "quantized::quantized_gru_cell_dynamic",
      "quantized::quantized_rnn_relu_cell_dynamic", "quantized::quantized_rnn_tanh_cell_dynamic")
def quantized_rnn_cell_dynamic(call: OpCall) -> Cost:
    """One step of a dynamically quantized LSTMCell/GRUCell/RNNCell (int8 or float16 packed
    weights; the packed biases are the ones added): B rows, each costed as a row of
    ``aten::quantized_lstm`` (G*H*(I + H) MACs; int8: 4*(I + H) + 4*G*H float FLOPs for the
    products, float16: 2 per MAC + 2*G*H) plus the cell's element-wise FLOPs per hidden unit
    (LSTM 22, GRU 16, RNN tanh or relu 2: the gates' sum and the activation)."""
    x = call.args[0]
    rows = int(x.numel()) // max(1, int(x.shape[-1]))
    w_ih, b_ih = call.args[2].unpack()
    w_hh, b_hh = call.args[3].unpack()
    return _rnn_cost(call, rows, [(w_ih, w_hh, b_ih, b_hh)])


@rule("aten::fbgemm_linear_int8_weight_fp32_activation", "aten::fbgemm_linear_int8_weight")
def fbgemm_linear_int8(call: OpCall) -> Cost:
    """Legacy FBGEMM linear layer with an int8 weight [N, K] and float input and output (what the
    legacy ``aten::quantized_lstm_cell`` family runs): as ``quantized::linear_dynamic`` with a
    bias, M*K*N integer MACs; float: the input's min and max and its quantization (4 per input
    element), the accumulator's scale and the bias (2 per output element)."""
    x, weight = call.args[0], call.args[1]
    macs = _linear_macs(x, weight)
    return call.cost(macs=macs, flops=4 * int(x.numel()) + 2 * call.out_numel())


@rule("aten::fbgemm_linear_fp16_weight_fp32_activation",
      "aten::fbgemm_linear_fp16_weight_fp32_activation.out", "aten::fbgemm_linear_fp16_weight",
      "aten::fbgemm_linear_fp16_weight.out")
def fbgemm_linear_fp16(call: OpCall) -> Cost:
    """Legacy FBGEMM linear layer with a packed float16 weight: a float GEMM, M*K*N MACs (K the
    input's last size, N the output's) and 2*M*K*N FLOPs, + 1 per output element with a bias.
    The packed weight is an opaque handle; its K*N float16 values (2 B each) are added to the
    bytes read."""
    x, out = call.args[0], call.output
    k, n = int(x.shape[-1]), int(out.shape[-1])
    macs = int(out.numel()) * k
    biased = int(isinstance(named_arg(call, "bias"), torch.Tensor))
    read, written = call.io_bytes()
    return Cost(macs, 2 * macs + int(out.numel()) * biased, read + 2 * k * n, written)


@rule("aten::fbgemm_linear_quantize_weight")
def fbgemm_quantize_weight(call: OpCall) -> Cost:
    """Quantize a float weight to int8 for the legacy FBGEMM linear layer: its min and max
    (2 per element) and the quantization (2 per element): 4 FLOPs per element; the column
    offsets are integer sums."""
    return call.cost(flops=4 * int(call.args[0].numel()))


@rule("aten::fbgemm_pack_quantized_matrix", "aten::fbgemm_pack_gemm_matrix_fp16",
      "quantized::make_quantized_cell_params_dynamic",
      "quantized::make_quantized_cell_params_fp16")
def fbgemm_pack(call: OpCall) -> Cost:
    """Packing weights for a kernel (a layout change, float16 packing a dtype conversion) and
    wrapping packed weights as a recurrent layer's parameters: 0 FLOPs; bytes of the tensor
    inputs and outputs."""
    return call.cost(flops=0)


@rule("quantized::make_quantized_cell_params")
def make_cell_params(call: OpCall) -> Cost:
    """Legacy recurrent parameters from float weights: each of w_ih and w_hh is quantized as by
    ``fbgemm_linear_quantize_weight`` (4 FLOPs per element)."""
    w_ih, w_hh = call.args[0], call.args[1]
    return call.cost(flops=4 * (int(w_ih.numel()) + int(w_hh.numel())))
