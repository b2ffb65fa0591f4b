"""Operator-family workloads for the counted-vs-executed validation (``docs/validation.md``).

Every operator family with a formula convention gets a micro-benchmark at two sizes (three for a
few).  Each workload is one module whose forward calls one operator on tensors it holds (made in
float64 here, seed 0; plain attributes, so a dtype cast of the model leaves them alone), so

- ``benchmarks/validation_ops.py:<family>__<op>__<size>`` measures one operator at one size
  (``flopscope measure benchmarks/validation_ops.py:fft__rfft__n4096 --dtype float64``), and
- ``benchmarks/validation_ops.py:all_ops`` holds every workload as a child module named
  ``<family>__<op>__<size>``: one valgrind run measures them all, split per child module (the
  per-module split of the measurement), which is what ``python -m benchmarks.validation_page``
  runs.

The grouped GEMM workloads run in float32 (PyTorch's CPU ``_grouped_mm`` takes float32, bfloat16
and float16, not float64).  Variable-length attention (``torch.nn.attention.varlen``) does not run
on the CPU in torch 2.14.1 (``aten::_flash_attention_forward`` has no CPU kernel), so it has no
workload; its rule is the per-sequence sum of dense blocks, which the dense rows check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

Builder = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]

_F64 = torch.float64


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, dtype: torch.dtype = _F64, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=_g(seed))


def _spd(n: int) -> torch.Tensor:
    a = _randn(n, n)
    return a @ a.T + n * torch.eye(n, dtype=_F64)


class OpWorkload(nn.Module):
    """One operator call on tensors held as plain attributes (not parameters or buffers).

    Args:
        fn: the call, ``fn(*args)``.
        args: its arguments.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        super().__init__()
        self.fn = fn
        self.args = args

    def forward(self, x: torch.Tensor | None = None) -> Any:
        return self.fn(*self.args)


