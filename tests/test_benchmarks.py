"""The benchmark scripts run end to end on tiny models (no timings are checked here)."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level package of the repository, not installed

from benchmarks import (  # noqa: E402
    agreement,
    bytecodes,
    document,
    models,
    overhead,
    repeated_counts,
    run,
    scale,
    tools,
)

THIRD_PARTY = {"thop": "thop", "fvcore": "fvcore", "ptflops": "ptflops",
               "ptflops-aten": "ptflops", "calflops": "calflops"}
TINY_LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


def _need(tool: str) -> None:
    module = THIRD_PARTY.get(tool)
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[bench]')")


@pytest.mark.parametrize("tool", list(tools.TOOLS))
def test_every_tool_counts_the_tiny_cnn(tool: str) -> None:
    _need(tool)
    bench = models.tiny_benches()[0]
    model, inputs = bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu"))
    result = tools.measure(tool, model, inputs, False)
    assert result.error == ""
    # conv 3->8 3x3 on 16x16 (55,296 MACs) and linear 8->10 (80): every tool sees at least these
    assert result.macs is not None and result.macs >= 55_376


def test_backward_is_unsupported_not_an_error_for_forward_only_tools() -> None:
    bench = models.tiny_benches()[0]
    model, inputs = bench.build(torch.device("cpu")), bench.inputs(torch.device("cpu"))
    result = tools.measure("thop", model, inputs, True)
    assert result.macs is None and result.error.startswith("n/a")


def test_agreement_row_of_a_tiny_transformer() -> None:
    bench = models.tiny_benches()[1]
    row = agreement.measure_model(bench, ["flopscope", "FlopCounterMode"])
    assert row["forward"]["flopscope"] > 0
    assert row["backward"]["flopscope"] > row["forward"]["flopscope"]
    assert row["flopscope_uncounted"] == {}
    assert sum(row["where"].values()) == row["forward"]["flopscope"]


def test_overhead_rounds_on_the_tiny_cnn() -> None:
    result = overhead.measure(models.tiny_benches()[0], ["flopscope", "FlopCounterMode"], rounds=2,
                              log=lambda _: None)
    assert set(result["tools"]) == {"flopscope", "FlopCounterMode", overhead.FLOOR}
    assert all(len(t["ratios"]) == 2 for t in result["tools"].values())


def test_bytecodes_per_function_of_a_counted_forward() -> None:
    codes, calls, ops = bytecodes.measure("resnet18", 32)
    # the dispatch mode's handler runs once per operator call the report counts, and the module
    # call hook once per module call: resnet18's 68 modules (the root included) once each, and
    # each of its 8 blocks calls its ReLU a second time; every one is a usual call (one
    # Counter, one thread, no module rule), seen by core/usual_calls.py's one frame, none by
    # the tracker's enter
    assert calls[("flopscope/core/mode.py", "__torch_dispatch__")] == ops > 0
    assert calls[("flopscope/core/module_calls.py", "_call")] == 68 + 8
    assert calls[("flopscope/core/usual_calls.py", "call")] == 68 + 8
    assert calls.get(("flopscope/core/tracker.py", "enter"), 0) == 0
    # every call on real tensors is keyed, from its template after the warm-up blocks
    assert calls[("flopscope/core/call_guards.py", "call_key")] == ops


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """The test session's own objects frozen: the benchmark's full collections then scan what it
    made, not the whole suite's heap (the small model's test took 8 s alone, 30 s late in a run)."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_repeated_counts_on_a_small_model(frozen_heap: None) -> None:
    result = repeated_counts.measure("resnet18", 32, 2, ["flopscope", overhead.FLOOR])
    assert set(result["tools"]) == {"flopscope", overhead.FLOOR}
    assert result["tools"]["flopscope"]["cycles_per_call"] == 0  # 265 before the weak callbacks
    assert all(len(t["ratio"]) == 2 for t in result["tools"].values())


def test_repeated_counts_sees_a_cycle(frozen_heap: None) -> None:
    def cycle() -> None:
        a: list[object] = []
        a.append(a)

    assert repeated_counts.cycles(cycle) == 1


@pytest.mark.parametrize("tool", scale.SCALE_TOOLS)
def test_scale_worker_on_a_tiny_decoder(tool: str) -> None:
    row = scale.worker(tool, 8, TINY_LLAMA)
    assert row["macs"] > 0 and row["seconds"] > 0 and row["peak_above_import_mib"] >= 0


