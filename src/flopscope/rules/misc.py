"""Embedding, scatter/index accumulation and other gather-like operators that do arithmetic."""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall, tensor_bytes
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import rule


@rule("aten::embedding")
def embedding(call: OpCall) -> Cost:
    """Embedding lookup is a gather: 0 FLOPs; bytes read are the gathered rows (not the whole
    table) plus the indices."""
    out = call.output
    idx = call.args[1]
    gathered = out.numel() * out.element_size()
    return Cost(0, 0, gathered + idx.numel() * idx.element_size(), gathered)


@rule("aten::embedding_dense_backward", "aten::embedding_backward")
def embedding_backward(call: OpCall) -> Cost:
    """Embedding gradient: each grad_output row is added into its table row: 1 FLOP per grad
    element."""
    return call.cost(flops=call.args[0].numel())


@rule("aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::embedding_bag")
def embedding_bag(call: OpCall) -> Cost:
    """Embedding bag: gather each index's row (D elements) and reduce (sum/mean add, max compare):
    1 FLOP per gathered element, +1 with per-sample weights; mean adds a divide per output."""
    w, idx = call.args[0], call.args[1]
    gathered = idx.numel() * w.shape[-1]
    weighted = named_arg(call, "per_sample_weights") is not None
    mode = named_arg(call, "mode", 0)
    flops = gathered * (1 + int(weighted)) + (call.output.numel() if mode == 1 else 0)
    return call.cost(flops=flops)


@rule("aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward")
def embedding_bag_backward(call: OpCall) -> Cost:
    """Embedding bag gradient (the weight's, dense): each bag's gradient row (D elements) is added
    into the row of every index in the bag: 1 FLOP per gathered element, +1 with per-sample
    weights (the multiply); mean divides each bag's gradient by its size first (1 per gradient
    element); max routes each bag's gradient to its maximal rows only (1 add per gradient
    element)."""
    grad, idx = call.args[0], call.args[1]
    mode = named_arg(call, "mode", 0)
    if mode == 2:  # max
        return call.cost(flops=grad.numel())
    weighted = named_arg(call, "per_sample_weights") is not None
    flops = idx.numel() * grad.shape[-1] * (1 + int(weighted)) + \
        (grad.numel() if mode == 1 else 0)
    return call.cost(flops=flops)


