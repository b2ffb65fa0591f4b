"""The GPU calibration's host time in a model's mixed sequence of operators (issue 29): the tiny
calls timed in rotation and the chains of layers timed eagerly (benchmarks/gpu_calib.py), the
profile made from them (benchmarks/gpu_profile.py), and what the prediction does with them. All
in the check's dry mode or on the meta device: no GPU here. A CPU profile's predictions are
unchanged by the shared code this touched."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks import gpu_calib, gpu_predict, gpu_profile, gpu_tables
from torch import nn

from flopscope.estimate import load_hardware
from flopscope.estimate.calibration import GRAPH_CLOCK
from flopscope.estimate.chains import chain_point
from flopscope.estimate.families import reduction_length
from flopscope.estimate.predict import predictor
from flopscope.estimate.profile import Hardware
from flopscope.estimate.roofline import CallLog
from flopscope.run import count

RESULTS = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "results"
SUMMARY = {"date": "2026-11-27 13:57 UTC", "device": "NVIDIA H200", "torch": "2.11.0+cu130",
           "cuda": "13.0"}


def test_the_new_calib_groups_run_dry_and_make_rows() -> None:
    rotation = gpu_calib.host_rotation_points("cpu", dry=True)
    assert [r["op"] for r in rotation] == list(gpu_calib.tiny_calls("cpu"))  # all 18
    for r in rotation:
        assert r["loop_s_per_call"] > 0 and r["alone_s_per_call"] > 0
        assert r["rotation_over_alone"] == r["rotation_s_per_call"] / r["alone_s_per_call"]
    rows = gpu_calib.chain_rows("cpu", dry=True)
    # the dry subset of the chains: two convolution chains, a token chain, a residual chain
    assert [r["what"] for r in rows] == [
        "conv3x3+bn+relu 16x16x16 x3", "depthwise3x3+bn+relu 32x16x16 x3",
        "linear+layernorm+gelu 8x64 x3", "layernorm+linear+add 8x64 x3"]
    assert all(r["seconds"] > 0 and "graph_s" not in r for r in rows)  # no graph without CUDA
    # the profile rebuilds every one of them on the meta device (the dry chains are among the
    # GPU's by name) and keeps those it finds host-bound
    hw = gpu_profile.calibrated(_raw(chains=[{**r, "graph_s": 1e-9} for r in rows]),
                                     SUMMARY)
    assert hw.calibration is not None
    assert [c.what for c in hw.calibration.chains] == [r["what"] for r in rows]
    # a chain whose device time (its graph's replay) is over half its eager time is not
    # host-bound: dropped
    slow = [{**rows[0], "graph_s": 0.6 * rows[0]["seconds"]}]
    cal = gpu_profile.calibrated(_raw(chains=slow), SUMMARY).calibration
    assert cal is not None and cal.chains == ()


def _raw(rotation: list[dict[str, Any]] | None = None,
         chains: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A calib as benchmarks/gpu_calib.py writes it, with chosen host times: a linear layer's
    tiny call 10 us in a loop, a layer norm's 8, a GELU's 6, a view's 2, a module call 2; one
    graph-timed point for each family (1 us), so every call is calibrated."""
    raw: dict[str, Any] = {
        "timing": GRAPH_CLOCK, "tf32_matmul": False,
        "host": [{"op": "linear", "host_s_per_call": 10e-6, "aten": ["t", "addmm"]},
                 {"op": "layer_norm", "host_s_per_call": 8e-6, "aten": ["native_layer_norm"]},
                 {"op": "gelu", "host_s_per_call": 6e-6, "aten": ["gelu"]},
                 {"op": "view", "host_s_per_call": 2e-6, "aten": ["view"]}],
        "module": {"module_call_s": 2e-6},
        "gemm": [{"dtype": "float32", "m": 8, "n": 64, "k": 64, "seconds": 1e-6}],
        "stream": [{"op": op, "dtype": "float32", "numel": 1024, "seconds": 1e-6}
                   for op in ("layer_norm", "gelu")],
        "attention": [], "conv": []}
    if rotation is not None:
        raw["host_rotation"] = rotation
    if chains is not None:
        raw["chains"] = chains
    return raw


