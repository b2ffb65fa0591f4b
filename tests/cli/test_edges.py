"""The edges a new user hits (issue 26): options that were silently ignored or misread are
one-line usage errors that name the flag and what to do."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from tests.cli.conftest import TINY, Result

import flopscope

Cli = Callable[..., Result]


def _one_line(r: Result, *words: str) -> None:
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1, r.err
    for w in words:
        assert w in r.err, r.err


def test_silently_ignored_options_are_usage_errors(cli: Cli) -> None:
    _one_line(cli("count", f"{TINY}:tiny", "--hardware", ""), "--hardware", "empty profile")
    _one_line(cli("count", f"{TINY}:tiny", "--tf32"), "--tf32", "--hardware")
    _one_line(cli("generate", "hf:llama", "--prompt-len", "4", "--new-tokens", "2",
                  "--hardware", " "), "--hardware", "empty profile")


def test_values_that_start_with_a_dash_reach_their_own_check(cli: Cli) -> None:
    """argparse said "expected one argument" for these."""
    _one_line(cli("count", f"{TINY}:tiny", "--input", "-1x3x8x8"), "--input",
              "every dimension must be at least 1")
    _one_line(cli("diff", "a.json", "b.json", "--tolerance", "-5%"), "--tolerance",
              "0 or more")


def test_tolerance_says_its_unit(cli: Cli, tmp_path: Path) -> None:
    """``--tolerance 1`` read as 100% let a doubled cost pass with exit 0; a bare number of 1 or
    more is now ambiguous, and a percentage or a fraction below 1 is what it says."""
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    assert cli("count", f"{TINY}:tiny", "--input", "2x3x8x8", "--format", "json",
               "--output", a).code == 0
    assert cli("count", f"{TINY}:tiny", "--input", "4x3x8x8", "--format", "json",
               "--output", b).code == 0  # twice the batch: twice every cost
    _one_line(cli("diff", a, b, "--tolerance", "1"), "ambiguous tolerance", "1%", "100%")
    assert cli("diff", a, b, "--tolerance", "50%").code == 1  # +100% is beyond 50%
    assert cli("diff", a, b, "--tolerance", "0.5").code == 1
    assert cli("diff", a, b, "--tolerance", "100%").code == 0


def test_a_rule_for_an_operator_that_does_not_exist_is_refused() -> None:
    model, x = torch.nn.Linear(4, 2), torch.randn(1, 4)
    with pytest.raises(flopscope.RuleError, match=r"'aten::mmm', which does not exist.*aten::mm"):
        flopscope.count(model, x, rules={"aten::mmm": lambda call: 0})
    with pytest.raises(flopscope.RuleError, match="has no overload 'nope'"):
        flopscope.count(model, x, rules={"aten::mm.nope": lambda call: 0})
    # an operator that exists, any spelling: accepted
    flopscope.count(model, x, rules={torch.ops.aten.mm: lambda call: 0}, warn=False)


def test_a_rules_file_naming_a_missing_operator_is_refused(cli: Cli, tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text("RULES = {'aten::addmmm': lambda call: 0}\n")
    _one_line(cli("count", f"{TINY}:tiny", "--rules", str(rules)), "aten::addmmm",
              "does not exist", "aten::addmm")


def test_peak_memory_refuses_training_options_without_train() -> None:
    from flopscope.estimate import peak_memory

    model, x = torch.nn.Linear(4, 2), torch.randn(1, 4)
    with pytest.raises(flopscope.UsageError, match=r"optimizer=.*train=True"):
        peak_memory(model, x, optimizer="adamw")
    with pytest.raises(flopscope.UsageError, match=r"loss_fn=.*train=True"):
        peak_memory(model, x, loss_fn=lambda out: out.sum())
    # 4 x 2 weights + 2 biases, float32: 40 B of parameters, live at any peak
    assert peak_memory(model, x).memory.at_peak["parameters"] == 40
    assert json.dumps(peak_memory(model, x, train=True).memory.to_dict())


# -- one rule for every file a subcommand writes: its folder must exist; checked before loading --
PATH_OPTIONS = [
    ["count", f"{TINY}:tiny", "--output", "{missing}/out.json"],
    ["count", f"{TINY}:tiny", "--plot", "{missing}/chart.png"],
    ["count", f"{TINY}:tiny", "--hardware", "h100-sxm", "--roofline-plot", "{missing}/roof.png"],
    ["count", f"{TINY}:tiny", "--symbolic", "batch", "--plot", "{missing}/formula.png"],
    ["count", f"{TINY}:tiny", "--symbolic", "batch", "--output", "{missing}/formula.json"],
    ["generate", "hf:gpt2", "--prompt-len", "4", "--new-tokens", "2", "--output",
     "{missing}/steps.json"],
    ["rules", "--output", "{missing}/rules.txt"],
    ["zoo", "torchvision", "--models", "alexnet", "--output", "{missing}/zoo.md"],
    ["measure", f"{TINY}:tiny", "--output", "{missing}/measure.json"],
    ["validate", f"{TINY}:tiny", "--output", "{missing}/validate.csv"],
    ["profile", f"{TINY}:tiny", "--hardware", "none", "--output", "{missing}/profile.json"],
    ["profile", f"{TINY}:tiny", "--hardware", "none", "--trace", "{missing}/trace.json"],
    ["profile", f"{TINY}:tiny", "--hardware", "h100-sxm", "--estimated-trace",
     "{missing}/estimated.json"],
]


@pytest.mark.parametrize("argv", PATH_OPTIONS, ids=lambda a: " ".join(a[:1] + a[-2:-1]))
def test_every_written_file_refuses_a_missing_folder_before_loading(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """``--plot`` created a missing folder; ``--roofline-plot`` and the symbolic ``--plot`` ran
    the whole count and then failed with a raw FileNotFoundError."""
    import flopscope.sources

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the path was checked")

    monkeypatch.setattr(flopscope.sources, "load_model", never)
    missing = tmp_path / "no_such_dir"
    argv = [a.format(missing=missing) for a in argv]
    flag = argv[-2]
    r = cli(*argv)
    assert r.code == 2 and r.out == ""
    _one_line(r, f"argument {flag}: cannot write '{argv[-1]}': the directory '{missing}' does "
                 "not exist; create it first")
    assert not missing.exists()  # never created


@pytest.mark.parametrize("argv", [
    ["profile", f"{TINY}:tiny", "--hardware", "none", "--trace", "-"],
    ["profile", f"{TINY}:tiny", "--hardware", "h100-sxm", "--estimated-trace", "-"],
    ["calibrate", "--output", "-"],
], ids=lambda a: a[-2])
def test_a_file_read_back_by_its_path_is_never_stdout(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """``profile --trace -`` wrote a file named ``-`` (the trace is opened in a viewer by its
    path); calibrate's profile is read back by ``--hardware FILE``."""
    monkeypatch.chdir(tmp_path)
    r = cli(*argv)
    assert r.code == 2 and r.out == ""
    _one_line(r, f"argument {argv[-2]}: needs a file name, not -")
    assert not (tmp_path / "-").exists()


