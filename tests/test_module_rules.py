"""Module rules mean what they say (issue 3): a ruled module is costed as a whole, per call; the
operators inside it are shadowed; the outermost rule wins; a rule never adds to its children.

The table of the issue, with thop's figures for contrast (thop adds a rule on a parent on top of
its children, and does not see the functional matmuls at all):

    case                                   thop            flopscope
    Wrapper, no rules                      1,509,949,440   2,139,095,040 (ops counted)
    Wrapper, rule on Attention             2,139,095,040   2,139,095,040
    Wrapper, rule on Wrapper               3,649,044,480   2,139,095,040
    Wrapper, rules on both                 4,278,190,080   2,139,095,040 (outer wins)
    TwiceWrapper, rule on TwiceWrapper     5,158,993,920   2,139,095,040, shadowed 4,278,190,080
    TwiceWrapper, rule on Attention        4,278,190,080   4,278,190,080 (calls = 2)
"""

from __future__ import annotations

import contextlib
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
)
from flopscope import Cost, Counter, Phase, RuleError, count

# Attention's operators: qkv 3*N*C*C + proj N*C*C + q@k^T N*N*C + attn@v N*N*C
OP_MACS = 3 * 640 * 768 * 768 + 640 * 768 * 768 + 2 * 640 * 640 * 768


def test_the_numbers_of_the_issue_add_up() -> None:
    assert RULE_MACS == 2_139_095_040 == OP_MACS
    assert LINEAR_MACS == 1_509_949_440
    assert PARAMS == 2_360_064


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    torch.manual_seed(0)
    return sample()


# -- the table ------------------------------------------------------------------------------------
def test_wrapper_no_rules_counts_the_functional_matmuls(x: torch.Tensor) -> None:
    r = count(Wrapper(), x)
    assert r.macs == 2_139_095_040
    assert r.params == 2_360_064
    assert r.rules == ()
    assert r.uncounted == {}
    assert r.opaque == ()
    mods = r.by_module()
    assert mods["attn"].self_cost.macs == 2 * 640 * 640 * 768  # q@k^T and attn@v, not modules
    assert mods["attn.qkv"].inclusive.macs == 3 * 640 * 768 * 768


def test_wrapper_rule_on_attention(x: torch.Tensor) -> None:
    r = count(Wrapper(), x, rules={Attention: attention_rule})
    assert r.macs == 2_139_095_040
    assert r.params == 2_360_064
    (rec,) = r.rules
    assert (rec.module, rec.rule, rec.calls) == ("attn", "attention_rule", 1)
    assert rec.cost == Cost.from_macs(2_139_095_040)
    assert rec.shadowed.macs == 2_139_095_040
    assert rec.macs_only and not rec.differs
    assert r.rule_mismatches() == ()
    # the children of a ruled module add nothing: their operators are shadowed
    mods = r.by_module()
    assert mods["attn.qkv"].inclusive == Cost()
    assert mods["attn"].inclusive.macs == mods[""].inclusive.macs == 2_139_095_040
    assert r.by_op() == {"module_rule:Attention": flopscope.OpStats(1, Cost.from_macs(RULE_MACS))}


def test_wrapper_rule_on_wrapper_is_not_added_to_its_children(x: torch.Tensor) -> None:
    r = count(Wrapper(), x, rules={Wrapper: attention_rule})
    assert r.macs == 2_139_095_040  # thop: 3,649,044,480
    assert r.params == 2_360_064
    (rec,) = r.rules
    assert (rec.module, rec.calls, rec.shadowed.macs) == ("", 1, 2_139_095_040)


