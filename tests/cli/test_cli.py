"""The command line: `main([...])` with exit codes, stdout and stderr."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.cli.conftest import FIXTURES, TINY, Result
from tests.cli.fixtures import tiny_models

import flopscope
from flopscope.report import Report

Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _tiny_report() -> Report:
    model, x = tiny_models.tiny()
    return flopscope.count(model, x, warn=False)


# -- count: renderings --------------------------------------------------------------------------
def test_count_table_golden(cli: Cli, golden: Callable[[str, str], None]) -> None:
    r = cli("count", "tiny_models:tiny")
    assert r.code == 0, r.err
    # stderr has one line only: the factory's model is in training mode (a fresh Tiny)
    assert r.err.startswith("warning: the model is in training mode") and r.err.count("\n") == 1
    assert "\x1b[" not in r.out  # no colour codes when not a TTY
    golden("count_tiny_table.txt", r.out)


def test_count_markdown_golden(cli: Cli, golden: Callable[[str, str], None]) -> None:
    r = cli("count", "tiny_models:tiny", "--format", "markdown", "--depth", "1")
    assert r.code == 0, r.err
    golden("count_tiny_markdown.md", r.out)


def test_count_by_op_fixed_unit_golden(cli: Cli, golden: Callable[[str, str], None]) -> None:
    r = cli("count", "tiny_models:tiny", "--by", "op", "--unit", "K")
    assert r.code == 0, r.err
    assert "MACs (k)" in r.out  # kilo is a lower-case k; --unit K is accepted
    golden("count_tiny_by_op.txt", r.out)


def test_count_warning_block_golden(cli: Cli, golden: Callable[[str, str], None]) -> None:
    r = cli("count", "tiny_models:opaque")
    assert r.code == 0, r.err
    assert "tinyfix.smear.default" in r.out and "no rule" in r.out
    golden("count_opaque_table.txt", r.out)


def test_count_json_loads_back_equal(cli: Cli) -> None:
    r = cli("count", TINY + ":tiny", "--format", "json")
    assert r.code == 0, r.err
    report = Report.from_json(r.out)
    assert report == Report.from_json(report.to_json())
    assert report.to_json() + "\n" == r.out
    direct = _tiny_report()
    assert (report.macs, report.flops, report.params) == (direct.macs, direct.flops, direct.params)
    assert report.records == direct.records
    assert report.meta["inputs"] == ["1x3x8x8"]


def test_report_json_roundtrip_equal() -> None:
    report = _tiny_report()
    assert Report.from_json(report.to_json()) == report


def test_count_csv_opens_in_pandas(cli: Cli) -> None:
    pd = pytest.importorskip("pandas")
    r = cli("count", "tiny_models:tiny", "--format", "csv")
    assert r.code == 0, r.err
    frame = pd.read_csv(io.StringIO(r.out), keep_default_na=False)
    direct = _tiny_report()
    root = frame[frame["module"] == ""].iloc[0]
    assert int(root["macs"]) == direct.macs and int(root["params"]) == direct.params
    assert set(frame["module"]) == set(direct.modules)
    ops = cli("count", "tiny_models:tiny", "--format", "csv", "--by", "op")
    by_op = pd.read_csv(io.StringIO(ops.out))
    assert int(by_op["flops"].sum()) == direct.flops


def test_report_to_pandas() -> None:
    pytest.importorskip("pandas")
    frame = _tiny_report().to_pandas()
    assert list(frame.columns)[:3] == ["module", "type", "depth"]
    assert int(frame["self_flops"].sum()) == _tiny_report().flops


def test_to_pandas_without_pandas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"needs pandas.*pip install pandas"):
        _tiny_report().to_pandas()


def test_report_renders_with_rich() -> None:
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(_tiny_report())
    text = console.export_text()
    assert "features" in text and "MACs" in text


def test_count_output_file_and_plot(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out, png, svg = tmp_path / "r.md", tmp_path / "chart.png", tmp_path / "chart.svg"
    r = cli("count", "tiny_models:tiny", "--format", "markdown", "--output", str(out),
            "--plot", str(png))
    assert r.code == 0, r.err
    assert r.out == ""
    assert out.read_text().startswith("### Tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = cli("count", "tiny_models:tiny", "--by", "op", "--plot", str(svg))
    assert r.code == 0, r.err
    assert svg.stat().st_size > 0 and "<svg" in svg.read_text()


def test_plot_without_matplotlib(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("count", "tiny_models:tiny", "--plot", str(tmp_path / "c.png"))
    assert r.code == 2
    assert "pip install 'flopscope[plot]'" in r.err and r.err.count("\n") == 1


def test_count_factory_forms(cli: Cli) -> None:
    r = cli("count", "tiny_models:model_only", "--input", "2x3x8x8", "--format", "json")
    assert r.code == 0, r.err
    assert Report.from_json(r.out).macs == 2 * _tiny_report().macs
    r = cli("count", "tiny_models:kwargs_inputs", "--format", "json")
    assert r.code == 0, r.err
    assert Report.from_json(r.out).macs == 2 * _tiny_report().macs
    r = cli("count", "tiny_models:tiny", "--batch", "3", "--format", "json")
    assert Report.from_json(r.out).macs == 3 * _tiny_report().macs


def test_count_backward_and_shape_only(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--backward", "--shape-only")
    assert r.code == 0, r.err
    assert "forward + backward" in r.out and "backward:" in r.out


def test_count_strict_fails_with_exit_1(cli: Cli) -> None:
    r = cli("count", "tiny_models:opaque", "--strict")
    assert r.code == 1
    assert "tinyfix.smear" in r.err and r.err.count("\n") == 1


def test_count_rules_file(cli: Cli) -> None:
    r = cli("count", "tiny_models:spectral", "--rules", str(FIXTURES / "fft_rules.py"),
            "--format", "json")
    assert r.code == 0, r.err
    report = Report.from_json(r.out)
    assert report.uncounted == {}
    # rfft of 2 rows of length 8: 2 * 5 * 8 * log2(8) = 240 FLOPs
    assert report.by_op()["aten._fft_r2c.default"].cost.flops == 240


def test_count_torchvision_shape_only(cli: Cli) -> None:
    r = cli("count", "torchvision:resnet18", "--shape-only", "--format", "json")
    assert r.code == 0, r.err
    report = Report.from_json(r.out)
    assert report.params == 11_689_512
    assert report.macs == 1_814_073_344  # torchvision publishes 1.814 GFLOPS (= MACs)
    assert report.meta["inputs"] == ["1x3x224x224"]


def test_count_hf_config_shape_only(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    overrides = ["--config", "hidden_size=64", "--config", "intermediate_size=128",
                 "--config", "num_hidden_layers=2", "--config", "num_attention_heads=4",
                 "--config", "num_key_value_heads=2", "--config", "vocab_size=1000"]
    r = cli("count", "hf:llama", "--shape-only", "--seq-len", "16", "--format", "json", *overrides)
    assert r.code == 0, r.err
    report = Report.from_json(r.out)
    assert report.shape_only and report.model == "LlamaForCausalLM"
    assert report.meta["inputs"][0] == "input_ids=1x16:int64"
    # lm_head: 16 tokens x 64 x 1000 MACs
    assert report.by_module()["lm_head"].inclusive.macs == 16 * 64 * 1000
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 1000}))
    r2 = cli("count", f"hf:{config}", "--shape-only", "--seq-len", "16", "--format", "json")
    assert r2.code == 0, r2.err
    assert Report.from_json(r2.out).macs == report.macs


# -- diff, rules, zoo ---------------------------------------------------------------------------
def _save(cli: Cli, path: Path, factory: str) -> str:
    r = cli("count", f"tiny_models:{factory}", "--format", "json", "--output", str(path))
    assert r.code == 0, r.err
    return str(path)


def test_diff(cli: Cli, tmp_path: Path) -> None:
    a = _save(cli, tmp_path / "a.json", "tiny")
    b = _save(cli, tmp_path / "b.json", "tiny_wider")
    same = cli("diff", a, a)
    assert same.code == 0 and "OK" in same.out and "identical" in same.out
    changed = cli("diff", a, b, "--tolerance", "1%")
    assert changed.code == 1
    assert "FAIL" in changed.out and "head" in changed.out
    loose = cli("diff", a, b, "--tolerance", "1000%")
    assert loose.code == 0 and "OK" in loose.out


def test_rules_lists_every_convention(cli: Cli) -> None:
    r = cli("rules")
    assert r.code == 0, r.err
    rows = flopscope.rules.conventions()
    assert f"{len(rows)} rules" in r.out
    md = cli("rules", "--format", "markdown")
    assert md.code == 0 and all(op in md.out for row in rows for op in row.ops)


def test_zoo_csv(cli: Cli) -> None:
    pd = pytest.importorskip("pandas")
    r = cli("zoo", "torchvision", "--models", "resnet18,mobilenet_v3_small", "--format", "csv")
    assert r.code == 0, r.err
    frame = pd.read_csv(io.StringIO(r.out))
    assert list(frame["model"]) == ["resnet18", "mobilenet_v3_small"]
    assert int(frame["params"][0]) == 11_689_512
    # torchvision's published GFLOPS are MACs
    assert abs(frame["macs"][0] / 1e9 - frame["reference_gmacs"][0]) < 1e-3


def test_zoo_parallel_sweep_over_batches(cli: Cli) -> None:
    """Two worker processes, two models at two batch sizes: four rows in the order asked, and
    MACs that scale with the batch."""
    pd = pytest.importorskip("pandas")
    r = cli("zoo", "torchvision", "--models", "resnet18,mobilenet_v3_small",
            "--batch", "1,2", "--jobs", "2", "--format", "csv")
    assert r.code == 0, r.err
    frame = pd.read_csv(io.StringIO(r.out))
    assert list(frame["model"]) == ["resnet18", "resnet18", "mobilenet_v3_small",
                                    "mobilenet_v3_small"]
    assert list(frame["input"][:2]) == ["1x3x224x224", "2x3x224x224"]
    assert int(frame["macs"][1]) == 2 * int(frame["macs"][0])
    assert int(frame["params"][0]) == 11_689_512


def test_zoo_reports_failures(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    # a model that fails to count (a misspelt name is a usage error before any counting)
    real = flopscope.zoo.count_model

    def count_model(library: str, name: str, **kwargs: object) -> flopscope.zoo.ZooRow:
        if name == "alexnet":
            return flopscope.zoo.ZooRow(name, 0.1, error="RuntimeError: it broke")
        return real(library, name)

    monkeypatch.setattr(flopscope.zoo, "count_model", count_model)
    r = cli("zoo", "torchvision", "--models", "resnet18", "alexnet", "--format", "markdown",
            "--jobs", "1")
    assert r.code == 1
    assert "`resnet18`" in r.out and "failed: RuntimeError: it broke" in r.out
    assert "alexnet" in r.err.splitlines()[-1]


def test_help_and_no_command(cli: Cli) -> None:
    assert cli("--help").code == 0
    r = cli()
    assert r.code == 2 and "COMMAND" in r.err


def test_measure_commands_wired_in_when_present(cli: Cli) -> None:
    import importlib.util

    if importlib.util.find_spec("flopscope.cli.measure") is None:
        pytest.skip("flopscope.cli.measure is not there")
    assert cli("measure", "--help").code == 0
    assert cli("validate", "--help").code == 0


def test_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "flopscope", "--version"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("flopscope ")


# -- bad input: exit 2, one line, no traceback --------------------------------------------------
BAD = {
    "unknown prefix": (["count", "tv:resnet50"], "unknown source prefix 'tv:'"),
    "no prefix": (["count", "resnet50"], "unknown source 'resnet50'"),
    "unknown torchvision model": (["count", "torchvision:resnet5O"], "did you mean resnet50"),
    "unknown timm model": (["count", "timm:resnet5O", "--shape-only"], "did you mean resnet50"),
    "malformed input": (["count", "tiny_models:tiny", "--input", "1x3xfoo"], "malformed --input"),
    "unknown dtype": (["count", "tiny_models:tiny", "--input", "1x3x8x8:float13"], "unknown dtype"),
    "missing file": (["count", "nope/missing.py:tiny"], "does not exist"),
    "missing factory": (["count", TINY + ":tinny"], "has no factory 'tinny' (did you mean tiny"),
    "factory raises": (["count", "tiny_models:raises"], "raised ValueError: the factory is broken"),
    "not a model": (["count", "tiny_models:not_a_model"], "returned int, not a torch.nn.Module"),
    "not callable": (["count", "tiny_models:NOT_CALLABLE"], "not a factory"),
    "no inputs": (["count", "tiny_models:model_only"], "--input"),
    "module missing": (["count", "no_such_pkg.models:f"], "cannot import module"),
    "shape rejected": (["count", "tiny_models:tiny", "--input", "1x5x8x8"],
                       "rejected its input (1x5x8x8) in module 'features.0'"),
    "bad unit": (["count", "tiny_models:tiny", "--unit", "X"], "unknown unit 'X'"),
    "bad depth": (["count", "tiny_models:tiny", "--depth", "-1"], "expected 0 or more"),
    "bad format": (["count", "tiny_models:tiny", "--format", "xml"], "invalid choice"),
    "config without hf": (["count", "tiny_models:tiny", "--config", "a=1"], "hf: sources only"),
    "rules file missing": (["count", "tiny_models:tiny", "--rules", "nope.py"], "does not exist"),
    "rules file without RULES": (["count", "tiny_models:tiny", "--rules", TINY], "must define RULES"),
    "plot suffix": (["count", "tiny_models:tiny", "--plot", "chart.jpg"], ".png, .svg or .pdf"),
    "unknown command": (["counts", "x"], "invalid choice"),
    # an option the subcommand lacks: its own close options, or the one it has for what other
    # subcommands (profile, plan) call --train
    "train on count": (["count", "tiny_models:tiny", "--train"],
                       "unrecognized arguments: --train (did you mean --backward?) "
                       "(see 'flopscope count --help')"),
    "misspelt option": (["count", "tiny_models:tiny", "--shape-onyl"],
                        "unrecognized arguments: --shape-onyl (did you mean --shape-only?)"),
    "stray argument": (["count", "tiny_models:tiny", "extra"],
                       "unrecognized arguments: extra (see 'flopscope count --help')"),
    "unknown top-level option": (["--bogus"], "unrecognized arguments: --bogus (see 'flopscope "
                                 "--help')"),
    "diff missing file": (["diff", "nope_a.json", "nope_b.json"], "no such file"),
    "bad tolerance": (["diff", "a.json", "b.json", "--tolerance", "lots"], "malformed tolerance"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_exit_2(cli: Cli, case: str) -> None:
    argv, expected = BAD[case]
    r = cli(*argv)
    assert r.code == 2, (r.out, r.err)
    assert r.err.count("\n") == 1 and r.err.endswith("\n"), r.err
    assert "Traceback" not in r.err
    assert expected in r.err
    assert r.out == ""


@pytest.mark.parametrize(
    ("content", "expected"),
    [("{not json", "invalid JSON"), ('{"a": 1}', "not a flopscope report"),
     ("[1, 2]", "not a flopscope report"), (b"\xff\xfe\x00", "not UTF-8")],
    ids=["invalid-json", "not-a-report", "a-list", "binary"],
)
def test_diff_rejects_non_reports(cli: Cli, tmp_path: Path, content: str | bytes,
                                  expected: str) -> None:
    good = _save(cli, tmp_path / "good.json", "tiny")
    bad = tmp_path / "bad.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    r = cli("diff", good, str(bad))
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err
    assert expected in r.err and "flopscope count" in r.err


def test_bad_hf_inputs(cli: Cli) -> None:
    pytest.importorskip("transformers")
    r = cli("count", "hf:lamma", "--shape-only")
    assert r.code == 2 and "did you mean llama" in r.err and r.err.count("\n") == 1
    r = cli("count", "hf:llama", "--shape-only", "--config", "hiden_size=8")
    assert r.code == 2 and "did you mean hidden_size" in r.err and r.err.count("\n") == 1
    r = cli("count", "hf:llama", "--config", "novalue")
    assert r.code == 2 and "malformed --config" in r.err


def test_model_left_untouched_by_sources() -> None:
    model, x = tiny_models.tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flopscope.count(model, x, warn=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_options_are_checked_before_the_model_is_loaded(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad combination of options fails before any model is built (each was checked only after
    loading, contrary to run_count's own docstring)."""
    import flopscope.cli.count as count_cli

    def never(*_: object, **__: object) -> object:
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(count_cli, "load_source", never)
    for argv, message in [
        (["--tp", "2"], "--tp and --fsdp need --world-size"),
        (["--world-size", "2", "--memory"], "does not combine with --memory"),
        (["--world-size", "2", "--step-time", "1", "--peak-tflops", "1"],
         "--step-time does not combine with --world-size"),
        (["--world-size", "3", "--tp", "2"], "tp"),  # the layout itself: 3 ranks, TP of 2
    ]:
        r = cli("count", f"{TINY}:tiny", *argv)
        assert r.code == 2 and message in r.err, (argv, r.err)


