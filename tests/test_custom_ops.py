"""Custom operators and work that bypasses the dispatcher (issue 3).

- A ``torch.library`` custom op goes through the dispatcher: flopscope sees it by name, lists it as
  uncounted without a rule, and counts it with an op rule ``rules={"fstest::fused_attn": fn}``.
- A C++ extension function that loops over raw ``data_ptr()`` memory is invisible to the
  dispatcher: flopscope sees only its ``torch::empty`` output allocation, flags the module that
  called it as possibly opaque, and counts it with a module rule or a ``flopscope.rules.costed`` wrapper.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import flopscope
from flopscope import Cost, OpCall, StrictModeError, count

B, H, N, D = 2, 4, 64, 32
ATTN_MACS = 2 * B * H * N * N * D  # q@k^T and attn@v: N*N*D each per (batch, head) = 2,097,152


@torch.library.custom_op("fstest::fused_attn", mutates_args=())
def fused_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A fused attention kernel as a library would register it (here in Python for the test)."""
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


@fused_attn.register_fake
def _fused_attn_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape[:-1] + v.shape[-1:])


def fused_attn_rule(call: OpCall) -> Cost:
    """q[b,h,n,d] @ k^T then attn[b,h,n,m] @ v[b,h,m,e]: one MAC per (b,h,n,m,d) and (b,h,n,m,e);
    softmax 5 FLOPs per attention element."""
    q, k, v = call.inputs
    b, h, n, d = q.shape
    m, e = k.shape[-2], v.shape[-1]
    macs = b * h * n * m * (d + e)
    return call.cost(macs=macs, flops=2 * macs + 5 * b * h * n * m)


class FusedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return fused_attn(q, k, v)


def _x() -> torch.Tensor:
    return torch.randn(B, H, N, D)


QKV_MACS = B * H * N * D * 3 * D


def test_custom_op_without_a_rule_is_uncounted_and_warned_once() -> None:
    with pytest.warns(flopscope.FlopscopeWarning, match=r"fstest\.fused_attn\.default \(2 calls\)") as rec:
        r = count(nn.Sequential(FusedBlock(), FusedBlock()), _x())
    assert len([w for w in rec if issubclass(w.category, flopscope.FlopscopeWarning)]) == 1
    assert r.uncounted == {"fstest.fused_attn.default": 2}
    assert r.macs == 2 * QKV_MACS  # the linears only; nothing of the kernel's inside is seen
    assert r.opaque == ()  # an uncounted op is reported as uncounted, not as opaque


@pytest.mark.parametrize("key", ["fstest::fused_attn", "fstest::fused_attn.default",
                                 torch.ops.fstest.fused_attn, torch.ops.fstest.fused_attn.default])
def test_custom_op_with_an_op_rule_is_counted(key: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        r = count(FusedBlock(), _x(), rules={key: fused_attn_rule})
    assert r.uncounted == {}
    assert r.macs == QKV_MACS + ATTN_MACS
    assert r.by_op()["fstest.fused_attn.default"].cost.macs == ATTN_MACS == 2_097_152
    assert r.by_module()[""].self_cost.macs == ATTN_MACS  # attributed to the calling module


def test_custom_op_rule_also_works_on_fake_tensors() -> None:
    r = count(FusedBlock(), _x(), rules={"fstest::fused_attn": fused_attn_rule}, shape_only=True)
    assert r.macs == QKV_MACS + ATTN_MACS


def test_custom_op_without_a_rule_is_fatal_under_strict() -> None:
    with pytest.raises(StrictModeError, match=r"no rule for operator fstest\.fused_attn\.default .*"
                       r"rules=\{'fstest::fused_attn': fn\}"):
        count(FusedBlock(), _x(), strict=True)


def test_custom_op_inside_a_ruled_module_needs_no_op_rule_even_under_strict() -> None:
    r = count(FusedBlock(), _x(), rules={FusedBlock: lambda m, i, o: 5}, strict=True)
    assert (r.macs, r.uncounted) == (5, {})


# -- work that bypasses the dispatcher ---------------------------------------------------------
class NumpyMatmul(nn.Module):
    """Writes its result through numpy into a torch.empty tensor: no arithmetic operator runs."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.weight.shape[1])
        np.matmul(x.detach().numpy(), self.weight.detach().numpy(), out=out.numpy())
        return out


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = NumpyMatmul(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def matmul_rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> int:
    """out[m, n] = x[m, k] @ w[k, n]: one MAC per (m, n, k)."""
    return int(out.numel() * inputs[0].shape[-1])


def test_allocation_only_module_is_flagged_opaque_innermost_only() -> None:
    with pytest.warns(flopscope.FlopscopeWarning, match=r"may bypass the dispatcher: inner\..*module rule"):
        r = count(Outer(), torch.randn(4, 16))
    assert r.opaque == ("inner",)
    assert r.macs == 0


def test_opaque_module_with_a_rule_is_not_flagged() -> None:
    for key in (NumpyMatmul, Outer):  # a rule on the module or on any module around it
        with warnings.catch_warnings():
            warnings.simplefilter("error", flopscope.FlopscopeWarning)
            r = count(Outer(), torch.randn(4, 16), rules={key: matmul_rule})
        assert r.opaque == ()
        assert r.macs == 4 * 8 * 16


def test_module_that_does_arithmetic_is_not_opaque() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        r = count(nn.Linear(16, 8), torch.randn(4, 16))
    assert r.opaque == ()


def test_costed_wraps_a_function_without_changing_it() -> None:
    calls: list[int] = []

    def raw(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        out = torch.empty(a.shape[0], b.shape[1])
        np.matmul(a.numpy(), b.numpy(), out=out.numpy())
        return out

    raw_mm = flopscope.costed(raw, lambda m, inputs, out: out.numel() * inputs[0].shape[1])
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    torch.testing.assert_close(raw_mm(a, b), a @ b)  # outside a Counter: just the function

    class UsesRaw(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return raw_mm(raw_mm(a, b), b.T)

    r = count(UsesRaw(), a, b)
    assert r.macs == 3 * 7 * 5 + 3 * 5 * 7
    assert r.opaque == ()
    (rec,) = r.rules
    assert (rec.module, rec.calls) == ("raw", 2)
    assert rec.rule.endswith("<locals>.<lambda>")  # the rule's qualified name
    assert r.modules["raw"] == ("Costed", 2)
    assert len(calls) == 3


def test_costed_rejects_what_is_not_callable() -> None:
    with pytest.raises(flopscope.RuleError, match=r"rule must be callable as rule\(module, args, output\)"):
        flopscope.costed(len, 3)  # type: ignore[arg-type]