@rule("aten::_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(call: OpCall) -> Cost:
    """Gradient of an embedding bag's per-sample weights: for every index, the dot product of its
    bag's gradient row with the index's weight row, D multiplies and D adds: 2*D FLOPs per
    index."""
    grad, idx = call.args[0], call.args[2]
    return call.cost(flops=2 * idx.numel() * grad.shape[-1])


@rule("aten::scatter_add", "aten::scatter_add_", "aten::index_add", "aten::index_add_",
      "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_reduce", "aten::index_reduce_")
def scatter_add(call: OpCall) -> Cost:
    """Scatter/index accumulation: one add (or reduce op) per source element."""
    src = named_arg(call, "src")
    if src is None:
        src = named_arg(call, "source")
    n = src.numel() if hasattr(src, "numel") else call.out_numel()
    return call.cost(flops=n)


def _scatter_in_place(call: OpCall, source: torch.Tensor | None, flops: int = 0) -> Cost:
    """An in-place scatter into ``self``: the index tensors and the source are read and only the
    positions written move bytes (a KV-cache update writes its new rows, not the whole cache).
    The functional forms write a whole new tensor: the default bytes."""
    if not call.name.split(".")[1].endswith("_") or source is None:
        return call.cost(flops=flops)
    target = call.args[0]
    index_bytes = sum(tensor_bytes(t) for t in call.inputs[1:] if t is not source)
    written = source.numel() * target.element_size()
    return Cost(0, flops, index_bytes + tensor_bytes(source), written)


@rule("aten::index_put", "aten::index_put_", "aten::_index_put_impl", "aten::_index_put_impl_",
      "aten::_unsafe_index_put")
def index_put(call: OpCall) -> Cost:
    """index_put: a scatter (0 FLOPs), or with accumulate=True one add per value element. In
    place: the indices and values are read, the values' elements written."""
    values = named_arg(call, "values")
    flops = values.numel() if named_arg(call, "accumulate", False) else 0
    return _scatter_in_place(call, values if isinstance(values, torch.Tensor) else None, flops)


@rule("aten::index_copy", "aten::index_copy_")
def index_copy(call: OpCall) -> Cost:
    """index_copy: copies the source's slices to the indexed positions: 0 FLOPs. In place (a
    static KV cache's update): index and source read, the source's elements written."""
    source = named_arg(call, "source")
    return _scatter_in_place(call, source if isinstance(source, torch.Tensor) else None)


# Element-wise FLOPs of one recurrent cell per (step, batch row, hidden unit), after its two
# products x W_ih^T and h W_hh^T and without their bias adds (1 per gate element each, counted
# with the products). As PyTorch's CPU cells compute them (aten/src/ATen/native/RNN.cpp, the
# LSTMCell, GRUCell and SimpleCell templates; the same operators nn.LSTMCell/GRUCell/RNNCell
# decompose into):
#   LSTM (4 gates i, f, g, o): gates = hh + ih (4 adds); sigmoid of i, f, o (3 x 4 = 12: negate,
#     exp, add, divide); tanh of g (1); c' = f*c + i*g (2 multiplies, 1 add); h' = o * tanh(c')
#     (1 tanh, 1 multiply): 4 + 12 + 1 + 3 + 2 = 22.
#   GRU (3 gates r, z, n): r = sigmoid(ih_r + hh_r), z = sigmoid(ih_z + hh_z) (2 x (1 + 4) = 10);
#     n = tanh(ih_n + r * hh_n) (3); h' = (h - n) * z + n (3): 16.
#   RNN (1 gate): tanh or relu of hh + ih: 2.
CELL_FLOPS = {"lstm": 22, "gru": 16, "rnn_tanh": 2, "rnn_relu": 2}
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


@rule("aten::mkldnn_rnn_layer")
def mkldnn_rnn_layer(call: OpCall) -> Cost:
    """One oneDNN LSTM layer (one direction) over T steps, batch B, input I, hidden H:
    gates = x W_ih^T + b_ih + h W_hh^T + b_hh: T*B*4H*(I + H) MACs; per (step, batch, hidden
    unit) the 2 bias adds per gate (8, with biases) and the cell's 22 (``CELL_FLOPS``): 30 FLOPs,
    exactly what the same layer counts as unrolled ``nn.LSTMCell`` steps."""
    steps_batch, macs = _lstm_layer(call)
    hidden = int(named_arg(call, "hidden_size"))
    per = CELL_FLOPS["lstm"] + 2 * GATES["lstm"] * int(bool(named_arg(call, "has_biases", True)))
    return call.cost(macs=macs, flops=2 * macs + per * steps_batch * hidden)


def _lstm_layer(call: OpCall) -> tuple[int, int]:
    """(T*B, forward MACs T*B*4H*(I + H)) of one oneDNN LSTM layer call."""
    x, w_ih = call.args[0], call.args[1]
    hidden = int(named_arg(call, "hidden_size"))
    steps_batch = x.numel() // x.shape[-1]  # T*B for [T,B,I] / [B,T,I], T for unbatched [T,I]
    gates = w_ih.shape[0]
    return steps_batch, steps_batch * gates * (w_ih.shape[1] + hidden)


@rule("aten::mkldnn_rnn_layer_backward")
def mkldnn_rnn_layer_backward(call: OpCall) -> Cost:
    """Gradient of one oneDNN LSTM layer: with dG the gate gradients [T*B, 4H], the four products
    dX = dG W_ih (T*B*4H*I), dh = dG W_hh (T*B*4H*H), dW_ih = dG^T X (4H*I*T*B) and
    dW_hh = dG^T h (4H*H*T*B) are twice the forward: 2*T*B*4H*(I + H) MACs. Per (step, batch,
    hidden unit) the cell backward does: dh*o (1), dc += dh_tanh*(1 - tanh^2) (4), do, di, dg, df
    and dc_prev (5 multiplies), three sigmoid' (3 each) and one tanh' (3) = 22, plus the bias
    gradients (a sum per gate for each of the two biases, 8): 30 FLOPs."""
    steps_batch, fwd_macs = _lstm_layer(call)
    hidden = int(named_arg(call, "hidden_size"))
    macs = 2 * fwd_macs
    return call.cost(macs=macs, flops=2 * macs + 30 * steps_batch * hidden)