def test_wrapper_rules_on_both_outer_wins(x: torch.Tensor) -> None:
    calls: list[str] = []

    def inner(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> int:
        calls.append("inner")
        return 1

    r = count(Wrapper(), x, rules={Wrapper: attention_rule, Attention: inner})
    assert r.macs == 2_139_095_040  # thop: 4,278,190,080
    assert r.params == 2_360_064
    assert [rec.module for rec in r.rules] == [""]
    assert calls == []  # the inner rule is not even called


def test_twice_wrapper_rule_on_twice_wrapper_costs_the_rule_once(x: torch.Tensor) -> None:
    r = count(TwiceWrapper(), x, rules={TwiceWrapper: attention_rule})
    assert r.macs == 2_139_095_040  # the rule, once (thop: 5,158,993,920)
    assert r.params == 2_360_064
    (rec,) = r.rules
    assert (rec.module, rec.calls) == ("", 1)
    assert rec.shadowed.macs == 4_278_190_080  # what the operators inside measured
    assert r.rule_mismatches() == (rec,)
    assert r.modules["attn"] == ("Attention", 2)
    table = r.table()
    assert "attention_rule" in table and "4.28 GMAC" in table  # the mismatch is shown


def test_twice_wrapper_rule_on_attention_is_costed_per_call(x: torch.Tensor) -> None:
    r = count(TwiceWrapper(), x, rules={Attention: attention_rule})
    assert r.macs == 4_278_190_080
    assert r.params == 2_360_064
    (rec,) = r.rules
    assert (rec.module, rec.calls) == ("attn", 2)
    assert rec.cost.macs == rec.shadowed.macs == 4_278_190_080
    assert r.rule_mismatches() == ()
    assert r.modules["attn"] == ("Attention", 2)


# -- how a rule is attached -----------------------------------------------------------------------
@pytest.mark.parametrize("key", ["class", "instance", "path"])
def test_rule_by_class_instance_or_path(x: torch.Tensor, key: str) -> None:
    model = TwiceWrapper()
    target: Any = {"class": Attention, "instance": model.attn, "path": "attn"}[key]
    r = count(model, x, rules={target: attention_rule})
    assert r.macs == 4_278_190_080
    assert [(rec.module, rec.calls) for rec in r.rules] == [("attn", 2)]


def test_rule_by_class_also_covers_subclasses(x: torch.Tensor) -> None:
    class MyAttention(Attention):
        pass

    model = Wrapper()
    model.attn = MyAttention(768, 12)
    r = count(model, x, rules={Attention: lambda m, i, o: 7})
    assert r.macs == 7


def test_instance_rule_beats_class_rule(x: torch.Tensor) -> None:
    model = TwiceWrapper()
    r = count(model, x, rules={Attention: lambda m, i, o: 1, model.attn: lambda m, i, o: 5})
    assert r.macs == 10


def test_rule_on_the_root_path(x: torch.Tensor) -> None:
    r = count(TwiceWrapper(), x, rules={"": attention_rule})
    assert r.macs == 2_139_095_040


def test_unknown_rule_path_is_an_error_with_a_suggestion(x: torch.Tensor) -> None:
    with pytest.raises(RuleError, match=r"path 'atn': TwiceWrapper has no module.*did you mean 'attn'"):
        count(TwiceWrapper(), x, rules={"atn": attention_rule})


def test_a_rule_can_return_a_full_cost(x: torch.Tensor) -> None:
    cost = Cost(macs=RULE_MACS, flops=2 * RULE_MACS + 12 * 640 * 640 * 6, bytes_read=1, bytes_written=2)
    r = count(Wrapper(), x, rules={Attention: lambda m, i, o: cost})
    assert r.total() == cost
    (rec,) = r.rules
    assert not rec.macs_only
    assert rec.differs  # FLOPs are compared too, and softmax/scale are not 6 per element here


def test_rule_receives_module_positional_inputs_and_output(x: torch.Tensor) -> None:
    seen: list[tuple[nn.Module, tuple[Any, ...], Any]] = []

    def rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> int:
        seen.append((m, inputs, out))
        return 0

    model = Wrapper()
    y = count(model, x, rules={Attention: rule})
    assert y.macs == 0
    ((m, inputs, out),) = seen
    assert m is model.attn
    assert len(inputs) == 1 and inputs[0] is x
    assert isinstance(out, torch.Tensor) and out.shape == x.shape


def test_tensor_arithmetic_inside_a_rule_is_not_counted(x: torch.Tensor) -> None:
    def rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> torch.Tensor:
        shape = torch.tensor(inputs[0].shape)
        return torch.prod(shape) * 0 + 100  # int64 tensor: dispatched ops, must not be counted

    r = count(Wrapper(), x, rules={Attention: rule})
    assert r.macs == 100
    assert r.total().flops == 200
    assert set(r.by_op()) == {"module_rule:Attention"}


def test_rules_work_in_shape_only_mode(x: torch.Tensor) -> None:
    r = count(TwiceWrapper(), x, rules={Attention: attention_rule}, shape_only=True)
    assert r.macs == 4_278_190_080
    assert r.rules[0].shadowed.macs == 4_278_190_080


def test_backward_of_a_ruled_module_is_counted_from_its_operators(x: torch.Tensor) -> None:
    """Module rules cost the forward call; backward operators are counted as usual."""
    torch.manual_seed(0)
    model = Wrapper()
    plain = count(model, x, backward=True)
    ruled = count(model, x, backward=True, rules={Attention: lambda m, i, o: 1})
    assert ruled.total(Phase.FORWARD).macs == 1
    assert ruled.total(Phase.BACKWARD) == plain.total(Phase.BACKWARD)
    assert ruled.total(Phase.BACKWARD).macs > 0


def test_rules_are_per_count_never_global(x: torch.Tensor) -> None:
    count(Wrapper(), x, rules={Attention: lambda m, i, o: 1})
    assert count(Wrapper(), x).macs == 2_139_095_040


def test_counter_with_rules_adds_up_over_calls(x: torch.Tensor) -> None:
    model = Wrapper()
    with Counter(model, rules={Attention: attention_rule}) as c:
        model(x)
        model(x)
    (rec,) = c.report.rules
    assert (rec.calls, rec.cost.macs) == (2, 2 * RULE_MACS)


def test_rule_records_round_trip_through_json(x: torch.Tensor) -> None:
    r = count(TwiceWrapper(), x, rules={TwiceWrapper: attention_rule})
    back = flopscope.Report.from_json(r.to_json())
    assert back.rules == r.rules
    assert back.rule_mismatches() == r.rule_mismatches()


# -- errors ----------------------------------------------------------------------------------------
def test_rule_that_raises_names_the_rule_and_the_module(x: torch.Tensor) -> None:
    def broken_rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> int:
        raise KeyError("no such dim")

    with pytest.raises(
        RuleError,
        match=r"module rule .*broken_rule raised for module 'attn' \(Attention\): KeyError",
    ) as info:
        count(Wrapper(), x, rules={Attention: broken_rule})
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("2e9", r"'2e9' \(str\)"), (None, r"None \(NoneType\)"), (1.5, r"1\.5 \(float\)"),
     (True, r"True \(bool\)")],
)
def test_rule_returning_a_non_number_names_the_rule_and_the_module(
    x: torch.Tensor, value: object, shown: str
) -> None:
    def odd_rule(m: nn.Module, inputs: tuple[Any, ...], out: Any) -> Any:
        return value

    with pytest.raises(
        RuleError,
        match=rf"module rule .*odd_rule for module 'attn' \(Attention\) returned {shown}; a rule "
        r"returns a flopscope\.Cost",
    ):
        count(Wrapper(), x, rules={Attention: odd_rule})


