"""Embedding and recurrent layers (through the operators they dispatch)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from rules._util import count, op


def test_embedding_gathers_rows() -> None:
    emb, idx = nn.Embedding(10, 4), torch.tensor([[1, 2, 3]])
    report = count(lambda: emb(idx), backward=True)
    cost = op(report, "aten.embedding.default")
    assert (cost.macs, cost.flops) == (0, 0)
    # reads the 3 gathered rows of 4 floats (48 bytes) and 3 int64 indices (24), writes 48
    assert (cost.bytes_read, cost.bytes_written) == (48 + 24, 48)
    # backward: each of the 3*4 gradient elements is added into its row
    assert op(report, "aten.embedding_dense_backward.default", "backward").flops == 12


T, N, IN, H = 7, 3, 10, 20  # steps, batch, input, hidden; two layers (second input = H)


def _gate_macs(gates: int) -> int:
    # per layer: T*N*gates*H*(input + H) for x W_ih^T + h W_hh^T
    return T * N * gates * H * (IN + H) + T * N * gates * H * (H + H)


@pytest.mark.parametrize(("cls", "gates"), [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_recurrent_macs_by_hand(cls: type[nn.Module], gates: int) -> None:
    rnn = cls(IN, H, num_layers=2, batch_first=True)
    x = torch.randn(N, T, IN)
    report = flopscope.count(rnn, x)
    # LSTM: 7*3*80*30 + 7*3*80*40 = 50,400 + 67,200 = 117,600; GRU: 88,200; RNN: 29,400
    assert report.macs == _gate_macs(gates)
    assert report.uncounted == {}
    with torch.no_grad():
        assert flopscope.count(rnn, x).macs == _gate_macs(gates)
    both = flopscope.count(rnn, x, backward=True)
    assert both.uncounted == {}
    # backward: dX, dh, dW_ih, dW_hh = twice the forward products. The oneDNN LSTM kernel computes
    # all of them; the decomposed GRU/RNN skip what nobody needs: dX of the first layer (the input
    # does not require grad: T*N*gates*H*IN) and dh_0 of each layer (h_0 is a constant zero:
    # N*gates*H*H per layer)
    back = both.total("backward").macs
    if cls is nn.LSTM:
        assert back == 2 * _gate_macs(gates)  # 235,200
    else:  # GRU: 176,400 - 12,600 - 7,200 = 156,600; RNN: 58,800 - 4,200 - 2,400 = 52,200
        assert back == 2 * _gate_macs(gates) - T * N * gates * H * IN - 2 * N * gates * H * H


def test_lstm_forward_flops() -> None:
    report = flopscope.count(nn.LSTM(IN, H), torch.randn(T, N, IN))
    macs = T * N * 4 * H * (IN + H)  # 50,400
    # per (step, batch, hidden unit): 8 bias adds (b_ih, b_hh on 4 gates), the gates' sum (4),
    # 3 sigmoids (12), 2 tanh, 3 multiplies and 1 add: 30; 2*50,400 + 30*7*3*20 = 113,400
    assert (report.macs, report.flops) == (macs, 2 * macs + 30 * T * N * H) == (50_400, 113_400)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_layer_counts_as_its_unrolled_cells(bias: bool) -> None:
    # nn.LSTM runs one fused oneDNN operator (aten.mkldnn_rnn_layer); nn.LSTMCell runs addmm and
    # element-wise operators step by step: the same layer, the same MACs and FLOPs
    torch.manual_seed(0)
    layer, cell = nn.LSTM(IN, H, bias=bias), nn.LSTMCell(IN, H, bias=bias)
    x = torch.randn(T, N, IN)

    def unrolled() -> torch.Tensor:
        state = (torch.zeros(N, H), torch.zeros(N, H))
        for t in range(T):
            state = cell(x[t], state)
        return state[0]

    with torch.no_grad():
        fused = count(lambda: layer(x))
        steps = count(unrolled)
    assert "aten.mkldnn_rnn_layer.default" in fused.by_op()
    assert (fused.macs, fused.flops) == (steps.macs, steps.flops)
    # 30 (22 without biases) FLOPs per (step, batch, hidden unit) beside 2 per MAC
    assert fused.flops - 2 * fused.macs == (30 if bias else 22) * T * N * H


@pytest.mark.parametrize(("mode", "weighted", "flops"), [
    ("sum", False, 24),  # 6 indices x 4 columns: each bag's gradient row added into 6 rows
    ("mean", False, 32),  # + the 2 bags' 2 x 4 gradient elements divided by the bag size
    ("max", False, 8),  # the 2 x 4 gradient elements routed to the maximal rows
    ("sum", True, 48),  # + a multiply by the per-sample weight per gathered element
])
def test_embedding_bag_backward(mode: str, weighted: bool, flops: int) -> None:
    torch.manual_seed(0)
    weight = torch.randn(10, 4, requires_grad=True)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2])
    psw = torch.randn(6, requires_grad=True) if weighted else None
    report = count(lambda: nn.functional.embedding_bag(idx, weight, offsets, mode=mode,
                                                       per_sample_weights=psw), backward=True)
    assert op(report, "aten._embedding_bag_backward.default", "backward").flops == flops
    if weighted:  # each index's gradient: its bag's row . its weight row, 4 multiplies + 4 adds
        assert op(report, "aten._embedding_bag_per_sample_weights_backward.default",
                  "backward").flops == 6 * 8
    assert report.uncounted == {}
