"""A real C++ extension, built in the test with ``torch.utils.cpp_extension.load_inline``, whose
kernel does a matmul in plain loops over raw ``data_ptr()`` memory (issue 3).

The dispatcher never sees that arithmetic: flopscope sees only the ``torch::empty`` output
allocation, flags the calling module as possibly opaque (and warns), and counts it exactly once the
user gives a module rule, or wraps the function with :func:`flopscope.rules.costed`.

Building takes about a minute on two cores; it happens once per test session, in the slow tier
(``FLOPSCOPE_SLOW=1``): the default tier checks the same opaque-module mechanism on an operator
defined in Python (tests/test_custom_ops.py).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope import count

pytestmark = pytest.mark.slow


def matmul_rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> int:
    """out[m, n] = x[m, k] @ w[k, n]: one MAC per (m, n, k)."""
    return int(out.numel() * inputs[0].shape[-1])


# -- a real C++ extension: a matmul in plain loops over raw pointers ---------------------------
CPP = r"""
#include <torch/extension.h>

// out[i, j] = sum_p a[i, p] * b[p, j], computed in plain loops: no ATen arithmetic runs.
torch::Tensor raw_matmul(torch::Tensor a, torch::Tensor b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "raw_matmul: bad shapes");
  TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat,
              "raw_matmul: float32 only");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "raw_matmul: contiguous inputs only");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  torch::Tensor out = torch::empty({m, n}, a.options());
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += pa[i * k + p] * pb[p * n + j];
      po[i * n + j] = acc;
    }
  }
  return out;
}
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """Build the extension once per test session (about a minute on two cores)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler (c++/g++) on PATH: cannot build the test extension")
    from torch.utils.cpp_extension import load_inline

    build = Path(tmp_path_factory.mktemp("fs_raw_matmul_build"))
    return load_inline(  # type: ignore[no-any-return]
        name="fs_raw_matmul",
        cpp_sources=[CPP],
        functions=["raw_matmul"],
        build_directory=str(build),
        extra_cflags=["-O1"],
        verbose=False,
    )


class ExtLinear(nn.Module):
    """A bias-free linear layer whose matmul runs in the C++ extension."""

    def __init__(self, ext: ModuleType, n_in: int, n_out: int) -> None:
        super().__init__()
        self.ext = ext
        self.weight = nn.Parameter(torch.randn(n_in, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.raw_matmul(x.contiguous(), self.weight.detach().contiguous())  # type: ignore[no-any-return]


class ExtNet(nn.Module):
    def __init__(self, ext: ModuleType) -> None:
        super().__init__()
        self.fc1 = ExtLinear(ext, 64, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))  # type: ignore[no-any-return]


EXT_MACS = 8 * 32 * 64  # fc1: x[8, 64] @ w[64, 32]
FC2_MACS = 8 * 10 * 32


def test_extension_computes_a_matmul(ext: ModuleType) -> None:
    a, b = torch.randn(8, 64), torch.randn(64, 32)
    torch.testing.assert_close(ext.raw_matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_extension_module_is_flagged_opaque_without_a_rule(ext: ModuleType) -> None:
    with pytest.warns(flopscope.FlopscopeWarning, match=r"may bypass the dispatcher: fc1\. Give them a module rule"):
        r = count(ExtNet(ext), torch.randn(8, 64))
    assert r.opaque == ("fc1",)
    assert r.uncounted == {}
    assert r.macs == FC2_MACS  # the extension's 16,384 MACs are invisible
    assert r.by_module_and_op()[("fc1", "aten.empty.memory_format")].calls == 1


def test_extension_module_is_counted_with_a_module_rule(ext: ModuleType) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        r = count(ExtNet(ext), torch.randn(8, 64), rules={ExtLinear: matmul_rule})
    assert r.opaque == ()
    assert r.macs == EXT_MACS + FC2_MACS == 16_384 + 2_560
    (rec,) = r.rules
    assert (rec.module, rec.cost.macs, rec.shadowed.macs) == ("fc1", EXT_MACS, 0)
    assert r.rule_mismatches() == (rec,)  # the operators saw nothing: the rule is the only figure


def test_extension_function_is_counted_through_costed(ext: ModuleType) -> None:
    raw_matmul = flopscope.costed(ext.raw_matmul, matmul_rule, name="raw_matmul")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(raw_matmul(x, self.w.detach()))

    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        r = count(Net(), torch.randn(8, 64))
    assert r.macs == EXT_MACS
    assert r.opaque == ()
    assert [(rec.module, rec.rule) for rec in r.rules] == [("raw_matmul", "matmul_rule")]