def test_run_writes_the_document(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "benchmarks.md"
    code = run.main(["--quick", "--sections", "agreement,overhead", "--rounds", "1",
                     "--results", str(tmp_path / "results"), "--out", str(out)])
    assert code == 0
    text = out.read_text()
    for heading in ("## Units: everything in MACs", "## Agreement", "## Uncounted operators",
                    "## Overhead"):
        assert heading in text
    assert "tiny-llama" in text


def test_document_from_no_results(tmp_path: Path) -> None:
    document.write(tmp_path / "none", tmp_path / "benchmarks.md")
    assert (tmp_path / "benchmarks.md").read_text().startswith("# Benchmarks")


def test_unknown_section_is_a_usage_error() -> None:
    with pytest.raises(SystemExit, match="2"):
        run.main(["--sections", "bogus"])


def test_shape_only_benchmark_on_the_tiny_cnn() -> None:
    from benchmarks import shape_only

    row = shape_only.measure_model("tiny-cnn", rounds=1, log=lambda s: None)
    assert row["macs"] == row["shape_only_macs"] > 0
    assert set(row["ratios"]) == set(shape_only.TOOLS)
    assert row["calls"] > 0
    assert "| tiny-cnn |" in shape_only.markdown({"models": [row], "cold": [], "scale": [],
                                                  "load_before": "0", "load_after": "0"})


# --- the validation page's shared plot axes, its zoo list and the reduced-input variant ---------

def test_decades_around_the_values() -> None:
    from benchmarks import plotting

    # 2e3 / 1.5 = 1,333 -> 1e3 below; 7e6 * 1.5 = 1.05e7 -> 1e8 above
    assert plotting.decades([2e3, 7e6]) == (1e3, 1e8)
    assert plotting.decades([5e5, 6e5]) == (1e5, 1e6)
    with pytest.raises(ValueError, match="log axes need positive values"):
        plotting.decades([0.0, 10.0])


def test_counted_vs_measured_axes_are_one_setup(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plotting

    plt = plotting.pyplot()
    assert plt is not None
    fig, ax = plt.subplots()
    assert plotting.counted_vs_measured_axes(ax, [2e3, 7e6], title="t") == (1e3, 1e8)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert ax.get_xlim() == ax.get_ylim() == (1e3, 1e8)
    line = ax.get_lines()[0]  # y = x, first in the legend
    assert line.get_label() == "y = x" and list(line.get_xdata()) == list(line.get_ydata())
    plotting.save(plt, fig, tmp_path / "sub" / "p.png")
    assert (tmp_path / "sub" / "p.png").stat().st_size > 1000


def test_every_torchvision_classifier_is_on_the_page() -> None:
    pytest.importorskip("torchvision")
    import torchvision.models as tvm
    from benchmarks import validation_page as page
    from benchmarks.validation_zoo import VARIANTS

    zoo = [s for g in page.groups() if g.kind == "zoo" for s in g.sources]
    names = set(tvm.list_models(module=tvm))
    variant_of = {v.source: name for name, v in VARIANTS.items()}
    listed = [variant_of.get(s, s.removeprefix("torchvision:")) for s in zoo]
    assert sorted(listed) == sorted(names)  # each classifier once, as itself or as its variant
    assert "benchmarks/validation_zoo.py:vit_h_14_112" in zoo


def test_unmeasured_zoo_models_have_a_reason() -> None:
    from benchmarks import validation_page as page

    rows = [
        {"source": "torchvision:swin_b", "model": "swin_b", "pending": True, "ratio": None},
        {"source": "benchmarks/validation_zoo.py:vit_h_14_112",
         "model": "vit_h_14 (image_size=112)", "pending": False, "ratio": 1.2},
    ]
    text = "\n".join(page.not_measured(rows))
    assert "**vit_h_14 is measured as vit_h_14 (image_size=112)**, not at its own input size: " \
           "at 224x224 it is 632 M parameters" in text
    assert "**Not measured yet** (1): swin_b -- the resumable sweep has not reached them" in text
    # once the model is measured at its own input too, the variant needs no reason
    rows.append({"source": "torchvision:vit_h_14", "model": "vit_h_14", "pending": False,
                 "ratio": 1.03})
    assert "vit_h_14 is measured as" not in "\n".join(page.not_measured(rows))
    assert page.zoo_label("benchmarks/validation_zoo.py:vit_h_14_112") == "vit_h_14 (image_size=112)"
    assert page.model_family(page.zoo_label("benchmarks/validation_zoo.py:vit_h_14_112")) == "vit"


def test_vit_h_14_at_112_is_the_same_network_on_fewer_tokens() -> None:
    pytest.importorskip("torchvision")
    from benchmarks.validation_zoo import vit_h_14_model

    import flopscope

    with torch.device("meta"):
        model = vit_h_14_model(112)
    report = flopscope.count(model, torch.empty(1, 3, 112, 112, device="meta"), warn=False)
    # 65 tokens (64 patches + class), width 1280, MLP 5120, 32 layers, per layer:
    #   qkv 65*1280*3840 + scores and values 2*65*65*1280 + out 65*1280*1280 + MLP 2*65*1280*5120
    #   = 319,488,000 + 10,816,000 + 106,496,000 + 851,968,000 = 1,288,768,000
    # patch embedding 64*1280*(3*14*14) = 48,168,960; head 1280*1000 = 1,280,000
    assert report.macs == 32 * 1_288_768_000 + 48_168_960 + 1_280_000 == 41_290_024_960
    # the same parameters as at 224x224 but for the position embedding: (257 - 65) * 1280 fewer
    assert report.params == 632_045_800 - (257 - 65) * 1280


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"), reason="slow tier: FLOPSCOPE_SLOW=1")
@pytest.mark.parametrize(("name", "explained"), [
    # bilinear x2, 16 x 32 x 32 -> 16 x 64 x 64: output H + W = 128 selects the vectorised
    # channels-last kernel: 1 multiply + 3 FMAs = 7 per output element (65,536 of them), 4 weight
    # products per output pixel (4,096), 5 per source-index computation (64 rows x (1 + 64))
    ("interpolation__bilinear_x2__c16hw32", 7 * 65_536 + 4 * 4_096 + 5 * 64 * 65),
    # 32 x 64 x 64 -> 32 x 128 x 128: H + W = 256, the generic kernel: 3 multiplies + 3 FMAs = 9
    # per output element (524,288), plus its index/weight tables (1,282 measured)
    ("interpolation__bilinear_x2__c32hw64", 9 * 524_288),
    # cdist p = 2, 64 x 16 against 64 x 16 (4,096 pairs): the count (160,768), MKL's sqrt at 21
    # per pair instead of 1, the SSE GEMM's 2K + 5 per output, its alpha-scaled packing of the
    # 64 x 18 operand, the cascade sum's 65 per reduced row (2 x 64 rows)
    ("distance__cdist_p2__m64d16", 160_768 + 20 * 4_096 + 5 * 4_096 + 64 * 18 + 65 * 128),
])
def test_the_residues_of_the_validation_page_are_accounted_for(name: str, explained: int) -> None:
    from flopscope.measure import MeasureRequest, measure_request
    from flopscope.measure.valgrind import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"valgrind backend unavailable: {unavailable_reason()}")
    result = measure_request(MeasureRequest(f"benchmarks/validation_ops.py:{name}",
                                            dtype="float64"), backend="valgrind")
    # what is left is per-call setup outside the loops (scales, index tables, the timer's reads)
    assert 0 <= result.comparison.measured_flops - explained <= 1_300, result.comparison


def test_thread_context_strips_the_activations_and_only_them() -> None:
    from benchmarks.thread_context import is_activation_op, strip_activations
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(inplace=True),
                          nn.Sequential(nn.Linear(4, 4), nn.Hardswish(), nn.ReLU6()), nn.GELU())
    stripped = strip_activations(model)
    kinds = [type(m).__name__ for m in stripped.modules()]
    # 3 activations became identities; the GELU (not one of them) and the layers stay
    assert kinds.count("Identity") == 3 and "GELU" in kinds and "Conv2d" in kinds
    assert kinds.count("ReLU") == kinds.count("Hardswish") == kinds.count("ReLU6") == 0
    assert type(model[1]).__name__ == "ReLU"  # the original is untouched
    assert is_activation_op("aten.relu_.default") and is_activation_op("aten.hardswish_.default")
    assert not is_activation_op("aten.gelu.default")