class OpSuite(nn.Module):
    """Every workload as a child module; forward calls each once, in order."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        for name in names:
            fn, args = WORKLOADS[name]()
            self.add_module(name, OpWorkload(fn, args))

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        for child in self.children():
            child()
        return torch.zeros(())


WORKLOADS: dict[str, Builder] = {}


def _add(family: str, op: str, size: str, build: Builder) -> None:
    WORKLOADS[f"{family}__{op}__{size}"] = build


# --- matmul / convolution -------------------------------------------------------------------------
for n in (64, 160):
    _add("matmul", "mm", f"n{n}", lambda n=n: (torch.mm, (_randn(n, n), _randn(n, n, seed=1))))
for b, n in ((4, 48), (8, 96)):
    _add("matmul", "bmm", f"b{b}n{n}",
         lambda b=b, n=n: (torch.bmm, (_randn(b, n, n), _randn(b, n, n, seed=1))))
for m, k in ((64, 256), (256, 512)):
    _add("matmul", "linear", f"m{m}k{k}",
         lambda m=m, k=k: (F.linear, (_randn(m, k), _randn(k, k, seed=1), _randn(k, seed=2))))
for c, hw in ((16, 32), (32, 48)):
    _add("conv", "conv2d_3x3", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (lambda x, w, b: F.conv2d(x, w, b, padding=1),
                             (_randn(1, c, hw, hw), _randn(c, c, 3, 3, seed=1), _randn(c, seed=2))))
    _add("conv", "conv_transpose2d", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (lambda x, w: F.conv_transpose2d(x, w, stride=2),
                             (_randn(1, c, hw // 2, hw // 2), _randn(c, c, 3, 3, seed=1))))
    _add("conv", "depthwise3x3", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (lambda x, w: F.conv2d(x, w, padding=1, groups=c),
                             (_randn(1, c, hw, hw), _randn(c, 1, 3, 3, seed=1))))

# --- attention --------------------------------------------------------------------------------------
# CPU flash kernel blocks: 32/64/256 query rows (L < 192 / < 768 / >= 768), 512 keys.  At L = 256
# every causal query block still visits key block 0, which holds all keys: nothing is skipped.
# At L = 1024 the first two query blocks visit one of two key blocks: 3/4 of the dense work runs.
for L, d in ((256, 32), (1024, 32)):
    def _qkv(L: int = L, d: int = d) -> tuple[torch.Tensor, ...]:
        return tuple(_randn(1, 1, L, d, seed=s) for s in range(3))

    _add("attention", "sdpa_dense", f"L{L}",
         lambda _qkv=_qkv: (F.scaled_dot_product_attention, _qkv()))
    _add("attention", "sdpa_causal", f"L{L}",
         lambda _qkv=_qkv: (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                            _qkv()))
    _add("attention", "sdpa_bool_mask_causal", f"L{L}",
         lambda _qkv=_qkv, L=L: (
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
             (*_qkv(), torch.ones(L, L, dtype=torch.bool).tril())))
for L, e in ((64, 64), (256, 64)):
    def _mha(L: int = L, e: int = e) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        torch.manual_seed(0)
        mha = nn.MultiheadAttention(e, 4, batch_first=True, dtype=_F64).eval()
        x = _randn(1, L, e)
        return (lambda t: mha(t, t, t, need_weights=False)[0]), (x,)

    _add("attention", "mha_fastpath", f"L{L}", _mha)

# --- softmax / normalization / activations --------------------------------------------------------
for rows in (64, 512):
    shape = (rows, 1024)
    _add("softmax", "softmax", f"r{rows}",
         lambda shape=shape: (lambda x: torch.softmax(x, -1), (_randn(*shape),)))
    _add("softmax", "log_softmax", f"r{rows}",
         lambda shape=shape: (lambda x: torch.log_softmax(x, -1), (_randn(*shape),)))
    _add("norm", "layer_norm", f"r{rows}",
         lambda shape=shape: (lambda x, w, b: F.layer_norm(x, (1024,), w, b),
                              (_randn(*shape), _randn(1024, seed=1), _randn(1024, seed=2))))
    _add("activation", "gelu", f"r{rows}", lambda shape=shape: (F.gelu, (_randn(*shape),)))
    _add("activation", "gelu_tanh", f"r{rows}",
         lambda shape=shape: (lambda x: F.gelu(x, approximate="tanh"), (_randn(*shape),)))
    _add("activation", "silu", f"r{rows}", lambda shape=shape: (F.silu, (_randn(*shape),)))
    _add("activation", "relu", f"r{rows}", lambda shape=shape: (F.relu, (_randn(*shape),)))
    _add("elementwise", "exp", f"r{rows}", lambda shape=shape: (torch.exp, (_randn(*shape),)))
    _add("elementwise", "add", f"r{rows}",
         lambda shape=shape: (torch.add, (_randn(*shape), _randn(*shape, seed=1))))
    _add("elementwise", "mul", f"r{rows}",
         lambda shape=shape: (torch.mul, (_randn(*shape), _randn(*shape, seed=1))))
for c, hw in ((16, 32), (64, 32)):
    _add("norm", "batch_norm_eval", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (
             lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
             (_randn(4, c, hw, hw), _randn(c, seed=1), _randn(c, seed=2).abs() + 1,
              _randn(c, seed=3), _randn(c, seed=4))))
    _add("norm", "group_norm", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (lambda x, w, b: F.group_norm(x, 4, w, b),
                             (_randn(4, c, hw, hw), _randn(c, seed=1), _randn(c, seed=2))))

# --- pooling / interpolation ----------------------------------------------------------------------
for c, hw in ((16, 32), (32, 64)):
    def _x(c: int = c, hw: int = hw) -> torch.Tensor:
        return _randn(1, c, hw, hw)

    _add("pooling", "max_pool2d_3x3s2", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.max_pool2d(x, 3, 2, 1), (_x(),)))
    _add("pooling", "avg_pool2d_2x2", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.avg_pool2d(x, 2), (_x(),)))
    _add("pooling", "adaptive_avg_pool2d_1", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.adaptive_avg_pool2d(x, 1), (_x(),)))
    _add("interpolation", "bilinear_x2", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (_x(),)))
    _add("interpolation", "bicubic_x2", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), (_x(),)))
    _add("interpolation", "nearest_x2", f"c{c}hw{hw}",
         lambda _x=_x: (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (_x(),)))

# --- reductions / cumulative ----------------------------------------------------------------------
for rows in (64, 512):
    shape = (rows, 1024)
    _add("reduction", "sum_dim", f"r{rows}",
         lambda shape=shape: (lambda x: x.sum(-1), (_randn(*shape),)))
    _add("reduction", "sum_all", f"r{rows}", lambda shape=shape: (torch.sum, (_randn(*shape),)))
    _add("reduction", "mean_dim", f"r{rows}",
         lambda shape=shape: (lambda x: x.mean(-1), (_randn(*shape),)))
    _add("reduction", "var_dim", f"r{rows}",
         lambda shape=shape: (lambda x: x.var(-1), (_randn(*shape),)))
    _add("reduction", "norm_dim", f"r{rows}",
         lambda shape=shape: (lambda x: torch.linalg.vector_norm(x, dim=-1), (_randn(*shape),)))
    _add("cumulative", "cumsum", f"r{rows}",
         lambda shape=shape: (lambda x: torch.cumsum(x, -1), (_randn(*shape),)))

# --- FFT --------------------------------------------------------------------------------------------
for n in (256, 4096):
    _add("fft", "fft_c2c", f"n{n}",
         lambda n=n: (torch.fft.fft, (torch.complex(_randn(16, n), _randn(16, n, seed=1)),)))
    _add("fft", "rfft", f"n{n}", lambda n=n: (torch.fft.rfft, (_randn(16, n),)))
    _add("fft", "irfft", f"n{n}",
         lambda n=n: (torch.fft.irfft, (torch.fft.rfft(_randn(16, n)),)))
_add("fft", "rfft", "n1000", lambda: (torch.fft.rfft, (_randn(16, 1000),)))
_add("fft", "fft2_c2c", "n64", lambda: (torch.fft.fft2, (torch.complex(_randn(4, 64, 64),
                                                                      _randn(4, 64, 64, seed=1)),)))

# --- dense linear algebra -------------------------------------------------------------------------
for n in (32, 128):
    _add("linalg", "lu_factor", f"n{n}", lambda n=n: (torch.linalg.lu_factor, (_randn(n, n),)))
    _add("linalg", "cholesky", f"n{n}", lambda n=n: (torch.linalg.cholesky, (_spd(n),)))
    _add("linalg", "qr", f"n{n}", lambda n=n: (torch.linalg.qr, (_randn(n, n),)))
    _add("linalg", "solve", f"n{n}",
         lambda n=n: (torch.linalg.solve, (_randn(n, n), _randn(n, 16, seed=1))))
    _add("linalg", "svd", f"n{n}",
         lambda n=n: (lambda a: torch.linalg.svd(a, full_matrices=False), (_randn(n, n),)))
    _add("linalg", "svdvals", f"n{n}", lambda n=n: (torch.linalg.svdvals, (_randn(n, n),)))
    _add("linalg", "eigh", f"n{n}", lambda n=n: (torch.linalg.eigh, (_spd(n),)))
    _add("linalg", "eig", f"n{n}", lambda n=n: (torch.linalg.eig, (_randn(n, n),)))
    _add("linalg", "inv", f"n{n}", lambda n=n: (torch.linalg.inv, (_spd(n),)))

# --- grid sampling ----------------------------------------------------------------------------------
for c, hw in ((8, 32), (16, 64)):
    def _grid(c: int = c, hw: int = hw) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.9, 0.02]]], dtype=_F64)
        return _randn(1, c, hw, hw), F.affine_grid(theta, [1, c, hw, hw], align_corners=False)

    _add("sampling", "grid_sample_bilinear", f"c{c}hw{hw}",
         lambda _grid=_grid: (lambda x, g: F.grid_sample(x, g, align_corners=False), _grid()))
    _add("sampling", "grid_sample_nearest", f"c{c}hw{hw}",
         lambda _grid=_grid: (lambda x, g: F.grid_sample(x, g, mode="nearest",
                                                         align_corners=False), _grid()))
    _add("sampling", "affine_grid", f"c{c}hw{hw}",
         lambda c=c, hw=hw: (lambda t: F.affine_grid(t, [1, c, hw, hw], align_corners=False),
                             (torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.9, 0.02]]], dtype=_F64),)))

# --- distances --------------------------------------------------------------------------------------
for m, d in ((64, 16), (256, 64)):
    _add("distance", "cdist_p2", f"m{m}d{d}",
         lambda m=m, d=d: (torch.cdist, (_randn(m, d), _randn(m, d, seed=1))))
    _add("distance", "cdist_p2_mm", f"m{m}d{d}",
         lambda m=m, d=d: (lambda a, b: torch.cdist(
             a, b, compute_mode="use_mm_for_euclid_dist"), (_randn(m, d), _randn(m, d, seed=1))))
    _add("distance", "cdist_p1", f"m{m}d{d}",
         lambda m=m, d=d: (lambda a, b: torch.cdist(a, b, p=1.0),
                           (_randn(m, d), _randn(m, d, seed=1))))
    _add("distance", "pdist", f"m{m}d{d}", lambda m=m, d=d: (F.pdist, (_randn(m, d),)))

# --- grouped GEMM (float32: the CPU kernel has no float64) ---------------------------------------
for groups, m, k in ((4, 64, 64), (8, 128, 128)):
    def _grouped(groups: int = groups, m: int = m, k: int = k
                 ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        a = _randn(groups * m, k, dtype=torch.float32)
        b = _randn(groups, k, k, dtype=torch.float32, seed=1)
        offs = torch.arange(1, groups + 1, dtype=torch.int32) * m
        return (lambda a, b, o: torch._grouped_mm(a, b, offs=o)), (a, b, offs)

    _add("grouped_gemm", "grouped_mm_f32", f"g{groups}m{m}k{k}", _grouped)

# --- losses -----------------------------------------------------------------------------------------
for n, c in ((64, 100), (512, 1000)):
    _add("loss", "cross_entropy", f"n{n}c{c}",
         lambda n=n, c=c: (F.cross_entropy,
                           (_randn(n, c), torch.randint(0, c, (n,), generator=_g()))))
    _add("loss", "mse", f"n{n}c{c}",
         lambda n=n, c=c: (F.mse_loss, (_randn(n, c), _randn(n, c, seed=1))))
for t, c in ((32, 20), (128, 50)):
    def _ctc(t: int = t, c: int = c) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        log_probs = torch.log_softmax(_randn(t, 4, c), -1)
        targets = torch.randint(1, c, (4, t // 2), generator=_g())
        lengths = torch.full((4,), t, dtype=torch.long)
        target_lengths = torch.full((4,), t // 2, dtype=torch.long)
        return F.ctc_loss, (log_probs, targets, lengths, target_lengths)

    _add("loss", "ctc", f"t{t}c{c}", _ctc)


def _factory(name: str) -> Callable[[], tuple[nn.Module, torch.Tensor]]:
    def build() -> tuple[nn.Module, torch.Tensor]:
        fn, args = WORKLOADS[name]()
        return OpWorkload(fn, args), torch.zeros(1, dtype=_F64)

    build.__name__ = name
    build.__doc__ = f"The {name} workload alone: (module, dummy input)."
    return build


for _name in WORKLOADS:
    globals()[_name] = _factory(_name)


def all_ops() -> tuple[nn.Module, torch.Tensor]:
    """Every workload as one child module each (one valgrind run, split per child).

    Returns:
        (the suite, a dummy input).
    """
    return OpSuite(list(WORKLOADS)), torch.zeros(1, dtype=_F64)


def family_ops(family: str) -> tuple[nn.Module, torch.Tensor]:
    """The workloads of one family.

    Args:
        family: ``matmul``, ``attention``, ``linalg``, ...

    Returns:
        (the suite, a dummy input).
    """
    names = [n for n in WORKLOADS if n.split("__")[0] == family]
    return OpSuite(names), torch.zeros(1, dtype=_F64)


def split_name(name: str) -> tuple[str, str, str]:
    """``family__op__size`` -> (family, op, size).

    Args:
        name: a workload name (a child module's path in :func:`all_ops`).

    Returns:
        The three parts.
    """
    family, op, size = name.split("__")
    return family, op, size


def causal_pair() -> tuple[nn.Module, torch.Tensor]:
    """Dense and causal SDPA at 1,024 tokens (the CPU flash kernel's block skipping).

    Returns:
        (the suite, a dummy input).
    """
    return OpSuite(["attention__sdpa_dense__L1024", "attention__sdpa_causal__L1024"]), \
        torch.zeros(1, dtype=_F64)