def test_hardware_is_resolved_once(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hardware this-machine`` measures this machine once per command, however many
    features use the profile (the roofline, and the peak behind --step-time)."""
    import flopscope.estimate.hardware as hardware

    calls = []

    def measured() -> object:
        calls.append(1)
        return hardware.PROFILES["xeon-8480"]

    monkeypatch.setattr(hardware, "measure_this_machine", measured)
    r = cli("count", f"{TINY}:tiny", "--hardware", "this-machine", "--step-time", "0.001")
    assert r.code == 0, r.err
    assert "roofline on xeon-8480" in r.out and "utilization" in r.out
    assert calls == [1]


def test_the_source_is_checked_before_the_hardware_is_measured(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed --input or a model that does not exist fails before ``this-machine``'s
    probes run, in every subcommand that takes both (profile measured first, then said
    that --input was malformed)."""
    import flopscope.estimate.hardware as hardware

    def never() -> object:
        raise AssertionError("this machine was measured before the source was checked")

    monkeypatch.setattr(hardware, "measure_this_machine", never)
    cases = [
        (["count", "torchvision:resnet18", "--input", "1,3,64,64"], "malformed --input"),
        (["count", "torchvision:nosuchnet"], "unknown torchvision model 'nosuchnet'"),
        (["count", "missing_file.py:factory"], "file 'missing_file.py' does not exist"),
        (["count", "hf:missing/config.json"], "config file 'missing/config.json'"),
        (["count", "nosource"], "unknown source 'nosource'"),
        (["profile", "torchvision:resnet18", "--input", "1,3"], "malformed --input"),
        (["profile", "torchvision:nosuchnet"], "unknown torchvision model"),
    ]
    if importlib.util.find_spec("transformers") is not None:
        cases += [
            (["generate", "hf:nosuchtype", "--prompt-len", "4", "--new-tokens", "2"],
             "unknown transformers model type 'nosuchtype'"),
            (["plan", "hf:nosuchtype", "--gpus", "8"],
             "unknown transformers model type 'nosuchtype'"),
        ]
    for argv, message in cases:
        r = cli(*argv, "--hardware", "this-machine")
        assert r.code == 2 and message in r.err and r.err.count("\n") == 1, (argv, r.err)


def test_the_input_label_describes_what_ran(cli: Cli) -> None:
    """``--batch 2 --input 4x3x224x224`` counts batch 2: the label says 2x3x224x224 too."""
    r = cli("count", "torchvision:resnet50", "--batch", "2", "--input", "4x3x224x224",
            "--shape-only", "--format", "json")
    data = json.loads(r.out)
    assert data["meta"]["inputs"] == ["2x3x224x224"]
    assert data["totals"]["macs"] == 2 * 4_089_184_256  # torchvision's 4.089 GMACs per image
    r = cli("count", "torchvision:resnet50", "--batch", "2", "--input", "4x3x224x224",
            "--shape-only")
    assert "[input 2x3x224x224, shape-only]" in r.out.splitlines()[0]


def test_shape_only_inputs_are_never_real(cli: Cli) -> None:
    """100,000 images shape-only: the 56 GiB input is a meta tensor from the start (the count
    needs no memory for it), not allocated and then failing."""
    r = cli("count", "torchvision:resnet18", "--shape-only", "--input", "100000x3x224x224",
            "--format", "json")
    assert r.code == 0, r.err
    # resnet18: 1,814,073,344 MACs per 224x224 image (torchvision publishes 1.814 "GFLOPS")
    assert json.loads(r.out)["totals"]["macs"] == 100_000 * 1_814_073_344


def test_sizes_beyond_memory_or_int64_are_one_line_errors(cli: Cli) -> None:
    r = cli("count", "torchvision:resnet18", "--batch", "99999999999999999999")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "expected at most 9,223,372,036,854,775,807 (2^63 - 1" in r.err
    r = cli("count", "torchvision:resnet18", "--input", "100000x3x224x224")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "GiB" in r.err and "--shape-only" in r.err