def test_rule_returning_a_negative_cost_is_an_error(x: torch.Tensor) -> None:
    with pytest.raises(RuleError, match=r"for module 'attn' \(Attention\) returned a negative cost"):
        count(Wrapper(), x, rules={"attn": lambda m, i, o: -1})


def test_rule_that_is_not_callable_is_an_error(x: torch.Tensor) -> None:
    with pytest.raises(RuleError, match=r"the rule for <class .*Attention'> is not callable: 5"):
        count(Wrapper(), x, rules={Attention: 5})


def test_model_is_usable_after_a_failing_rule(x: torch.Tensor) -> None:
    model = Wrapper()
    with pytest.raises(RuleError, match="raised for module 'attn'"):
        count(model, x, rules={Attention: lambda m, i, o: 1 // 0})
    assert count(model, x).macs == 2_139_095_040
    assert not model._forward_hooks and not model.attn._forward_hooks


# -- nn.MultiheadAttention: counted fully without rules ------------------------------------------
# in-projection 3*N*C*C = 1,132,462,080; q@k^T and attn@v 2*N*N*C = 629,145,600;
# out-projection N*C*C = 377,487,360; total 2,139,095,040
MHA_MACS = 3 * 640 * 768**2 + 2 * 640**2 * 768 + 640 * 768**2


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval", "eval+no_grad"])
def test_multihead_attention_is_counted_fully(x: torch.Tensor, mode: str, need_weights: bool) -> None:
    assert (3 * 640 * 768**2, 2 * 640**2 * 768, 640 * 768**2) == (1_132_462_080, 629_145_600, 377_487_360)
    assert MHA_MACS == 2_139_095_040
    mha = nn.MultiheadAttention(768, 12, batch_first=True)
    ctx = torch.no_grad() if mode == "eval+no_grad" else contextlib.nullcontext()
    with ctx:
        r = count(mha, x, x, x, need_weights=need_weights, train=mode == "train")
    assert r.macs == 2_139_095_040
    assert r.params == 4 * 768 * 768 + 4 * 768  # in_proj (3C x C + 3C) + out_proj (C x C + C)
    assert r.uncounted == {}
    ops = set(r.by_op())
    if mode == "eval+no_grad":  # the fused fast path: one operator does everything
        assert "aten._native_multi_head_attention.default" in ops
    else:
        assert "aten._native_multi_head_attention.default" not in ops