def test_thread_context_spread_over_processes() -> None:
    from benchmarks.thread_context import spread

    # three processes: 10, 13 and 11 ms -> min 10, median 11, max 13, max / min = 13 / 10 = 1.3
    out = spread([{"m": 0.010}, {"m": 0.013}, {"m": 0.011}])
    assert out["m"]["min_s"] == 0.010 and out["m"]["median_s"] == 0.011
    assert out["m"]["max_s"] == 0.013 and out["m"]["max_over_min"] == pytest.approx(1.3, rel=1e-12)




def test_diagnosis_keeps_large_arguments_as_their_layout() -> None:
    """The diagnosis keeps a large floating-point argument as its layout (a training step's
    arguments cloned whole are gigabytes) and makes it again for the replay: same size, stride,
    offset and dtype, values in [0.5, 1.5); small and integer arguments are cloned."""
    from benchmarks import prediction_diagnosis as diag

    big = torch.randn(300, 1024)  # 300 x 1024 x 4 bytes = 1.17 MiB >= 1 MiB: held
    view = big.t()[1:]  # a strided view with an offset: stride (1, 1024), offset 1024
    held = diag._hold(view)
    assert isinstance(held, diag.Held)
    made = diag._made(held)
    assert (made.shape, made.stride(), made.storage_offset(), made.dtype) == (
        view.shape, view.stride(), view.storage_offset(), view.dtype)
    assert bool(((made >= 0.5) & (made < 1.5)).all())
    expanded = torch.ones(1, 1024).expand(512, 1024)  # stride 0: one row of storage
    assert diag._made(diag._hold(expanded)).stride() == (0, 1)
    small, index = torch.randn(8), torch.arange(300_000)  # small, and integer (2.3 MiB)
    assert torch.equal(diag._hold(small), small) and diag._hold(small) is not small
    assert torch.equal(diag._hold(index), index)


