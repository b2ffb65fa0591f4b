"""The numbers a user sees on the command line: one unit convention (SI prefixes for counts, binary
prefixes for bytes), sizes that do not fit refused before anything is built, shape-only inputs
that never take memory, and what a long count says while it runs."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable

import pytest
from rich.console import Console
from tests.cli.conftest import FIXTURES, Result

import flopscope
from flopscope.cli import main
from flopscope.cli.count import simulating_what
from flopscope.cli.progress import Progress

Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


# -- units -----------------------------------------------------------------------------------------
def test_bytes_take_binary_prefixes_in_tables_and_notes(cli: Cli) -> None:
    r = cli("count", "tiny_models:tiny", "--memory", "--hardware", "h100-sxm")
    assert r.code == 0, r.err
    # the module table's bytes were decimal ("14.38 KB") while the memory lines were binary
    # ("5.90 KiB"): no decimal byte unit is left anywhere
    assert not re.findall(r"\d\.\d+ (?:[kKMGTPEZY])B\b", r.out)
    # the root moves 14,304 bytes (an eval-mode forward: --memory counts one) = 13.97 KiB
    # (14,304 / 1,024 = 13.97), not 14.30 KB
    assert re.search(r"^\(root\)\s+Tiny\s+276\s+13\.86 k\s+30\.28 k\s+13\.97 KiB\s", r.out, re.M)
    # the parameters: 276 float32 = 1,104 bytes = 1.08 KiB; the input 1x3x8x8 float32 = 768 B
    assert "parameters 1.08 KiB" in r.out and "inputs 768 B" in r.out
    # the H100's 3.35 TB/s datasheet bandwidth is 3.35e12 / 2^40 = 3.05 TiB/s
    assert "3.05 TiB/s" in r.out


# -- sizes: shape-only inputs take no memory; sizes that do not fit are refused --------------------
# resnet50 at 1x3x224x224 is 4,089,184,256 MACs (torchvision publishes 4.089 GFLOPS, which are MACs)
RESNET50_MACS = 4_089_184_256


@pytest.mark.parametrize("size", [["--input", "100000x3x224x224"], ["--batch", "100000"]])
def test_shape_only_inputs_take_no_memory(cli: Cli, size: list[str]) -> None:
    # 100,000 images of 3x224x224 float32 are 60 GB: the input used to be allocated (and fail)
    r = cli("count", "torchvision:resnet50", "--shape-only", *size, "--format", "json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["meta"]["inputs"] == ["100000x3x224x224"]
    assert report["totals"]["macs"] == 100_000 * RESNET50_MACS  # 408,918,425,600,000


def test_shape_only_token_ids_take_no_memory(cli: Cli) -> None:
    # 10^10 x 8 int64 token ids are 640 GB; a one-layer GPT-2 of width 8 counts them on meta
    r = cli("count", "hf:gpt2", "--shape-only", "--batch", "10000000000", "--seq-len", "8",
            "--config", "n_layer=1", "--config", "n_embd=8", "--config", "n_head=2",
            "--config", "vocab_size=16", "--config", "n_positions=8", "--format", "json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["meta"]["inputs"][0] == "input_ids=10000000000x8:int64"


def test_huge_counts_take_the_prefix_they_need(cli: Cli) -> None:
    # 10^9 images: 4.089 * 10^18 MACs is 4.089 EMAC (it printed as "4,089 PMAC"), and the bytes
    # moved take binary prefixes up to PiB and beyond
    r = cli("count", "torchvision:resnet50", "--shape-only", "--batch", "1000000000")
    assert r.code == 0, r.err
    assert "25,557,032 params (25.56 M) · 4.089 EMAC · 8.218 EFLOP" in r.out
    assert re.search(r"^\(root\)\s+ResNet\s+25\.56 M\s+4\.09 E\s+8\.22 E\s+\d+\.\d\d PiB\s", r.out,
                     re.M)


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch", "99999999999999999999"],
     r"^flopscope: error: argument --batch: expected at most 9,223,372,036,854,775,807 \(2\^63 - 1, "
     r"the largest size PyTorch holds\), got 99,999,999,999,999,999,999"),
    (["--seq-len", "99999999999999999999", "--input", "1x8:int64"],
     r"^flopscope: error: argument --seq-len: expected at most 9,223,372,036,854,775,807"),
    (["--input", "99999999999999999999x3x224x224"],
     r"^flopscope: error: --input '99999999999999999999x3x224x224': dimension "
     r"99,999,999,999,999,999,999 is beyond the largest tensor dimension, "
     r"9,223,372,036,854,775,807 \(2\^63 - 1\)"),
    # fits a dimension, but 10^16 x 3 x 224 x 224 float32 is 6.0e21 bytes = 5.10 ZiB of storage
    (["--batch", "9999999999999999"],
     r"^flopscope: error: batch 9,999,999,999,999,999: 9999999999999999x3x224x224 float32 would "
     r"take 5\.10 ZiB, beyond the 8\.00 EiB \(2\^63 - 1 bytes\) one tensor can hold"),
    (["--input", "9999999999999999x3x224x224"],
     r"^flopscope: error: --input '9999999999999999x3x224x224': 9999999999999999x3x224x224 "
     r"float32 would take 5\.10 ZiB"),
])
def test_sizes_that_do_not_fit_are_one_usage_error(cli: Cli, argv: list[str], message: str) -> None:
    r = cli("count", "torchvision:resnet50", "--shape-only", *argv)
    assert r.code == 2
    assert r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert re.match(message, r.err), r.err
    assert "frame #" not in r.err and "Exception raised from" not in r.err


# -- training mode ---------------------------------------------------------------------------------
def test_a_factory_model_in_training_mode_is_named_on_stderr(cli: Cli) -> None:
    # tiny_models:tiny returns a fresh model (training mode) with one BatchNorm2d
    r = cli("count", "tiny_models:tiny", "--format", "json")
    assert r.code == 0, r.err
    json.loads(r.out)  # stdout is the JSON alone
    (line,) = [x for x in r.err.splitlines() if "training mode" in x]
    assert line.startswith("warning: the model is in training mode") and "BatchNorm2d x1" in line
    assert "--backward" in line and "model.eval()" in line
    # a training step is what training mode is for; library models are built in eval mode
    for argv in (["tiny_models:tiny", "--backward"], ["torchvision:resnet18", "--shape-only"]):
        r = cli("count", *argv, "--format", "json")
        assert r.code == 0 and "training mode" not in r.err, r.err


# -- rules: the convention of every operator -------------------------------------------------------
def test_rules_shows_each_operators_family_and_convention_on_its_row(cli: Cli) -> None:
    r = cli("rules")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    rows = flopscope.rules.conventions()
    assert f"{len(rows)} rules covering {sum(len(row.ops) for row in rows)} operators" in lines[0]
    starts = {}
    for line in lines:
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and "::" in parts[0]:
            starts[parts[0]] = (parts[1], parts[2])
    for row in rows:
        first = row.text.split()[0]
        for op in row.ops:  # the operator's own line: its family, then its convention's start
            assert starts.get(op, ("", ""))[0] == row.family, op
            assert starts[op][1].startswith(first), (op, starts[op][1])


def test_rules_looks_operators_up_by_name(cli: Cli) -> None:
    r = cli("rules", "addmm")
    assert r.code == 0, r.err
    shown = [line.split()[0] for line in r.out.splitlines() if "::" in line.split(maxsplit=1)[0]]
    assert "aten::addmm" in shown and "aten::addmm_" in shown and "aten::_sparse_addmm" in shown
    assert all("addmm" in op for op in shown)
    assert re.search(r"^aten::addmm\s+matmul\s+out\[m,n\] = beta\*bias", r.out, re.M)
    bad = cli("rules", "softmx")
    assert bad.code == 2 and bad.out == ""
    assert re.match(r"flopscope: error: no rule covers an operator named like 'softmx' "
                    r"\(did you mean softmax", bad.err)


# -- progress: what a long count is doing, on a terminal's stderr only -----------------------------
class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_console() -> None:
    buf = io.StringIO()
    shown = Progress(Console(file=buf, force_terminal=True, width=100))
    shown.say("loading torchvision:resnet18")
    shown.say("counting forward (shape-only)")
    shown.stop()
    text = buf.getvalue()
    assert "loading torchvision:resnet18" in text and "counting forward (shape-only)" in text
    silent = Progress(Console(file=io.StringIO(), force_terminal=False))
    silent.say("counting forward")  # not a terminal: nothing, no error
    silent.stop()


def test_count_shows_its_steps_when_stderr_is_a_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["count", "torchvision:resnet18", "--shape-only", "--backward", "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out)["totals"]["macs"] > 0  # stdout: the JSON alone, no status
    assert "\x1b" not in out and "counting" not in out
    shown = terminal.getvalue()
    assert "loading torchvision:resnet18" in shown
    assert "counting forward + backward (shape-only)" in shown


def test_count_shows_nothing_when_stderr_is_a_pipe(cli: Cli) -> None:
    r = cli("count", "torchvision:resnet18", "--shape-only", "--backward", "--format", "csv")
    assert r.code == 0
    assert r.err == ""  # capsys's stderr is not a terminal: no status line, no control codes
    assert r.out.startswith("module,type,depth,calls,")  # stdout: the CSV alone


def test_simulated_ranks_are_named() -> None:
    from flopscope.distributed import Layout

    assert simulating_what(Layout(8, tp=2, fsdp=4, rank=3), 0) == "simulating rank 3 of 8"
    assert simulating_what(Layout(8, tp=2, fsdp=4, rank=3), 1) == (
        "counting the unsharded model (the logical figures)")
    assert simulating_what(Layout(4, tp=2, pp=2, rank=2), 1) == (
        "simulating pipeline stage 2 of 2 (rank 2 of 4)")
