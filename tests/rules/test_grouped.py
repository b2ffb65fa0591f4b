"""Grouped GEMM (mixture of experts), segment reductions, the bilinear product."""

from __future__ import annotations

import torch
from torch import nn

from flopscope.cost import OpCall
from flopscope.rules import default_rules
from rules._util import count, op

GROUPED = "aten._grouped_mm.default"


def test_grouped_mm_sums_the_groups() -> None:
    a, b = torch.randn(12, 8), torch.randn(3, 8, 4)
    full = torch.tensor([2, 5, 12], dtype=torch.int32)
    # groups of 2, 3 and 7 rows, each [m_g, 8] @ [8, 4]: (2 + 3 + 7) * 8 * 4 = 384 MACs
    cost = op(count(lambda: torch._grouped_mm(a, b, offs=full)), GROUPED)
    assert (cost.macs, cost.flops) == (384, 768)
    # offsets that stop at row 8: rows 8..11 belong to no group and are not computed
    part = torch.tensor([2, 5, 8], dtype=torch.int32)
    assert op(count(lambda: torch._grouped_mm(a, b, offs=part)), GROUPED).macs == 8 * 8 * 4


def test_grouped_mm_on_meta_assumes_the_groups_cover_the_rows() -> None:
    a, b = torch.empty(12, 8, device="meta"), torch.empty(3, 8, 4, device="meta")
    offs = torch.empty(3, dtype=torch.int32, device="meta")  # no values to read
    mm = torch.ops.aten._grouped_mm.default
    call = OpCall(mm, (a, b, offs), {}, torch.empty(12, 4, device="meta"))
    assert default_rules().find(mm)(call).macs == 12 * 8 * 4  # sum_g m_g = M = 12


def test_grouped_mm_reads_the_weights_of_the_groups_with_rows() -> None:
    # a mixture of experts' decode step: 2 rows (one token, its top 2 experts) over 8 experts
    # of 16 x 32 float32 weights (2,048 bytes each)
    a, b = torch.randn(2, 16), torch.randn(8, 16, 32)
    offs = torch.tensor([0, 1, 1, 1, 1, 2, 2, 2], dtype=torch.int32)  # experts 1 and 5
    cost = op(count(lambda: torch._grouped_mm(a, b, offs=offs)), GROUPED)
    # read: a 128 + offs 32 + 2 groups x 2,048; written: 2 x 32 x 4
    assert (cost.macs, cost.bytes_read, cost.bytes_written) == (2 * 16 * 32, 4256, 256)
    # every row in one group: one group's weights
    one = torch.tensor([2] * 8, dtype=torch.int32)
    assert op(count(lambda: torch._grouped_mm(a, b, offs=one)), GROUPED).bytes_read == 2208
    # on meta no offsets can be read: the rows spread evenly, min(8 groups, 2 rows) = 2 read;
    # 20 rows reach every group, the whole weight (8 x 2,048 bytes)
    mm = torch.ops.aten._grouped_mm.default
    meta_offs = torch.empty(8, dtype=torch.int32, device="meta")
    for rows, read in ((2, 128 + 32 + 2 * 2048), (20, 20 * 64 + 32 + 8 * 2048)):
        x, w = torch.empty(rows, 16, device="meta"), torch.empty(8, 16, 32, device="meta")
        call = OpCall(mm, (x, w, meta_offs), {}, torch.empty(rows, 32, device="meta"))
        assert default_rules().find(mm)(call).bytes_read == read


def test_grouped_mm_other_layouts() -> None:
    from flopscope.rules.grouped import grouped_mm_macs

    offs = torch.tensor([10, 20, 30], dtype=torch.int32)
    # 2d x 2d, groups along K: out [3, 4, 5], sum_g 4 * k_g * 5 = 4 * 30 * 5
    assert grouped_mm_macs(torch.empty(4, 30), torch.empty(30, 5), offs) == (600, 60)
    # 3d x 2d, groups along N: sum_g 4 * 8 * n_g = 4 * 8 * 30
    assert grouped_mm_macs(torch.empty(3, 4, 8), torch.empty(8, 30), offs) == (960, 120)
    # 3d x 3d, batched: 3 * 4 * 8 * 5
    assert grouped_mm_macs(torch.empty(3, 4, 8), torch.empty(3, 8, 5), None) == (480, 60)


def test_segment_reduce() -> None:
    data, lengths = torch.randn(10, 3), torch.tensor([3, 3, 4])
    name = "aten.segment_reduce.default"
    assert op(count(lambda: torch.segment_reduce(data, "sum", lengths=lengths)), name).flops == 30
    # mean: 30 adds + one divide per output element (3 segments x 3)
    assert op(count(lambda: torch.segment_reduce(data, "mean", lengths=lengths)), name).flops == 39


def test_bilinear_layer() -> None:
    layer = nn.Bilinear(4, 5, 3)
    x1, x2 = torch.randn(2, 4), torch.randn(2, 5)
    cost = op(count(lambda: layer(x1, x2)), "aten._trilinear.default")
    # y[n,o] = sum_ij x1[n,i] W[o,i,j] x2[n,j]: 2*3*4*5 = 120 terms, 2 multiplies + 1 add each
    assert (cost.macs, cost.flops) == (120, 360)
