"""One grammar for every subcommand: shared flag names, one-line errors with suggestions, checks
before slow work, exit codes (130 on Ctrl-C)."""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.cli.conftest import FIXTURES, Result

import flopscope
import flopscope.cli
import flopscope.render.plot
import flopscope.zoo
from flopscope.cli import build_parser, interrupt
from flopscope.cli._options import FORMATS
from flopscope.report import Report
from flopscope.zoo import ZooRow

Cli = Callable[..., Result]

SOURCE_FLAGS = {"--input", "--batch", "--seq-len", "--dtype", "--config"}


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_every_subcommand_with_a_source_takes_the_same_flags() -> None:
    taking_source = {name: p for name, p in _subcommands().items()
                     if any(not a.option_strings and a.metavar == "SOURCE" for a in p._actions)}
    assert "count" in taking_source
    for name, parser in taking_source.items():
        options = _options(parser)
        missing = SOURCE_FLAGS - set(options)
        assert not missing, f"{name} lacks {sorted(missing)}"
        assert options["--input"].metavar == "SHAPE[:DTYPE]", name
        assert options["--batch"].type is options["--seq-len"].type, name


def test_shared_flags_mean_the_same_everywhere() -> None:
    old_dialect = {"--json", "--batch-size", "--input-size"}
    for name, parser in _subcommands().items():
        options = _options(parser)
        assert not old_dialect & set(options), f"{name} speaks the old dialect"
        if "--format" in options:
            choices = list(options["--format"].choices or [])
            assert set(choices) <= set(FORMATS), name
            assert choices == [f for f in FORMATS if f in choices], name  # one order
        if "--output" in options:
            assert options["--output"].metavar == "FILE", name
        if "--depth" in options:
            assert options["--depth"].metavar == "N", name


# -- errors: one line, exit 2, with suggestions -------------------------------------------------
SUGGESTED = {
    "command": (["cout", "x"], "did you mean count"),
    "format": (["count", "tiny_models:tiny", "--format", "jsn"], "did you mean json"),
    "dtype": (["count", "tiny_models:tiny", "--dtype", "flaot64"], "did you mean float64"),
    "input dtype": (["count", "tiny_models:tiny", "--input", "1x3x8x8:flot16"], "did you mean"),
    "factory": (["count", "tiny_models:tinny"], "did you mean tiny"),
    "prefix": (["count", "torchvison:resnet18"], "did you mean torchvision:"),
    "zoo library": (["zoo", "torchvison"], "did you mean torchvision"),
}


@pytest.mark.parametrize("case", list(SUGGESTED), ids=list(SUGGESTED))
def test_errors_suggest_close_names(cli: Cli, case: str) -> None:
    argv, expected = SUGGESTED[case]
    r = cli(*argv)
    assert r.code == 2, r.err
    assert r.err.count("\n") == 1 and r.err.startswith("flopscope: ")
    assert expected in r.err
    assert r.out == ""


FLAG_ERRORS = {
    "seq-len without hf": (["count", "tiny_models:tiny", "--seq-len", "8"], "--seq-len applies"),
    "integer dtype": (["count", "tiny_models:tiny", "--dtype", "int64"], "floating-point"),
    "batch zero": (["count", "tiny_models:tiny", "--batch", "0"], "expected at least 1"),
}


@pytest.mark.parametrize("case", list(FLAG_ERRORS), ids=list(FLAG_ERRORS))
def test_errors_name_the_flag(cli: Cli, case: str) -> None:
    argv, expected = FLAG_ERRORS[case]
    r = cli(*argv)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert expected in r.err


# -- checks before slow work ---------------------------------------------------------------------
def _no_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> Report:
        raise AssertionError("counted although the options were bad")

    monkeypatch.setattr(flopscope, "count", refuse)


