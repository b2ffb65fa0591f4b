"""Chains of layers over fresh outputs, timed whole (:attr:`Calibration.chains
<flopscope.estimate.calibration.Calibration.chains>`).

A calibration point is one operator timed in a loop or in a rotation of its group; a model runs
its layers in a chain, each reading the output the one before just wrote, and allocating its
own. At two threads on a 2-core machine the chain is what does not speed up as the points do
(docs/prediction.md, round 4: a ReLU or batch norm reading a fresh output took 2-10x its warm
time), so the chains are measured at more than one thread only (:func:`chain_points`). A chain here is a generic stack of ``blocks`` layers, none a validated model's: a
convolution (dense 3x3, 1x1 or depthwise 3x3), an eval-mode batch norm and an in-place ReLU at
batch 1, or a linear layer, a layer norm and a GELU over rows of tokens; activations of 16 KiB
to 2 MiB. Each is counted (its calls, predicted by the calibration's points, without chains)
and timed whole by the calibration's clock; :meth:`Calibration.chain_factor
<flopscope.estimate.calibration.Calibration.chain_factor>` turns measured / predicted into a
factor per family, size and (for products and convolutions) reduction length.

A GPU calibration (``benchmarks/gpu_calib.py``) times the same kinds at tiny sizes eagerly on the
device (host-bound: their time is the host's issuing of the calls) and predicts them here
(:func:`chain_point`) from its points on the meta device, its timeline being the host and the
device overlapping.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from flopscope.estimate.calibration import ChainPoint
from flopscope.estimate.profile import Hardware

if TYPE_CHECKING:
    from flopscope.estimate.bound import Estimate

__all__ = ["CONV_CHAINS", "LINEAR_CHAINS", "Residual", "chain_point", "chain_points", "chains"]

CONV_CHAINS = (
    # (kind, channels, side): activations of channels x side^2 fp32 values, batch 1
    ("conv3x3", 24, 64), ("conv3x3", 48, 32), ("conv3x3", 96, 16), ("conv3x3", 192, 8),
    ("conv1x1", 48, 64), ("conv1x1", 96, 32), ("conv1x1", 192, 16), ("conv1x1", 384, 8),
    ("depthwise3x3", 32, 96), ("depthwise3x3", 64, 64), ("depthwise3x3", 128, 32),
    ("depthwise3x3", 256, 16), ("depthwise3x3", 512, 8), ("conv1x1", 24, 128),
    ("depthwise3x3", 32, 128),
)
"""The convolution chains: a convolution, an eval-mode batch norm, an in-place ReLU."""

LINEAR_CHAINS = ((16, 256), (48, 512), (160, 896))
"""The token chains (rows, width): a linear layer, a layer norm, a GELU."""


class Residual(nn.Module):
    """A pre-norm residual block of a transformer, at its smallest: ``x + linear(layer_norm(x))``
    (a layer norm, a linear layer, an add).

    Args:
        width: the features.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + linear(layer_norm(x))``."""
        y: torch.Tensor = self.linear(self.norm(x))
        return x + y


def chains(device: str = "cpu", *, blocks: int = 3,
           conv: Sequence[tuple[str, int, int]] = CONV_CHAINS,
           linear: Sequence[tuple[int, int]] = LINEAR_CHAINS,
           residual: Sequence[tuple[int, int]] = ()) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """The chains: (what, the module in eval mode, its input).

    Args:
        device: where they run (``"meta"``: counted, not run).
        blocks: blocks per chain (three calls each).
        conv: the convolution chains (kind, channels, side): a convolution, an eval-mode batch
            norm, an in-place ReLU per block.
        linear: the token chains (rows, width): a linear layer, a layer norm, a GELU per block.
        residual: pre-norm residual chains (rows, width): :class:`Residual` blocks (none in the
            CPU calibration).

    Returns:
        The chains.
    """
    out: list[tuple[str, nn.Module, torch.Tensor]] = []
    for kind, c, side in conv:
        k, groups = (1, 1) if kind == "conv1x1" else (3, c if kind.startswith("depth") else 1)
        layers: list[nn.Module] = [m for _ in range(blocks) for m in (
            nn.Conv2d(c, c, k, padding=k // 2, groups=groups, bias=False), nn.BatchNorm2d(c),
            nn.ReLU(inplace=True))]
        out.append((f"{kind}+bn+relu {c}x{side}x{side} x{blocks}",
                    nn.Sequential(*layers).to(device).eval(),
                    torch.randn(1, c, side, side, device=device)))
    for rows, width in linear:
        layers = [m for _ in range(blocks) for m in (
            nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())]
        out.append((f"linear+layernorm+gelu {rows}x{width} x{blocks}",
                    nn.Sequential(*layers).to(device).eval(),
                    torch.randn(rows, width, device=device)))
    for rows, width in residual:
        out.append((f"layernorm+linear+add {rows}x{width} x{blocks}",
                    nn.Sequential(*[Residual(width) for _ in range(blocks)]).to(device).eval(),
                    torch.randn(rows, width, device=device)))
    return out


def chain_point(hardware: Hardware, what: str, module: nn.Module, x: torch.Tensor,
                seconds: float) -> tuple[ChainPoint, Estimate]:
    """One chain, counted as a model's forward is and predicted by ``hardware``'s calibration
    without its chains: the predicted run's time (:func:`flopscope.estimate.predict
    .predicted_step_s`: on a CPU its calls' sum, on a GPU calibration the step with the host
    and device overlapping).

    Args:
        hardware: a calibrated profile.
        what: what ran.
        module: the chain (on any device, ``"meta"`` included).
        x: its input.
        seconds: its measured time per forward.

    Returns:
        (the chain, its estimate).

    Raises:
        ValueError: ``hardware`` has no calibration.
    """
    from flopscope.estimate.bound import predicted_step_s
    from flopscope.estimate.families import family, reduction_length
    from flopscope.estimate.roofline import CallLog
    from flopscope.run import count

    cal = hardware.calibration
    if cal is None:
        raise ValueError("chain_point needs a calibrated profile")
    alone = dataclasses.replace(hardware, calibration=dataclasses.replace(cal, chains=()))
    log = CallLog()
    with torch.no_grad():
        count(module, x, observers=[log])  # as a model's forward is counted
    estimate = log.estimate(alone)
    families = sorted({family(r) for r in log.records if r.bytes})
    lengths = sorted(reduction_length(r) for r in log.records if r.macs)
    return ChainPoint(what, tuple(families), len(log.records), x.numel() * x.element_size(),
                      seconds, predicted_step_s(estimate),
                      lengths[len(lengths) // 2] if lengths else 0.0), estimate


def chain_points(hardware: Hardware, device: str,
                 time_per_call: Callable[[Callable[[], object], str], float], *,
                 passes: int = 1) -> tuple[ChainPoint, ...]:
    """Count, predict and time every chain of :func:`chains`, at more than one thread only: what
    they measure is the parallel speed-up a model's chain of fresh outputs does not get while
    the points, each in a loop or a rotation, do. At one thread here they ran a median of 0.76x
    their points' prediction (plausibly three identical blocks keep the kernel library's state
    warm where a model's varied layers do not), and taking that into the model made the
    1-thread validation worse (24 models: median |error| 10.5% -> 18.5%, docs/prediction.md). None on CUDA here:
    the GPU's chains are timed eagerly at tiny sizes by ``benchmarks/gpu_calib.py`` (their time
    is the host's there) and predicted by :func:`chain_point` in ``benchmarks/gpu_profile.py``.

    Every chain is timed once in each of ``passes`` passes over all of them, its time the median
    of its passes' (as the points, :func:`flopscope.estimate.calibrate.calibration_points`: a
    moment of contention moves one pass, not the chain).

    Args:
        hardware: a profile whose calibration has the points (and no chains) and the thread
            count they were timed at: each chain's ``predicted_s`` is what the points predict
            for its calls.
        device: ``"cpu"`` or ``"cuda"``.
        time_per_call: the calibration's timer (``fn, device -> seconds per call``:
            :func:`flopscope.estimate.timers.time_per_call`).
        passes: how many passes.

    Returns:
        The chains measured; none at one thread, on CUDA, or without a calibration.
    """
    cal = hardware.calibration
    if device.startswith("cuda") or cal is None or cal.threads <= 1:
        return ()
    with torch.no_grad():  # counted first, then timed
        counted = [(module, x, chain_point(hardware, what, module, x, 1.0)[0])
                   for what, module, x in chains(device)]
        times: list[list[float]] = [[] for _ in counted]
        for _ in range(passes):
            for t, (module, x, _point) in zip(times, counted, strict=True):
                t.append(time_per_call(lambda m=module, x=x: m(x), device))  # type: ignore[misc]
    return tuple(dataclasses.replace(point, seconds=statistics.median(t))
                 for t, (_, _, point) in zip(times, counted, strict=True))