def _host_device(hw: Hardware) -> tuple[float, float]:
    """(host, device) seconds predicted for one block of a linear layer, a layer norm and a
    GELU over 8 x 64 tokens, counted on the meta device."""
    log = CallLog()
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()).to("meta")
    with torch.no_grad():
        count(model, torch.empty(8, 64, device="meta"), observers=[log])
    total = log.estimate(hw).total
    return total.host_s, total.predicted_s - total.host_s


def test_a_mixed_sequence_costs_the_host_what_the_rotation_and_the_chains_say() -> None:
    loop = gpu_profile.calibrated(_raw(), SUMMARY)
    rotated = [{"op": "linear", "rotation_s_per_call": 15e-6},
               {"op": "layer_norm", "rotation_s_per_call": 12e-6},
               {"op": "gelu", "rotation_s_per_call": 9e-6},
               {"op": "view", "rotation_s_per_call": 3e-6}]
    mixed = gpu_profile.calibrated(_raw(rotated), SUMMARY)
    assert mixed.calibration is not None
    assert mixed.calibration.host_op_s["addmm"] == 15e-6  # the rotation's, not the loop's
    assert mixed.calibration.host_s["normalization"] == 12e-6
    # the block's calls: t (a view; the Sequential's and the Linear's module calls), addmm,
    # native_layer_norm (the LayerNorm's module call), gelu (the GELU's).
    # in a loop: (2 + 2 x 2) + 10 + (8 + 2) + (6 + 2) = 34 us
    host, device = _host_device(loop)
    assert host == pytest.approx(34e-6, rel=1e-12)
    # in rotation: (3 + 2 x 2) + 15 + (12 + 2) + (9 + 2) = 47 us: 13 us more, the rotation's
    # (3 - 2) + (15 - 10) + (12 - 8) + (9 - 6)
    host_mixed, device_mixed = _host_device(mixed)
    assert host_mixed == pytest.approx(47e-6, rel=1e-12)
    assert device_mixed == device  # the device's time is the points'
    # a chain of three such blocks measured eagerly at twice what the rotation predicts for it
    what = "linear+layernorm+gelu 8x64 x3"
    module, x = next((m, x) for w, m, x in gpu_calib_chains() if w == what)
    predicted = chain_point(mixed, what, module, x, 1.0)[0].predicted_s
    chained = gpu_profile.calibrated(
        _raw(rotated, [{"what": what, "calls": 100, "seconds": 2 * predicted}]), SUMMARY)
    cal = chained.calibration
    assert cal is not None and [c.predicted_s for c in cal.chains] == [predicted]
    assert set(cal.chains[0].families) == {"matmul", "normalization", "special"}
    # its factor, 2, multiplies the host time of its families' calls (not the view's, which
    # moves no byte): 7 + 2 x 15 + 2 x 14 + 2 x 11 = 87 us; on a GPU the device time stays the
    # graph-timed points' (the chain, eager and host-bound, measured the host)
    host_chained, device_chained = _host_device(chained)
    assert host_chained == pytest.approx(87e-6, rel=1e-12)
    assert device_chained == pytest.approx(device, rel=1e-12)