def test_output_into_missing_directory_fails_before_counting(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_counting(monkeypatch)
    target = tmp_path / "no" / "such" / "dir" / "x.json"
    r = cli("count", "tiny_models:tiny", "--format", "json", "--output", str(target))
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "does not exist" in r.err and "--output" in r.err
    assert not (tmp_path / "no").exists()


def test_output_that_is_a_directory(cli: Cli, tmp_path: Path) -> None:
    r = cli("rules", "--output", str(tmp_path))
    assert r.code == 2 and "is a directory" in r.err and r.err.count("\n") == 1


def test_plot_without_matplotlib_fails_before_counting(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_counting(monkeypatch)

    def missing() -> None:
        raise ImportError("plotting needs matplotlib, which is not installed: "
                          "pip install 'flopscope[plot]'")

    monkeypatch.setattr(flopscope.render.plot, "require_matplotlib", missing)
    r = cli("count", "tiny_models:tiny", "--plot", str(tmp_path / "c.png"))
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "pip install 'flopscope[plot]'" in r.err
    assert r.out == ""
    assert not (tmp_path / "c.png").exists()


def test_plot_without_matplotlib_module(cli: Cli, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _no_counting(monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("count", "tiny_models:tiny", "--plot", str(tmp_path / "c.png"))
    assert r.code == 2 and "flopscope[plot]" in r.err and r.out == ""


# -- --dtype ---------------------------------------------------------------------------------------
def test_count_dtype_float64(cli: Cli) -> None:
    base = Report.from_json(cli("count", "tiny_models:tiny", "--format", "json").out)
    r = cli("count", "tiny_models:tiny", "--format", "json", "--dtype", "double")
    assert r.code == 0, r.err
    report = Report.from_json(r.out)
    assert report.meta["inputs"] == ["1x3x8x8:float64"]
    assert (report.macs, report.flops, report.params) == (base.macs, base.flops, base.params)
    # bytes follow the element size: float64 moves twice the bytes of float32
    assert report.total().bytes_read > base.total().bytes_read


# -- rules -----------------------------------------------------------------------------------------
def test_rules_prints_every_text_literally(cli: Cli) -> None:
    r = cli("rules")
    assert r.code == 0, r.err
    words = set(r.out.split())
    rows = flopscope.rules.conventions()
    for row in rows:
        missing = [w for w in row.text.split() if w not in words]
        assert not missing, (row.rule, missing)  # e.g. C[m,n] shown as C by rich markup
        for op in row.ops:
            assert op in words, op  # whole, never cut mid-word
    assert "C[m,n]" in words and "A[m,k]" in words


def test_rules_output_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "rules.txt"
    r = cli("rules", "--output", str(out))
    assert r.code == 0 and r.out == ""
    assert "C[m,n]" in out.read_text()


# -- Ctrl-C ----------------------------------------------------------------------------------------
_NAMES = ("alexnet", "resnet18", "vgg11", "resnet34", "squeezenet1_0")  # torchvision's names


def _fake_count_model(calls: list[str]) -> Callable[[str, str], ZooRow]:
    def count_model(library: str, name: str) -> ZooRow:
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return ZooRow(name, 0.5, input="1x3x8x8", params=10, macs=100 * len(calls), flops=250)

    return count_model


def test_zoo_interrupted_keeps_finished_rows(cli: Cli, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(flopscope.zoo, "count_model", _fake_count_model(calls))
    out = tmp_path / "zoo.csv"
    r = cli("zoo", "torchvision", "--models", ",".join(_NAMES), "--format", "csv", "--output",
            str(out), "--jobs", "1")
    assert r.code == 130
    assert r.err.count("\n") == 1 and "interrupted" in r.err and "2 of 5" in r.err, r.err
    assert calls == list(_NAMES[:3])
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(row["model"], row["macs"]) for row in rows] == [(_NAMES[0], "100"),
                                                             (_NAMES[1], "200")]


def test_zoo_interrupted_to_stdout(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flopscope.zoo, "count_model", _fake_count_model([]))
    r = cli("zoo", "torchvision", "--models", *_NAMES[:4], "--jobs", "1")
    assert r.code == 130 and r.err.count("\n") == 1
    assert f"`{_NAMES[0]}`" in r.out and f"`{_NAMES[1]}`" in r.out
    assert f"`{_NAMES[2]}`" not in r.out


def test_interrupt_anywhere_exits_130(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(flopscope, "count", interrupted)
    r = cli("count", "tiny_models:tiny")
    assert r.code == 130 and r.err == "flopscope: interrupted\n"


def _main_entry_in_process(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``main_entry`` in this process. It takes SIGINT and ``sys.unraisablehook`` over, as a
    command must; ``interrupt.restore`` gives them back (checked here), so that pytest's own
    Ctrl-C and later tests are as before. Returns (exit code, stderr)."""
    handler, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    try:
        with pytest.raises(SystemExit) as exit_info:
            flopscope.cli.main_entry()
        assert signal.getsignal(signal.SIGINT) is not handler  # taken over while it ran
    finally:
        interrupt.restore()
    assert signal.getsignal(signal.SIGINT) is handler and sys.unraisablehook is hook
    assert not interrupt.interrupted()
    assert isinstance(exit_info.value.code, int)
    return exit_info.value.code, capsys.readouterr().err


def test_main_entry_exits_130_on_interrupt(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(argv: object = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(flopscope.cli, "main", interrupted)
    assert _main_entry_in_process(capsys) == (130, "flopscope: interrupted\n")


def test_main_entry_reports_a_swallowed_interrupt(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C that code under the command caught and dropped exited 0 with no output (seen
    1.5 s into ``flopscope count``, while it imported): it is still exit 130 and one line."""
    def swallows(argv: object = None) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, raised in this frame
            time.sleep(1)
        except KeyboardInterrupt:
            return 0  # dropped, as a bare 'except BaseException' in some library would
        raise AssertionError("SIGINT was not raised as KeyboardInterrupt")

    monkeypatch.setattr(flopscope.cli, "main", swallows)
    assert _main_entry_in_process(capsys) == (130, "flopscope: interrupted\n")
