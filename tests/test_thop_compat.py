"""flopscope.compat.thop: thop's profile()/clever_format() with flopscope's semantics (issue 3).

profile() gives the flopscope column of the issue's table, accepts thop-style rules that add to
``module.total_ops``, and leaves nothing on the model. Where thop is installed, the thop column is
checked too, to pin down what differs (see docs/thop.md).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from _attention import (
    LINEAR_MACS,
    PARAMS,
    RULE_MACS,
    Attention,
    TwiceWrapper,
    Wrapper,
    attention_rule,
    sample,
    thop_attention_rule,
)
from flopscope.compat.thop import clever_format, profile, thop_rule

CASES = [  # (name, model class, custom_ops classes, flopscope MACs, thop MACs)
    ("Wrapper, no rules", Wrapper, (), 2_139_095_040, 1_509_949_440),
    ("Wrapper, rule on Attention", Wrapper, (Attention,), 2_139_095_040, 2_139_095_040),
    ("Wrapper, rule on Wrapper", Wrapper, (Wrapper,), 2_139_095_040, 3_649_044_480),
    ("Wrapper, rules on both", Wrapper, (Wrapper, Attention), 2_139_095_040, 4_278_190_080),
    ("TwiceWrapper, rule on TwiceWrapper", TwiceWrapper, (TwiceWrapper,), 2_139_095_040,
     5_158_993_920),
    ("TwiceWrapper, rule on Attention", TwiceWrapper, (Attention,), 4_278_190_080, 4_278_190_080),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    torch.manual_seed(0)
    return sample()


def _state(model: nn.Module) -> dict[str, Any]:
    return {
        "keys": list(model.state_dict()),
        "attrs": {n: sorted(m.__dict__) for n, m in model.named_modules()},
        "buffers": {n: list(m._buffers) for n, m in model.named_modules()},
        "hooks": {n: (len(m._forward_hooks), len(m._forward_pre_hooks))
                  for n, m in model.named_modules()},
        "training": [m.training for m in model.modules()],
    }


@pytest.mark.parametrize(("name", "cls", "ruled", "macs", "thop_macs"), CASES, ids=IDS)
def test_profile_gives_the_flopscope_column(
    x: torch.Tensor, name: str, cls: type[nn.Module], ruled: tuple[type, ...], macs: int,
    thop_macs: int,
) -> None:
    model = cls().train()
    before = _state(model)
    got = profile(model, inputs=(x,), custom_ops={c: thop_attention_rule for c in ruled}, verbose=False)
    assert got == (macs, PARAMS)
    assert all(type(v) is int for v in got)
    assert _state(model) == before  # no total_ops/total_params, no hooks, training flag back


def test_profile_accepts_flopscope_style_rules_too(x: torch.Tensor) -> None:
    assert profile(TwiceWrapper(), (x,), custom_ops={Attention: attention_rule},
                   verbose=False) == (4_278_190_080, PARAMS)


def test_profile_layer_info_has_thops_shape(x: torch.Tensor) -> None:
    macs, params, info = profile(Wrapper(), (x,), verbose=False, ret_layer_info=True)  # type: ignore[misc]
    assert (macs, params) == (RULE_MACS, PARAMS)
    attn_macs, attn_params, children = info["attn"]
    assert (attn_macs, attn_params) == (RULE_MACS, PARAMS)
    assert children["qkv"] == (3 * 640 * 768 * 768, 3 * 768 * 768, {})
    assert children["proj"] == (640 * 768 * 768, 768 * 768 + 768, {})
    assert set(children) == {"qkv", "attn_drop", "proj", "proj_drop"}

    _, _, ruled = profile(Wrapper(), (x,), custom_ops={Attention: thop_attention_rule},  # type: ignore[misc]
                          verbose=False, ret_layer_info=True)
    assert ruled == {"attn": (RULE_MACS, PARAMS, {})}  # a ruled module is a leaf, as in thop


def test_profile_verbose_and_report_missing_print(x: torch.Tensor, capsys: pytest.CaptureFixture[str]) -> None:
    profile(Wrapper(), (x,), custom_ops={Attention: thop_attention_rule})
    assert "[INFO] Customize rule thop_attention_rule()" in capsys.readouterr().out
    profile(nn.Sequential(nn.Linear(4, 4), nn.GELU()), (torch.randn(2, 4),), report_missing=True)
    assert capsys.readouterr().out == ""  # every operator had a rule: nothing to report


def test_profile_report_missing_lists_uncounted_ops(capsys: pytest.CaptureFixture[str]) -> None:
    @torch.library.custom_op("fstest_thop::blackbox", mutates_args=())
    def blackbox(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    class M(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return blackbox(t)

    with pytest.warns(flopscope.FlopscopeWarning, match="fstest_thop.blackbox.default"):
        assert profile(M(), (torch.randn(3),), verbose=False, report_missing=True) == (0, 0)
    assert "[WARN] No rule for operator fstest_thop.blackbox.default (1 calls)" in capsys.readouterr().out


def test_thop_rule_sees_the_module_but_writes_only_to_a_stand_in(x: torch.Tensor) -> None:
    seen: dict[str, Any] = {}

    def rule(m: Any, inputs: tuple[Any, ...], y: Any) -> None:
        seen["is_attention"] = isinstance(m, Attention)
        seen["heads"] = m.num_heads
        seen["params"] = sum(p.numel() for p in m.parameters())
        m.total_ops += 10          # int onto the float64 tensor, as thop rules do
        m.total_ops += torch.DoubleTensor([2.6])
        m.total_params[0] = 123    # ignored: flopscope counts parameters itself
        m.note = "left on the stand-in"

    model = Wrapper()
    assert profile(model, (x,), custom_ops={Attention: rule}, verbose=False) == (13, PARAMS)
    assert seen == {"is_attention": True, "heads": 12, "params": PARAMS}
    assert not hasattr(model.attn, "note") and not hasattr(model.attn, "total_ops")


def test_thop_custom_ops_match_the_exact_type_like_thop(x: torch.Tensor) -> None:
    class MyAttention(Attention):
        pass

    model = Wrapper()
    model.attn = MyAttention(768, 12)
    assert profile(model, (x,), custom_ops={Attention: lambda m, i, o: 1}, verbose=False)[0] == RULE_MACS


def test_thop_rule_errors_name_the_rule(x: torch.Tensor) -> None:
    def bad_total(m: Any, inputs: tuple[Any, ...], y: Any) -> None:
        m.total_ops = "many"

    with pytest.raises(flopscope.RuleError, match=r"thop-style rule .*bad_total left total_ops = 'many'"):
        profile(Wrapper(), (x,), custom_ops={Attention: bad_total}, verbose=False)

    def raises(m: Any, inputs: tuple[Any, ...], y: Any) -> None:
        raise IndexError("inputs[1]")

    with pytest.raises(flopscope.RuleError, match=r"module rule .*raises raised for module 'attn' \(Attention\)"):
        profile(Wrapper(), (x,), custom_ops={Attention: raises}, verbose=False)

    def both(m: Any, inputs: tuple[Any, ...], y: Any) -> int:
        m.total_ops += 1
        return 1

    with pytest.raises(flopscope.RuleError, match=r"both added 1 to total_ops and returned 1"):
        thop_rule(both)(nn.Linear(1, 1), (), None)


def test_profile_rejects_a_bare_tensor_as_inputs(x: torch.Tensor) -> None:
    with pytest.raises(flopscope.UsageError, match=r"inputs must be a tuple .* inputs=\(x,\), not Tensor"):
        profile(Wrapper(), x, verbose=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nums", "fmt", "expected"),
    [(2_139_095_040, "%.2f", "2.14G"), (2_360_064, "%.3f", "2.360M"), (999, "%.2f", "999.00B"),
     (1_000_000_000, "%.2f", "1000.00M"), (4.5e12, "%.1f", "4.5T"), (12_345, "%.2f", "12.35K"),
     ([2_139_095_040, 2_360_064], "%.3f", ("2.139G", "2.360M"))],
)
def test_clever_format(nums: Any, fmt: str, expected: Any) -> None:
    assert clever_format(nums, fmt) == expected


def test_clever_format_default_is_thops() -> None:
    assert clever_format(1234) == "1.23K"


# -- against thop itself, where installed --------------------------------------------------------
@pytest.mark.parametrize(("name", "cls", "ruled", "macs", "thop_macs"), CASES, ids=IDS)
def test_thop_column_of_the_table(
    x: torch.Tensor, name: str, cls: type[nn.Module], ruled: tuple[type, ...], macs: int,
    thop_macs: int,
) -> None:
    thop = pytest.importorskip("thop", reason="thop not installed; pip install thop to compare")
    model = cls()
    ours = profile(copy.deepcopy(model), (x,), custom_ops={c: thop_attention_rule for c in ruled},
                   verbose=False)
    theirs = thop.profile(model, inputs=(x,), custom_ops={c: thop_attention_rule for c in ruled},
                          verbose=False)
    assert theirs[0] == thop_macs
    assert ours[0] == macs
    assert clever_format(ours) == thop.clever_format(list(ours))


def test_thop_misses_multihead_attention_entirely() -> None:
    thop = pytest.importorskip("thop", reason="thop not installed; pip install thop to compare")
    mha = nn.MultiheadAttention(768, 12, batch_first=True)
    q = torch.randn(1, 640, 768)
    assert thop.profile(copy.deepcopy(mha), inputs=(q, q, q), verbose=False) == (0.0, 0.0)
    assert profile(mha, (q, q, q), verbose=False) == (2_139_095_040, 4 * 768 * 768 + 4 * 768)


def test_linear_macs_are_what_thop_sees_without_rules() -> None:
    assert LINEAR_MACS == 1_509_949_440