def test_diagnosis_rows() -> None:
    """One row per call of a tiny model, each timed in the model, isolated and predicted."""
    from benchmarks import prediction_diagnosis as diag

    from flopscope.estimate import load_hardware

    model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.ReLU())
    x = torch.randn(500, 600)  # 1.14 MiB: replayed from its layout

    def step() -> None:
        with torch.no_grad():
            model(x)

    (hw,) = load_hardware(ROOT / "benchmarks/results/prediction_validation_round14_profile.json")
    result = diag.diagnose("tiny", step, hw)
    ops = [r["op"] for r in result["rows"]]
    assert "aten.addmm.default" in ops and "aten.relu.default" in ops
    assert all(r["isolated_s"] > 0 and r["in_model_s"] > 0 for r in result["rows"]
               if r["family"] != "view")


def test_update_faults_measures_and_predicts_a_tiny_decoders_step() -> None:
    from benchmarks import update_faults

    profile = ROOT / "benchmarks" / "results" / "comm_validation_2ranks_rt_round17_profile_alone.json"
    tiny_config = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1)
    run = update_faults.measure(profile, config=tiny_config, samples=2)
    # embedding and head 64 x 16, q and o 16 x 16, k and v 8 x 16, the MLP's three 32 x 16,
    # two norms and the final one of 16
    assert (run["parameters"], run["largest_elements"]) == (12, 1024)
    assert run["elements"] == 2 * 1024 + 2 * 256 + 2 * 128 + 3 * 512 + 3 * 16
    assert len(run["step_s"]) == 2 and set(run["largest_in_step_s"]) == {"sqrt", "div"}
    starts = [run["predicted"][str(t)] for t in update_faults.THRESHOLDS]
    # tiny tensors come from the free chunks: no replay start maps any
    assert [s["faulted_bytes"] for s in starts] == [0, 0, 0]
    assert all(s["predicted_s"] > 0 for s in starts)
    shard = update_faults.shard_update(profile, config=tiny_config, samples=2)
    assert shard["measured_s"] > 0 and shard["ratio"] == shard["predicted_s"] / shard["measured_s"]
    tiny = update_faults.tiny_update(profile, parameters=3, samples=2)
    assert tiny["parameters"] == 3 and set(tiny) == {"parameters", "plain", "dtensor"}
    assert all(tiny[k]["measured_s"] > 0 and tiny[k]["predicted_s"] > 0
               for k in ("plain", "dtensor"))


def test_update_faults_replays_a_training_steps_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import models, update_faults

    monkeypatch.setattr(models, "transformer_benches", models.tiny_benches)
    run = update_faults.training_faults("tiny-llama", steps=2)
    assert run["model"] == "tiny-llama" and len(run["measured_faults"]) == 2
    # a tiny model's allocations are all under the 256 KiB the replay tracks: none mapped
    assert run["replayed_bytes"] == {str(t): 0 for t in update_faults.THRESHOLDS}