def test_the_validation_predicts_beside_the_profiles_without_them(tmp_path: Path) -> None:
    """benchmarks/gpu_predict.py predicts each case with the profile made from the run's calib
    and, beside it, the ones the same calib makes without the mixed-operator host times
    (``loop_host``) and without the chains (``rotation_only``): all against the same measured
    eager time (the device's host varies between runs)."""
    rotated = [{"op": op, "rotation_s_per_call": s}
               for op, s in (("linear", 15e-6), ("layer_norm", 12e-6), ("gelu", 9e-6),
                             ("view", 3e-6))]
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    (tmp_path / "calib.json").write_text(json.dumps({**_raw(), "complete": True}))
    assert gpu_predict.baseline_profiles(tmp_path / "calib.json") == {}  # nothing to compare
    (tmp_path / "calib.json").write_text(json.dumps({**_raw(rotated), "complete": True}))
    only = gpu_predict.baseline_profiles(tmp_path / "calib.json")
    assert list(only) == ["loop_host"]  # no chains: no rotation_only
    assert only["loop_host"].calibration is not None
    assert only["loop_host"].calibration.host_op_s["addmm"] == 10e-6  # the tight loop's
    # with a chain measured at 2x its prediction as well: three profiles to compare
    what = "linear+layernorm+gelu 8x64 x3"
    module, x = next((m, x) for w, m, x in gpu_calib_chains() if w == what)
    rotation = gpu_profile.calibrated(_raw(rotated), SUMMARY)
    chain = [{"what": what, "calls": 100,
              "seconds": 2 * chain_point(rotation, what, module, x, 1.0)[0].predicted_s}]
    (tmp_path / "calib.json").write_text(json.dumps({**_raw(rotated, chain), "complete": True}))
    both = gpu_predict.baseline_profiles(tmp_path / "calib.json")
    assert list(both) == ["loop_host", "rotation_only"]
    mixed = gpu_profile.calibrated(_raw(rotated, chain), SUMMARY)
    block = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())
    row = gpu_predict.predict_one(block, torch.randn(8, 64), False, mixed, True, both)
    # the host times of the test above, 87, 34 and 47 us, predicted for the calls counted on
    # the CPU here (dry)
    assert row["predicted_host_s"] == pytest.approx(87e-6, rel=1e-12)
    assert row["loop_host"]["predicted_host_s"] == pytest.approx(34e-6, rel=1e-12)
    assert row["rotation_only"]["predicted_host_s"] == pytest.approx(47e-6, rel=1e-12)
    # the tables put them side by side: ratios 1.1, 0.8 and 0.9 are errors of 10%, 20%, 10%
    (tmp_path / "predict.json").write_text(json.dumps({"profile": "p", "rows": [
        {"ratio": 1.1, "held_out": False, "predicted_device_s": 1.0,
         "loop_host": {"ratio": 0.8}, "rotation_only": {"ratio": 0.9}}]}))
    assert gpu_tables.predict_summary(tmp_path)[-3:] == [
        "| predict.json | p | 10% / 10% (1) | - | - | - |",
        "| predict.json, loop_host | the same calib without its mixed-operator host times | "
        "20% / 20% (1) | - | - | - |",
        "| predict.json, rotation_only | the same calib without its chains | "
        "10% / 10% (1) | - | - | - |"]


def gpu_calib_chains() -> list[tuple[str, nn.Module, torch.Tensor]]:
    """The GPU's chains on the meta device, as benchmarks/gpu_profile.py rebuilds them."""
    from flopscope.estimate.chains import chains

    return chains("meta", **gpu_calib.GPU_CHAINS)


def test_a_cpu_calibrations_chain_factor_still_scales_host_and_device() -> None:
    """The factor's host-only use is the GPU's: a CPU calibration with the same chain scales
    both parts (one timeline)."""
    (cpu,) = load_hardware(RESULTS / "prediction_profile_2threads_chains.json")
    assert cpu.calibration is not None and cpu.calibration.chains
    alone = dataclasses.replace(cpu.calibration, chains=())
    log = CallLog()
    with torch.no_grad():
        count(nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()),
              torch.randn(8, 64), observers=[log])
    bound = 1e-12  # below every prediction: the bound does not decide
    for rec in log.records[1:]:  # the calls that move bytes
        with_chains = predictor(cpu.calibration).call(rec, bound)
        without = predictor(alone).call(rec, bound)
        k = cpu.calibration.chain_factor(with_chains.family, rec.bytes_written,
                                         reduction_length(rec))
        assert k != 1.0
        assert with_chains.host_s == pytest.approx(without.host_s * k, rel=1e-12)
        assert with_chains.device_s == pytest.approx(without.device_s * k, rel=1e-12)


