"""FFT: 5 N log2 N real FLOPs per complex transform, half for real input or output."""

from __future__ import annotations

import torch

from flopscope.rules.fft import fft_flops
from rules._util import count, op


def test_complex_fft_batched() -> None:
    x = torch.randn(3, 16, dtype=torch.complex64)
    cost = op(count(lambda: torch.fft.fft(x)), "aten._fft_c2c.default")
    assert cost.flops == 3 * 5 * 16 * 4  # 3 transforms of N = 16: 5 * 16 * log2 16 = 320 each
    assert cost.macs == 0


def test_real_fft_is_half() -> None:
    x = torch.randn(2, 64)
    cost = op(count(lambda: torch.fft.rfft(x)), "aten._fft_r2c.default")
    assert cost.flops == 2 * 5 * 64 * 6 // 2  # 2.5 * 64 * 6 = 960 per row: 1,920


def test_fft2_counts_the_product_of_the_sizes() -> None:
    x = torch.randn(5, 8, 32, dtype=torch.complex64)
    cost = op(count(lambda: torch.fft.fft2(x)), "aten._fft_c2c.default")
    # N = 8 * 32 = 256 points, log2 = 8: 5 * 256 * 8 = 10,240 per batch element, 5 of them
    assert cost.flops == 5 * 10_240


def test_inverse_real_fft_uses_the_output_length() -> None:
    x = torch.randn(4, 17, dtype=torch.complex64)  # the half spectrum of 32 points
    report = count(lambda: torch.fft.irfft(x, n=32))
    # 4 real signals of 32 points: 2.5 * 32 * 5 = 400 each; "backward" normalization scales every
    # real output value once (4 * 32 = 128 multiplies)
    assert op(report, "aten._fft_c2r.default").flops == 4 * 400 + 128


def test_orthonormal_scaling_counts_real_multiplies() -> None:
    x = torch.randn(16, dtype=torch.complex64)
    cost = op(count(lambda: torch.fft.fft(x, norm="ortho")), "aten._fft_c2c.default")
    assert cost.flops == 320 + 2 * 16  # the transform + 1/sqrt(N) on 16 complex outputs


def test_non_power_of_two_rounds_the_real_log() -> None:
    # 5 * 12 * log2(12) = 215.1... per transform -> round(2 * 215.1) = 430
    assert fft_flops(12, 2, real=False) == 430
    assert fft_flops(1, 7, real=False) == 0
