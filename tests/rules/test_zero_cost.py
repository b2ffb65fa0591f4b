"""The zero-FLOP list: no arithmetic, but bytes are moved (views move none)."""

from __future__ import annotations

import torch

from flopscope.rules import default_rules
from rules._util import count, op

X = torch.randn(3, 4)  # 48 bytes


def test_views_move_no_bytes() -> None:
    for fn, name in [(lambda: X.view(12), "aten.view.default"),
                     (lambda: X.t(), "aten.t.default"),
                     (lambda: X.transpose(0, 1), "aten.transpose.int"),
                     (lambda: X[1:], "aten.slice.Tensor"),
                     (lambda: X.unsqueeze(0), "aten.unsqueeze.default")]:
        cost = op(count(fn), name)
        assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 0, 0), name


def test_copies_move_bytes() -> None:
    cost = op(count(lambda: X.clone()), "aten.clone.default")
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 48, 48)
    cost = op(count(lambda: X.to(torch.float64)), "aten._to_copy.default")
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 48, 96)  # 12 doubles out
    cost = op(count(lambda: torch.cat([X, X])), "aten.cat.default")
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 96, 96)
    cost = op(count(lambda: X.t().contiguous()), "aten.clone.default")
    assert (cost.bytes_read, cost.bytes_written) == (48, 48)


def test_creation_writes_its_output() -> None:
    cost = op(count(lambda: torch.zeros(5, 2)), "aten.zeros.default")
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 0, 40)


def test_zero_flop_rules_are_registered() -> None:
    rules = default_rules()
    for name in ("aten::view", "aten::clone", "aten::cat", "aten::index", "aten::zeros",
                 "aten::_to_copy", "aten::constant_pad_nd"):
        assert name in rules


def test_unsafe_view_moves_no_bytes() -> None:
    # aten._unsafe_view's schema does not mark it as a view, but it is one: 0 bytes
    r = count(lambda: torch.ops.aten._unsafe_view(torch.randn(4, 4), [16]))
    assert op(r, "aten._unsafe_view.default").bytes_read == 0


def test_in_place_scatter_writes_only_what_it_writes() -> None:
    cache = torch.zeros(1, 8, 1024, 64)  # a static KV cache: 2 MiB
    new = torch.randn(1, 8, 1, 64)  # one token: 8 x 64 float32 = 2,048 bytes
    r = count(lambda: cache.index_copy_(2, torch.tensor([5]), new))
    cost = op(r, "aten.index_copy_.default")
    # read: the index (1 int64 = 8 bytes) and the source (2,048); written: the source's elements
    assert (cost.bytes_read, cost.bytes_written) == (8 + 2048, 2048)


def test_in_place_metadata_changes_move_no_bytes() -> None:
    """``as_strided_``/``transpose_``/``squeeze_``/``unsqueeze_`` change sizes and strides only;
    their schemas mark the argument as written, but no data moves (0 bytes, like a view)."""
    import flopscope

    x = torch.randn(4, 8)
    with flopscope.Counter(warn=False) as counter:
        y = x.clone()  # 128 bytes read, 128 written
        y.as_strided_((8, 4), (1, 8))
        y.transpose_(0, 1)
        y.unsqueeze_(0)
        y.squeeze_(0)
    ops = counter.report.by_op()
    for name in ("aten.as_strided_.default", "aten.transpose_.default", "aten.unsqueeze_.default",
                 "aten.squeeze_.dim"):
        assert ops[name].cost.bytes_read == ops[name].cost.bytes_written == 0, name
    assert counter.report.total().bytes_read == 128


def test_assertions_do_no_flops() -> None:
    checked = torch.ones(3, 4, dtype=torch.bool)  # 12 bools: 12 bytes

    def checks() -> None:
        torch._check_tensor_all(checked)  # what transformers' torch_compilable_check runs
        torch._assert_async(torch.tensor(True))

    r = count(checks)
    assert r.uncounted == {}
    cost = op(r, "aten._is_all_true.default")
    # reads the 12 bools, writes one
    assert (cost.macs, cost.flops, cost.bytes_read, cost.bytes_written) == (0, 0, 12, 1)
    assert op(r, "aten._assert_async.default").flops == 0
    for name in ("aten::_is_any_true", "aten::_functional_assert_scalar",
                 "aten::_functional_sym_constrain_range_for_size"):
        assert name in default_rules()