# total predicted seconds and host seconds of three counted models (random weights; shapes
# decide), with the two CPU profiles of benchmarks/prediction_validation, computed by the code
# at e4cc780 (before the GPU host's chains: the chain factor's host-only use on a GPU
# calibration, chains.chain_point) and required unchanged; since round 11 (serve11) a view no
# longer touches its input's storage in the cache model (a linear's weight.t()), so the bytes
# moved before a call (its host time's growth) no longer count the viewed storages:
# mobilenet_v3_small's totals moved by -0.024% (host -0.067%), resnet18's by -5e-8, the encoder
# layer's not at all; since round 14 a cold product's floor is on its bytes at the streamed
# products' bytes per second, not on its FLOPs at their FLOP rate (Predictor._product_floor):
# the encoder layer's 64 x 64 products (cold weights, intensity about 8, below the streamed
# points') +17.8% and +6.2% (1 and 2 threads), mobilenet_v3_small +3.6% and +1.7%, resnet18
# +0.57% and +0.34%, the host times unchanged
BEFORE = {
    ("prediction_profile.json", "resnet18"): (0.01303522997360026, 0.0008212394593891533),
    ("prediction_profile.json", "mobilenet_v3_small"): (0.0042899694672311,
                                                        0.001463506235235723),
    ("prediction_profile.json", "encoder_layer"): (7.71913869856205e-05,
                                                   4.1952550000012855e-06),
    ("prediction_profile_2threads_chains.json", "resnet18"): (0.007688458291765162,
                                                              0.0005603234099097224),
    ("prediction_profile_2threads_chains.json", "mobilenet_v3_small"): (
        0.0028057271707502725, 0.0011565104212645095),
    ("prediction_profile_2threads_chains.json", "encoder_layer"): (3.2892132561398256e-05,
                                                                   2.0811866042418594e-06),
}


@pytest.mark.parametrize(("profile", "name"), sorted(BEFORE))
def test_cpu_predictions_are_unchanged(profile: str, name: str) -> None:
    import torchvision

    make, shape = {
        "resnet18": (torchvision.models.resnet18, (1, 3, 64, 64)),
        "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small, (1, 3, 64, 64)),
        "encoder_layer": (lambda: nn.TransformerEncoderLayer(64, 4, 128, batch_first=True),
                          (2, 16, 64)),
    }[name]
    (hw,) = load_hardware(RESULTS / profile)
    log = CallLog()
    with torch.no_grad():
        count(make().eval(), torch.randn(*shape), observers=[log])
    total = log.estimate(hw).total
    assert (total.predicted_s, total.host_s) == BEFORE[(profile, name)]


def test_chains_at_a_models_sizes_set_the_factor_of_calls_of_their_size() -> None:
    """The chains at a batch-1 model's sizes (``chains_sized``) join the tiny ones in the
    profile; a call takes the factor of the chains of its own size and reduction length
    (Calibration.chain_factor), so a model's large calls no longer take the tiny chains'."""
    from flopscope.estimate.chains import chains

    built = {w: (m, x) for table in (gpu_calib.GPU_CHAINS, gpu_calib.GPU_CHAINS_SIZED)
             for w, m, x in chains("meta", **table)}
    rotated = [{"op": "linear", "rotation_s_per_call": 15e-6},
               {"op": "layer_norm", "rotation_s_per_call": 12e-6},
               {"op": "gelu", "rotation_s_per_call": 9e-6}]
    rotation = gpu_profile.calibrated(_raw(rotated), SUMMARY)

    def measured(what: str, times: float) -> dict[str, Any]:
        module, x = built[what]
        predicted = chain_point(rotation, what, module, x, 1.0)[0].predicted_s
        return {"what": what, "calls": 100, "seconds": times * predicted, "graph_s": 1e-9}

    tiny, large = "linear+layernorm+gelu 8x64 x3", "linear+layernorm+gelu 256x768 x3"
    raw = {**_raw(rotated, [measured(tiny, 1.0)]), "chains_sized": [measured(large, 3.0)]}
    cal = gpu_profile.calibrated(raw, SUMMARY).calibration
    assert cal is not None and [c.what for c in cal.chains] == [tiny, large]
    # a linear layer's call at each chain's size (8 x 64 and 256 x 768 float32 outputs) and
    # reduction (64, 768) takes that chain's factor: the other is 8.6 octaves away in size and
    # 3.6 in reduction, its weight exp(-(8.6^2 + 3.6^2) / 2), about 1e-19
    assert cal.chain_factor("matmul", 8 * 64 * 4, 64) == pytest.approx(1.0, rel=1e-9)
    assert cal.chain_factor("matmul", 256 * 768 * 4, 768) == pytest.approx(3.0, rel=1e-9)
    # the validation predicts beside the profile without them (and the earlier baselines)
    assert list(gpu_profile.baselines(raw)) == ["loop_host", "rotation_only", "tiny_chains"]
    assert "chains_sized" not in gpu_profile.baselines(raw)["tiny_chains"]
