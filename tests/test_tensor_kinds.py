"""Models that run in plain PyTorch never crash under flopscope, and count what they compute:
nested (jagged and strided), sparse, complex and integer tensors, higher-order operators
(flex_attention, cond, while_loop)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopscope


def _count(fn: object) -> flopscope.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)  # nothing uncounted
        with flopscope.Counter() as c:
            fn()  # type: ignore[operator]
    return c.report


LENGTHS = (2, 3, 5)


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_linear_on_nested_tensors_counts_every_row(layout: torch.layout) -> None:
    lin = nn.Linear(16, 8)
    x = torch.nested.nested_tensor([torch.randn(n, 16) for n in LENGTHS], layout=layout)
    r = _count(lambda: lin(x))
    # (2 + 3 + 5) rows x 8 outputs x 16 inputs = 1,280 MACs; + 10 x 8 bias adds
    assert (r.macs, r.flops) == (1280, 2 * 1280 + 80)


def test_nested_sdpa_equals_the_sum_of_dense_sequences() -> None:
    heads, d = 2, 8
    q = torch.nested.nested_tensor([torch.randn(n, heads, d) for n in LENGTHS],
                                   layout=torch.jagged).transpose(1, 2)
    nested = _count(lambda: nn.functional.scaled_dot_product_attention(q, q, q))
    dense = 0
    for n in LENGTHS:
        t = torch.randn(1, heads, n, d)
        dense += _count(lambda t=t: nn.functional.scaled_dot_product_attention(t, t, t)).macs
    # per sequence: heads x n x n x (d + d) MACs: 2 x (4 + 9 + 25) x 16 = 1,216
    assert nested.macs == dense == 1216


def test_nested_sdpa_backward_counts_both_gradient_products() -> None:
    """On jagged nested tensors the CPU runs SDPA as matmuls on strided nested tensors, whose
    backward is ``aten.matmul_backward``: two products per matmul, each as large as the forward
    one."""
    heads, d = 2, 8

    def jagged() -> torch.Tensor:
        return torch.nested.nested_tensor([torch.randn(n, heads, d) for n in LENGTHS],
                                          layout=torch.jagged).transpose(1, 2).requires_grad_(True)

    q, k, v = jagged(), jagged(), jagged()

    def step() -> None:
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        torch.autograd.grad(out.values().sum(), [q, k, v])

    r = _count(step)  # nothing uncounted
    backward = r.by_op(phase="backward")["aten.matmul_backward.default"]
    # per sequence of n tokens, a forward product is heads x n x n x d MACs (S = QK^T, then PV);
    # matmul_backward computes dA = dC @ B^T and dB = A^T @ dC, each as many MACs:
    # 2 matmuls x 2 products x heads x d x (4 + 9 + 25) = 4 x 2 x 8 x 38 = 2,432
    assert backward.calls == 2
    assert (backward.cost.macs, backward.cost.flops) == (2432, 2 * 2432)
    assert r.total("forward").macs == 1216  # 2 x 2 x 8 x 38, as test_nested_sdpa_... above


def test_nested_inputs_that_fake_tensors_refuse_are_a_clear_error_shape_only() -> None:
    class Attention(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.nested.nested_tensor([torch.randn(n, 2, 8) for n in LENGTHS],
                                   layout=torch.jagged).transpose(1, 2)
    with pytest.raises(flopscope.ForwardError, match="cannot make the inputs fake tensors"):
        flopscope.count(Attention(), q, shape_only=True)


def test_sparse_products_count_stored_entries() -> None:
    a = torch.zeros(6, 5)
    a[0, 1], a[2, 3], a[5, 0] = 1.0, 2.0, 3.0  # 3 stored entries
    sparse = a.to_sparse()
    b = torch.randn(5, 4)
    r = _count(lambda: torch.sparse.mm(sparse, b))
    assert r.macs == 3 * 4  # nnz x n
    csr = _count(lambda: a.to_sparse_csr() @ b)
    assert csr.macs == 3 * 4


def test_sparse_bytes_are_values_and_indices() -> None:
    sparse = torch.eye(4).to_sparse()  # 4 values (float32) + 2 x 4 indices (int64)
    r = _count(lambda: sparse.to_dense())
    stats = r.by_op()["aten._to_dense.default"].cost if "aten._to_dense.default" in r.by_op() \
        else r.by_op()["aten.to_dense.default"].cost
    assert stats.bytes_read == 4 * 4 + 8 * 8
    assert stats.bytes_written == 16 * 4


def test_complex_arithmetic_in_real_operations() -> None:
    x = torch.randn(2, 4, dtype=torch.complex64)
    w = torch.randn(3, 4, dtype=torch.complex64)
    r = _count(lambda: nn.functional.linear(x, w))
    # 2 x 3 x 4 = 24 complex MACs = 96 real MACs (4 multiplies + 4 adds each), 192 FLOPs
    assert (r.macs, r.flops) == (96, 192)
    y = torch.randn(10, dtype=torch.complex64)
    assert _count(lambda: y * y).flops == 6 * 10  # 4 multiplies + 2 adds per element
    assert _count(lambda: y + y).flops == 2 * 10
    assert _count(lambda: y / y).flops == 11 * 10
    assert _count(lambda: y.abs()).flops == 4 * 10  # two squares, an add, a square root
    assert _count(lambda: torch.fft.fft(y)).flops == \
        _count(lambda: torch.fft.fft(y)).flops  # the FFT rule counts complex itself (no 2x)


def test_integer_work_is_not_flops() -> None:
    i = torch.arange(1000)
    r = _count(lambda: (i + 1) * 2)
    assert r.flops == 0
    assert r.bytes_read > 0  # still moves memory
    assert _count(lambda: i * 0.5).flops == 1000  # promoted to floating point: real FLOPs
    a, b = torch.randint(-5, 5, (4, 8)), torch.randint(-5, 5, (8, 3))
    r = _count(lambda: a @ b)
    assert (r.macs, r.flops) == (4 * 3 * 8, 0)  # an integer matmul: MACs, no FLOPs


def test_batch_norm_counter_is_integer_work() -> None:
    bn = nn.BatchNorm1d(3)
    r = flopscope.count(bn, torch.randn(4, 3), train=True)
    assert r.flops == 6 * 12  # statistics and normalisation only; num_batches_tracked += 1 is 0


def test_cond_counts_the_branch_taken() -> None:
    x = torch.randn(4, 4)
    taken = _count(lambda: torch.cond(torch.tensor(True), lambda t: t @ t, lambda t: t + 1, (x,)))
    assert taken.macs == 64  # 4 x 4 x 4
    assert taken.decomposed == {"higher_order.cond": 1}
    other = _count(lambda: torch.cond(torch.tensor(False), lambda t: t @ t, lambda t: t + 1, (x,)))
    assert (other.macs, other.flops) == (0, 16)


def test_while_loop_counts_every_iteration() -> None:
    from torch._higher_order_ops.while_loop import while_loop

    x = torch.randn(4, 4)
    r = _count(lambda: while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y @ y),
                                  (torch.tensor(0), x)))
    assert r.macs == 3 * 64  # three iterations of a 4 x 4 x 4 product
    assert r.flops == 3 * 128  # the counter's integer increments and compares are not FLOPs


def test_cond_on_fake_tensors_is_listed_not_a_crash() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 4))
        pred = mode.from_tensor(torch.tensor(True))
        with flopscope.Counter(warn=False) as c:
            torch.cond(pred, lambda t: t @ t, lambda t: t + 1, (x,))
    assert "higher_order.cond" in c.report.uncounted or c.report.macs == 64


flex = pytest.importorskip("torch.nn.attention.flex_attention")


def test_flex_attention_dense_and_block_sparse() -> None:
    q = torch.randn(1, 2, 256, 16)
    dense = _count(lambda: flex.flex_attention(q, q, q))
    # no BlockMask: every block computed, 1 x 2 x 256 x 256 scores x (16 + 16) MACs
    assert dense.macs == 2 * 256 * 256 * 32

    def causal(b: object, h: object, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return qi >= ki

    mask = flex.create_block_mask(causal, 1, 1, 256, 256, device="cpu")
    sparse = _count(lambda: flex.flex_attention(q, q, q, block_mask=mask))
    # 128 x 128 blocks: query block 0 computes 1 (partial, the diagonal), query block 1 computes
    # 2 (1 full + 1 partial): 3 blocks x 128 x 128 scores x 2 heads x 32 MACs
    assert sparse.macs == 3 * 128 * 128 * 2 * 32
    assert sparse.by_op()["higher_order.flex_attention"].cost.macs == sparse.macs
