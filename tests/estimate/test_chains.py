"""Round 5 of the prediction (issue 29): chains of layers over fresh outputs, timed whole by the
calibration against what its points predict (``Calibration.chains``), and the factor per
family and size the prediction takes from them."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from tests.estimate.synthetic import FAST, calibrated
from torch import nn

import flopscope
from flopscope.errors import UsageError
from flopscope.estimate import Hardware, calibrate, get_hardware, load_hardware
from flopscope.estimate.calibration import ChainPoint, Point
from flopscope.estimate.chains import CONV_CHAINS, LINEAR_CHAINS, chain_points

HOST = {"elementwise": 1e-6}
# element-wise: 1e4 B in 1e-5 s of device time (1e9 B/s) after 1e-6 s of host time
POINTS = (Point("elementwise", "fp32", "add", 1000, 10_000, 1.1e-5),)


def chain(ratio: float, nbytes: int, families: tuple[str, ...] = ("elementwise",)) -> ChainPoint:
    """A chain measured at ``ratio`` x what its points predicted, activations of ``nbytes``."""
    return ChainPoint(f"chain {nbytes}", families, 9, nbytes, ratio * 1e-3, 1e-3)


class Add(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


def test_one_chain_scales_its_families_calls_at_every_size() -> None:
    cal = calibrated(POINTS, HOST, chains=(chain(2.0, 4096),)).calibration
    assert cal is not None
    # one chain: its ratio wherever the call's size is (taken at the chain's beyond it)
    assert cal.chain_factor("elementwise", 4096) == pytest.approx(2.0, rel=1e-12)
    assert cal.chain_factor("elementwise", 1 << 24) == pytest.approx(2.0, rel=1e-12)
    # a family no chain holds, and a call that writes nothing: 1
    assert cal.chain_factor("pooling", 4096) == 1.0
    assert cal.chain_factor("elementwise", 0) == 1.0


def test_chains_are_averaged_in_octaves_of_activation_bytes() -> None:
    cal = calibrated(POINTS, HOST, chains=(chain(2.0, 1 << 12), chain(0.5, 1 << 14))).calibration
    assert cal is not None
    # midway (2^13): one octave from each, equal weights: the geometric mean of 2 and 1/2
    assert cal.chain_factor("elementwise", 1 << 13) == pytest.approx(1.0, rel=1e-12)
    # at 2^12: weights 1 and exp(-2^2 / 2) (two octaves away)
    w = math.exp(-2.0)
    expected = math.exp((math.log(2.0) + w * math.log(0.5)) / (1 + w))
    assert cal.chain_factor("elementwise", 1 << 12) == pytest.approx(expected, rel=1e-12)
    # below the smallest chain: taken at it
    assert cal.chain_factor("elementwise", 16) == pytest.approx(expected, rel=1e-12)


def test_products_and_convolutions_take_the_chains_of_their_reduction_length() -> None:
    depthwise = dataclasses.replace(chain(2.0, 4096, ("conv",)), reduction=9.0)
    dense = dataclasses.replace(chain(0.5, 4096, ("conv",)), reduction=36.0)
    cal = calibrated(POINTS, HOST, chains=(depthwise, dense)).calibration
    assert cal is not None
    # a depthwise 3x3 call (reduction 9): weights 1 and exp(-2^2 / 2) (log2(36 / 9) = 2)
    w = math.exp(-2.0)
    expected = math.exp((math.log(2.0) + w * math.log(0.5)) / (1 + w))
    assert cal.chain_factor("conv", 4096, 9.0) == pytest.approx(expected, rel=1e-12)
    # reduction 18: one octave from each, equal weights: the geometric mean of 2 and 1/2
    assert cal.chain_factor("conv", 4096, 18.0) == pytest.approx(1.0, rel=1e-12)
    # a call without a reduction length (a batch norm): by size alone, equal weights
    assert cal.chain_factor("conv", 4096) == pytest.approx(1.0, rel=1e-12)


def test_the_prediction_of_a_chained_family_is_scaled_host_and_device() -> None:
    x = torch.randn(1024)  # x + x: writes 4096 B, moves 12288 B
    plain = calibrated(POINTS, HOST)
    chained = calibrated(POINTS, HOST, chains=(chain(1.5, 4096),))
    _, before = flopscope.estimate.roofline(Add(), x, hardware=plain)
    _, after = flopscope.estimate.roofline(Add(), x, hardware=chained)
    # 1e-6 s of host, 12288 B at 1e9 B/s (the one point's rate): both x 1.5
    assert before.total.predicted_s == pytest.approx(1e-6 + 12288 / 1e9, rel=1e-12)
    assert after.total.predicted_s == pytest.approx(1.5 * (1e-6 + 12288 / 1e9), rel=1e-12)
    assert after.total.host_s == pytest.approx(1.5e-6, rel=1e-12)
    # a chain of another family leaves it as it was
    other = calibrated(POINTS, HOST, chains=(chain(1.5, 4096, ("conv",)),))
    _, same = flopscope.estimate.roofline(Add(), x, hardware=other)
    assert same.total.predicted_s == pytest.approx(before.total.predicted_s, rel=1e-12)


def test_a_chain_factor_never_takes_a_call_below_its_bound() -> None:
    slow = dataclasses.replace(FAST, memory_bandwidth=1e6)  # 12288 B: a bound of 12.288 ms
    hw = calibrated(POINTS, HOST, slow, chains=(chain(0.1, 4096),))
    _, est = flopscope.estimate.roofline(Add(), torch.randn(1024), hardware=hw)
    assert est.total.predicted_s >= est.total.time_s
    assert est.total.predicted_s == pytest.approx(0.1e-6 + 12288 / 1e6, rel=1e-9)


def test_chains_round_trip_through_a_profile_file(tmp_path: Path) -> None:
    hw = calibrated(POINTS, HOST, chains=(chain(1.25, 8192, ("conv", "normalization")),
                                          dataclasses.replace(chain(1.5, 4096), reduction=9.0)))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(hw.to_dict()))
    (loaded,) = load_hardware(path)
    assert loaded == hw
    # a calibration written before chains has none (factor 1)
    data = hw.to_dict()
    del data["calibration"]["chains"]
    old = Hardware.from_dict(data).calibration
    assert old is not None and old.chains == () and old.chain_factor("conv", 8192) == 1.0


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.pop("predicted_s"), "chain 0 is malformed.*predicted_s"),
    (lambda c: c.update(families=["matrix"]), "chain 0: unknown family matrix"),
    (lambda c: c.update(seconds=0), "chain 0: seconds, predicted_s and activation_bytes must be"),
])
def test_a_bad_chain_is_a_clear_error(change: object, message: str) -> None:
    data = calibrated(POINTS, HOST, chains=(chain(1.0, 4096),)).to_dict()
    change(data["calibration"]["chains"][0])  # type: ignore[operator]
    with pytest.raises(UsageError, match=f"cal.json: calibration: {message}"):
        Hardware.from_dict(data, where="cal.json")
    data["calibration"]["chains"] = {"not": "a list"}
    with pytest.raises(UsageError, match="cal.json: calibration: chains must be a list"):
        Hardware.from_dict(data, where="cal.json")


def two_threads(hw: Hardware) -> Hardware:
    """``hw`` with its calibration at 2 threads."""
    assert hw.calibration is not None
    return dataclasses.replace(hw, calibration=dataclasses.replace(hw.calibration, threads=2))


def test_chain_points_predict_each_chain_from_the_points_alone() -> None:
    # a calibration at 2 threads; its chains are ignored: the points alone predict
    hw = two_threads(calibrated(POINTS, HOST, chains=(chain(9.0, 4096),)))
    timed: list[int] = []
    # three passes over the n chains, each pass timing every chain once
    n = len(CONV_CHAINS) + len(LINEAR_CHAINS)
    runs = iter([2e-3] * n + [9e-3] * n + [1e-3] * n)  # pass 1: 2 ms, 2: 9 ms, 3: 1 ms

    def timer(fn: object, device: str) -> float:
        timed.append(1)
        return next(runs)

    chains = chain_points(hw, "cpu", timer, passes=3)  # type: ignore[arg-type]
    assert len(chains) == n and len(timed) == 3 * n
    assert {c.seconds for c in chains} == {2e-3}  # the median of 2, 9 and 1 ms
    first = chains[0]  # conv3x3 24 channels of 64 x 64, three blocks of three layers
    # four calls a block: the eval-mode batch norm's output and an empty tensor beside it
    assert first.what == "conv3x3+bn+relu 24x64x64 x3" and first.calls == 12
    assert first.activation_bytes == 24 * 64 * 64 * 4 and first.seconds == 2e-3
    assert first.families == ("conv", "elementwise", "normalization")
    assert first.reduction == 24 * 3 * 3  # a dense 3x3 convolution's input channels x window
    assert chains[-1].reduction == 896  # the last linear layer's input width
    # the points' prediction of the same chain counted by flopscope, without the chains
    torch.manual_seed(0)
    layers = [m for _ in range(3) for m in (nn.Conv2d(24, 24, 3, padding=1, bias=False),
                                            nn.BatchNorm2d(24), nn.ReLU(inplace=True))]
    with torch.no_grad():  # a forward, as the calibration runs it
        _, est = flopscope.estimate.roofline(nn.Sequential(*layers).eval(),
                                             torch.randn(1, 24, 64, 64),
                                             hardware=two_threads(calibrated(POINTS, HOST)))
    assert first.predicted_s == pytest.approx(est.total.predicted_s, rel=1e-12)
    assert chains[-1].families == ("matmul", "normalization", "special")
    # none at one thread (no parallel speed-up to lose), on CUDA (the device's own
    # timeline), without points
    assert chain_points(calibrated(POINTS, HOST), "cpu", timer) == ()  # type: ignore[arg-type]
    assert chain_points(hw, "cuda", timer) == ()  # type: ignore[arg-type]
    assert chain_points(FAST, "cpu", timer) == ()  # type: ignore[arg-type]


@pytest.mark.slow  # a whole calibration at 2 threads: 1-4 min here; the chains' logic at 2 threads
# and none at one is the test above's, a whole 1-thread calibration test_predict.py's
def test_calibrate_times_the_chains_at_two_threads() -> None:
    before = torch.get_num_threads()
    hw = calibrate(get_hardware("epyc-9654"), device="cpu", threads=2, budget_s=0.0005,
                   chains=True)
    assert torch.get_num_threads() == before  # put back
    cal = hw.calibration
    assert cal is not None and cal.threads == 2
    assert len(cal.chains) == len(CONV_CHAINS) + len(LINEAR_CHAINS)
    assert all(c.seconds > 0 and c.predicted_s > 0 for c in cal.chains)
    assert {f for c in cal.chains for f in c.families} == {
        "conv", "elementwise", "normalization", "matmul", "special"}
