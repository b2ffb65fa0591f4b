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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from flopscope.estimate.calibration import ChainPoint
from flopscope.estimate.profile import Hardware

__all__ = ["CONV_CHAINS", "LINEAR_CHAINS", "chain_points", "chains"]

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


def chains(device: str = "cpu", *, blocks: int = 3) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """The chains: (what, the module in eval mode, its input).

    Args:
        device: where they run.
        blocks: blocks per chain (three calls each).

    Returns:
        The chains.
    """
    out: list[tuple[str, nn.Module, torch.Tensor]] = []
    for kind, c, side in CONV_CHAINS:
        k, groups = (1, 1) if kind == "conv1x1" else (3, c if kind.startswith("depth") else 1)
        layers: list[nn.Module] = [m for _ in range(blocks) for m in (
            nn.Conv2d(c, c, k, padding=k // 2, groups=groups, bias=False), nn.BatchNorm2d(c),
            nn.ReLU(inplace=True))]
        out.append((f"{kind}+bn+relu {c}x{side}x{side} x{blocks}",
                    nn.Sequential(*layers).to(device).eval(),
                    torch.randn(1, c, side, side, device=device)))
    for rows, width in LINEAR_CHAINS:
        layers = [m for _ in range(blocks) for m in (
            nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())]
        out.append((f"linear+layernorm+gelu {rows}x{width} x{blocks}",
                    nn.Sequential(*layers).to(device).eval(),
                    torch.randn(rows, width, device=device)))
    return out


def chain_points(hardware: Hardware, device: str,
                 time_per_call: Callable[[Callable[[], object], str], float]) -> tuple[
                     ChainPoint, ...]:
    """Count, predict and time every chain of :func:`chains`, at more than one thread only: what
    they measure is the parallel speed-up a model's chain of fresh outputs does not get while
    the points, each in a loop or a rotation, do. At one thread here they ran a median of 0.76x
    their points' prediction (plausibly three identical blocks keep the kernel library's state
    warm where a model's varied layers do not), and taking that into the model made the
    1-thread validation worse (24 models: median |error| 10.5% -> 18.5%, docs/prediction.md). None on CUDA either
    (its host and device overlap, and the calibration's points there are the device's).

    Args:
        hardware: a profile whose calibration has the points (and no chains) and the thread
            count they were timed at: each chain's ``predicted_s`` is what the points predict
            for its calls.
        device: ``"cpu"`` or ``"cuda"``.
        time_per_call: the calibration's timer (``fn, device -> seconds per call``:
            :func:`flopscope.estimate.calibrate.time_per_call`).

    Returns:
        The chains measured; none at one thread, on CUDA, or without a calibration.
    """
    from flopscope.estimate.predict import family, reduction_length
    from flopscope.estimate.roofline import CallLog
    from flopscope.run import count

    cal = hardware.calibration
    if device.startswith("cuda") or cal is None or cal.threads <= 1:
        return ()
    alone = dataclasses.replace(hardware, calibration=dataclasses.replace(cal, chains=()))
    out = []
    with torch.no_grad():
        for what, module, x in chains(device):
            log = CallLog()
            count(module, x, observers=[log])  # as a model's forward is counted
            predicted = log.estimate(alone).total.predicted_s
            families = sorted({family(r) for r in log.records if r.bytes})
            seconds = time_per_call(lambda m=module, x=x: m(x), device)  # type: ignore[misc]
            lengths = sorted(reduction_length(r) for r in log.records if r.macs)
            out.append(ChainPoint(what, tuple(families), len(log.records),
                                  x.numel() * x.element_size(), seconds, predicted,
                                  lengths[len(lengths) // 2] if lengths else 0.0))
    return tuple(out)