def test_a_plot_suffix_is_checked_with_the_path(cli: Cli, tmp_path: Path) -> None:
    _one_line(cli("count", f"{TINY}:tiny", "--plot", str(tmp_path / "chart.txt")),
              "argument --plot: cannot plot to", "use a file name ending in .png, .svg or .pdf")
    _one_line(cli("count", f"{TINY}:tiny", "--hardware", "h100-sxm", "--roofline-plot",
                  str(tmp_path / "roof.jpg")), "argument --roofline-plot: cannot plot to")
    _one_line(cli("rules", "--output", str(tmp_path)), "argument --output: cannot write",
              "it is a directory")


def test_every_written_file_option_has_the_one_rule() -> None:
    """Every option whose value is a FILE that flopscope writes takes its value through the one
    argument type: a new written-file option without it fails here."""
    import argparse

    from flopscope.cli import build_parser
    from flopscope.cli.types import named_file, output_file, plot_file

    def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
        return list(parser._actions)  # argparse has no public list of a parser's options

    subs = next(a for a in actions(build_parser()) if isinstance(a, argparse._SubParsersAction))
    written = {}
    for name, sub in subs.choices.items():
        for action in actions(sub):
            if action.metavar == "FILE":
                assert action.type in (output_file, plot_file, named_file), (
                    name, action.option_strings)
                written[name, action.option_strings[0]] = action.type
    # --output of every subcommand that writes a result; count's --plot and
    # --roofline-plot; profile's --trace and --estimated-trace
    assert sorted(written) == sorted(
        [(name, "--output") for name in
         ("calibrate", "count", "diff", "generate", "measure", "validate", "plan", "profile", "rules",
          "zoo")]
        + [("count", "--plot"), ("count", "--roofline-plot"), ("profile", "--trace"),
           ("profile", "--estimated-trace")])
    assert written["count", "--plot"] is written["count", "--roofline-plot"] is plot_file


