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
    assert (report.macs, report.flops) == (macs, 2 * macs + 24 * T * N * H)
