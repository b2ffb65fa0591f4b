"""Rules whose arithmetic used to call ``int()`` on sizes (distance, FFT, linear algebra, grouped
products, CTC loss) give formulas on symbolic sizes: no symbol is pinned to its traced value, and
each formula evaluated at two sizes equals the concrete count of the operator at those sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.symbolic import DomainError, count_symbolic


class _Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> torch.Tensor:
        return self.fn(*args)


def _check(fn: Callable[..., torch.Tensor], make: Callable[..., tuple[Any, ...]],
           spec: dict[str, Any], points: list[dict[str, int]], op: str,
           traced: dict[str, int]) -> sympy.Expr:
    """Count ``fn`` symbolically at ``traced`` sizes; at every point the operator's evaluated
    cost (MACs, FLOPs, bytes) equals a concrete count's. Returns the operator's FLOPs formula."""
    model = _Fn(fn)
    rep = count_symbolic(model, *make(**traced), symbolic=spec, warn=False)
    assert not any(isinstance(g, sympy.Eq) for g in rep.domain), rep.domain_text()  # nothing pinned
    flops = rep.by_op()[op].flops
    assert flops.free_symbols, f"{op}: {flops} does not depend on the sizes"
    for point in points:
        assert rep.violated(**point) == [], (point, rep.domain_text())
        concrete = flopscope.count(model, *make(**point), warn=False).by_op()[op].cost
        assert rep.evaluate(**point).by_op()[op].cost == concrete, point
    return flops


def test_cdist_and_pdist() -> None:
    torch.manual_seed(0)
    rows = {"p": [(0, 1)], "r": [(1, 1)]}
    # p = 1: the direct path, 3 FLOPs per (pair, coordinate): 3 * 2 * P * R * 5
    flops = _check(lambda a, b: torch.cdist(a, b, p=1.0),
                   lambda p, r: (torch.randn(2, p, 5), torch.randn(2, r, 5)),
                   rows, [{"p": 3, "r": 7}, {"p": 9, "r": 4}], "aten._cdist_forward.default",
                   {"p": 6, "r": 8})
    p, r = sympy.symbols("p r", integer=True, positive=True)
    assert sympy.expand(flops - 30 * p * r) == 0
    # pdist: N(N-1)/2 pairs, 3 * 4 + 1 root per pair (p = 2)
    flops = _check(lambda x: F.pdist(x), lambda n: (torch.randn(n, 4),), {"n": (0, 0)},
                   [{"n": 5}, {"n": 12}], "aten._pdist_forward.default", {"n": 7})
    n = sympy.Symbol("n", integer=True, positive=True)
    assert flops.xreplace({n: sympy.Integer(12)}) == 66 * 13


def test_cdist_matrix_product_path_is_a_guard() -> None:
    # p = 2 with more than 25 rows: the kernel's matrix-product path, a branch on the size
    model = _Fn(lambda a, b: torch.cdist(a, b))
    rep = count_symbolic(model, torch.randn(30, 4), torch.randn(8, 4),
                         symbolic={"p": (0, 0)}, warn=False)
    assert rep.domain_text() == "valid for 26 <= p"  # the other input's sizes stay numbers
    assert rep.total().macs.free_symbols == {rep.symbols["p"]}
    assert rep.violated(p=20) != []  # 20 rows take the direct path: outside this formula's domain
    concrete = flopscope.count(model, torch.randn(40, 4), torch.randn(8, 4), warn=False)
    assert rep.evaluate(p=40).total() == concrete.total()


def _symbolic_sizes(**hints: int) -> tuple[Any, dict[str, Any]]:
    """A fake mode whose shape environment has one symbol per name (as count_symbolic makes)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    sizes = {}
    for name, hint in hints.items():
        s = env.create_symbol(hint, source=ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        sizes[name] = env.create_symintnode(s, hint=hint, source=ConstantSource(name))
    return FakeTensorMode(shape_env=env), sizes


@pytest.mark.parametrize(("name", "real_in", "real_out"), [
    ("_fft_r2c", True, False), ("_fft_c2c", False, False), ("_fft_c2r", False, True)])
def test_fft_rule_log2_is_a_sympy_log(name: str, real_in: bool, real_out: bool) -> None:
    """The FFT rules on symbolic sizes: 5 N log2 N per transform (2.5 for r2c/c2r), rounded half
    up, is ``floor(c*N*B*log(N)/log(2) + 1/2)``, equal to the concrete rule at every size. (A
    symbolic count of torch.fft pins N and B anyway: PyTorch's meta kernel for the transforms,
    ``_exec_fft``, specializes the sizes; the domain then says ``n == 16``, see the next test.)"""
    from flopscope.cost import OpCall
    from flopscope.rules import default_rules

    op = getattr(torch.ops.aten, name).default
    rule = default_rules().find(op)
    assert rule is not None

    def call(b: Any, n: Any, norm: int) -> OpCall:
        x = torch.empty(b, n if real_out is False else n // 2 + 1,
                        dtype=torch.float32 if real_in else torch.complex64)
        out = torch.empty(b, n if not real_in else n // 2 + 1,
                          dtype=torch.float32 if real_out else torch.complex64)
        if name == "_fft_c2r":
            return OpCall(op, (x, [1], norm, n), {}, out)
        return OpCall(op, (x, [1], norm, real_in), {}, out)

    mode, sym = _symbolic_sizes(b=2, n=16)
    with mode:
        formula = rule(call(sym["b"], sym["n"], 2)).flops.node.expr
    assert any(isinstance(a, sympy.log) for a in sympy.preorder_traversal(formula))
    symbols = {str(s): s for s in formula.free_symbols}
    assert len(symbols) == 2
    b_sym, n_sym = (next(s for s in formula.free_symbols if
                         s == sym[k].node.expr) for k in ("b", "n"))
    for b, n in [(2, 12), (3, 64), (1, 1000), (5, 1)]:
        with torch.device("meta"):
            concrete = rule(call(b, n, 2)).flops
        at = formula.xreplace({b_sym: sympy.Integer(b), n_sym: sympy.Integer(n)})
        assert at == concrete, (b, n, at, concrete)


def test_torch_fft_sizes_are_pinned_by_pytorch_and_said_so() -> None:
    model = _Fn(torch.fft.rfft)
    rep = count_symbolic(model, torch.randn(2, 16), symbolic={"b": (0, 0), "n": (0, 1)},
                         warn=False)
    assert rep.domain_text() == "valid for b == 2, n == 16"  # not extrapolated silently
    with pytest.raises(DomainError, match="b == 2 does not hold"):
        rep.evaluate(b=3, n=16)


def test_linalg_inverse_solve_det_qr() -> None:
    square = {"n": [(0, 1), (0, 2)], "b": [(0, 0)]}
    points = [{"b": 2, "n": 4}, {"b": 3, "n": 7}]

    def make(b: int, n: int) -> tuple[torch.Tensor]:
        return (torch.randn(b, n, n) + n * torch.eye(n),)

    flops = _check(torch.linalg.inv, make, square, points, "aten.linalg_inv_ex.default",
                   {"b": 2, "n": 5})
    b, n = sympy.symbols("b n", integer=True, positive=True)
    # 8/3 n^3 per matrix, rounded: floor((16 n^3 + 3) / 6)
    assert flops.xreplace({b: 1, n: 6}) == 576
    _check(torch.linalg.det, make, square, points, "aten._linalg_det.default", {"b": 2, "n": 5})
    _check(lambda a: torch.linalg.solve(a, torch.ones(a.shape[-1], 3)), make, square, points,
           "aten._linalg_solve_ex.default", {"b": 2, "n": 5})
    # QR of an m x 3 matrix: geqrf branches on m >= n, a guard of the formula
    _check(lambda a: torch.linalg.qr(a).Q, lambda m: (torch.randn(m, 3),), {"m": (0, 0)},
           [{"m": 4}, {"m": 9}], "aten.linalg_qr.default", {"m": 6})


def test_grouped_mm() -> None:
    def make(m: int) -> tuple[torch.Tensor, ...]:
        return torch.randn(m, 8, dtype=torch.bfloat16), torch.randn(3, 8, 16, dtype=torch.bfloat16)

    def grouped(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # groups cover every row, spread as evenly as they go (balanced routing, what a
        # symbolic count assumes of offsets it cannot read: every group with rows reads its
        # weights, min(3, m) of them)
        ends = (torch.arange(1, 4) * a.shape[0] // 3).to(torch.int32)
        return torch._grouped_mm(a, w, offs=ends)

    flops = _check(grouped, make, {"m": (0, 0)}, [{"m": 5}, {"m": 12}], "aten._grouped_mm.default",
                   {"m": 6})
    m = sympy.Symbol("m", integer=True, positive=True)
    assert sympy.expand(flops - 2 * 128 * m) == 0  # M * 8 * 16 MACs (bf16, 16-byte strides: meta)


def test_trilinear_rule_on_symbolic_sizes() -> None:
    """nn.Bilinear's ``_trilinear``: its CPU kernel (the fake implementation too) cannot run on
    symbolic sizes (PyTorch: "Cannot call storage_offset() on tensor with symbolic sizes"), so
    the rule is checked on a symbolic call: N*out*in1*in2 MACs, 3 FLOPs per term."""
    from flopscope.cost import OpCall
    from flopscope.rules import default_rules

    op = torch.ops.aten._trilinear.default
    rule = default_rules().find(op)
    assert rule is not None
    mode, sym = _symbolic_sizes(n=3)

    def call(n: Any) -> OpCall:  # as nn.Bilinear(4, 5, 3) calls it on x1 [n, 4], x2 [n, 5]
        x1, w, x2 = torch.empty(n, 4), torch.empty(3, 4, 5), torch.empty(n, 5)
        return OpCall(op, (x1, w, x2, [1, 3], [0], [1, 2], [2, 3], 1), {}, torch.empty(n, 3))

    with mode:
        flops = rule(call(sym["n"])).flops.node.expr
    n = sym["n"].node.expr
    assert sympy.expand(flops - 3 * 60 * n) == 0  # 3 * N * 3 * 4 * 5
    for size in (2, 9):
        with torch.device("meta"):
            assert rule(call(size)).flops == flops.xreplace({n: sympy.Integer(size)})


def test_ctc_loss_rule_on_symbolic_sizes() -> None:
    """CTC: a symbolic count cannot run it (PyTorch takes the lengths as ``int[]``, not
    ``SymInt[]``, or reads them from tensors: a value; the error names the operator), so the rule
    is checked on a symbolic call: lengths unknown, every sequence at full length, 13 FLOPs per
    lattice cell, T (2S + 1) cells per sequence, + 9 per sequence; backward 20 per cell + 6 per
    log-probability."""
    from flopscope.cost import OpCall
    from flopscope.rules import default_rules

    forward, backward = torch.ops.aten._ctc_loss.Tensor, torch.ops.aten._ctc_loss_backward.Tensor
    mode, sym = _symbolic_sizes(t=10, b=4)

    def calls(t: Any, b: Any) -> tuple[OpCall, OpCall]:
        lp, tg = torch.empty(t, b, 6), torch.empty(b, 3, dtype=torch.long)
        il = tl = torch.empty(b, dtype=torch.long)
        loss = torch.empty(b)
        return (OpCall(forward, (lp, tg, il, tl, 0, False), {}, (loss, torch.empty(b, t, 7))),
                OpCall(backward, (loss, lp, tg, il, tl, loss, torch.empty(b, t, 7), 0, False),
                       {}, torch.empty(t, b, 6)))

    with mode:
        fwd, bwd = (default_rules().find(c.op)(c).flops.node.expr  # type: ignore[misc]
                    for c in calls(sym["t"], sym["b"]))
    t, b = sym["t"].node.expr, sym["b"].node.expr
    assert sympy.expand(fwd - (13 * 7 * t * b + 9 * b)) == 0
    assert sympy.expand(bwd - (20 * 7 * t * b + 6 * 6 * t * b)) == 0
    for size_t, size_b in ((8, 2), (20, 3)):
        with torch.device("meta"):
            concrete = [default_rules().find(c.op)(c).flops  # type: ignore[misc]
                        for c in calls(size_t, size_b)]
        at = {t: sympy.Integer(size_t), b: sympy.Integer(size_b)}
        assert [fwd.xreplace(at), bwd.xreplace(at)] == concrete


def test_ctc_loss_under_a_symbolic_count_names_the_operator() -> None:
    model = _Fn(lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl))
    lp = torch.randn(10, 2, 6).log_softmax(-1)
    with pytest.raises(flopscope.ForwardError, match=r"aten\._ctc_loss\.Tensor"):
        count_symbolic(model, lp, torch.randint(1, 6, (2, 3)), torch.full((2,), 10),
                       torch.full((2,), 3), symbolic={"t": (0, 0)}, warn=False)