# -- a misspelt zoo model is a usage error, on one line, before anything is counted --------------
@pytest.mark.parametrize(("library", "models", "message"), [
    ("torchvision", "resnet18,resnet5", "--models: unknown torchvision model 'resnet5' (did you "
                                        "mean resnet50"),
    ("timm", "resnet18,resnet5O", "--models: unknown timm model 'resnet5O' (did you mean"),
    ("hf", "lama", "--models: unknown transformers model type 'lama' (did you mean llama"),
])
def test_zoo_misspelt_model(cli: Cli, monkeypatch: pytest.MonkeyPatch, library: str,
                            models: str, message: str) -> None:
    """It exited 1 after counting, with the message wrapped over three lines."""
    pytest.importorskip({"torchvision": "torchvision", "timm": "timm"}.get(library, "transformers"))

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("counting started before the names were checked")

    monkeypatch.setattr("flopscope.zoo.count_model", never)
    monkeypatch.setattr("flopscope.cli.zoo.sweep", never)
    _one_line(cli("zoo", library, "--models", models, "--jobs", "1"), message)


def test_zoo_row_error_stays_on_one_line(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from flopscope.zoo import ZooRow

    long_error = "RuntimeError: " + "a very long reason " * 12

    def sweep(library: str, names: list[str], **kwargs: object) -> object:
        yield ZooRow(names[0], 0.1, error=long_error)

    monkeypatch.setattr("flopscope.cli.zoo.sweep", sweep)
    r = cli("zoo", "torchvision", "--models", "alexnet")
    assert r.code == 1
    assert r.err.splitlines()[0] == f"flopscope: zoo: alexnet: {long_error}", r.err


# -- a bug in the user's forward is not "rejected its input" -------------------------------------
BAD_PACKAGE = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.weights: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1 / len(self.weights)
        return self.proj(x) * scale


class Mismatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)


class Net(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.block = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def raises() -> tuple[nn.Module, torch.Tensor]:
    return Net(Block()), torch.randn(2, 4)


def mismatch() -> tuple[nn.Module, torch.Tensor]:
    return Net(Mismatch()), torch.randn(2, 4)
'''


@pytest.fixture
def mypkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's package on sys.path, imported afresh by each test (its file is in tmp_path)."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "bad.py").write_text(BAD_PACKAGE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package / "bad.py"
    for name in ("mypkg.bad", "mypkg"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("shape_only", [False, True])
def test_a_bug_in_the_forward_is_reported_as_the_users_error(cli: Cli, mypkg: Path,
                                                             shape_only: bool) -> None:
    """It was "rejected its input ... pass shapes it accepts with --input"."""
    line = BAD_PACKAGE.splitlines().index("        scale = 1 / len(self.weights)") + 1
    r = cli("count", "mypkg.bad:raises", *(["--shape-only"] if shape_only else []))
    assert r.out == ""
    _one_line(r, "mypkg.bad:raises: the model's forward raised ZeroDivisionError: division by "
                 f"zero in module 'block', at {mypkg}:{line} in forward (scale = 1 / "
                 "len(self.weights)): an error in the model's code, not in its input")
    assert "rejected its input" not in r.err and "--input" not in r.err


def test_a_real_shape_mismatch_is_still_rejected_input(cli: Cli, mypkg: Path) -> None:
    # torch.mm called in the user's own code with (2x4) @ (5x3): the operator refused its shapes
    r = cli("count", "mypkg.bad:mismatch")
    _one_line(r, "mypkg.bad:mismatch rejected its input (2x4) in module 'block': RuntimeError:",
              "pass shapes it accepts with --input")


def test_a_missing_hardware_file_says_so_before_loading(cli: Cli,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hardware missing.json`` said "unknown hardware 'missing.json'"."""
    import flopscope.sources

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before --hardware was checked")

    monkeypatch.setattr(flopscope.sources, "load_model", never)
    _one_line(cli("count", f"{TINY}:tiny", "--hardware", "missing.json"),
              "hardware profile file 'missing.json' does not exist; give an existing file or a "
              "shipped profile: h100-sxm,")
