"""The decomposition fallback: an operator with no rule is counted as its decomposition's pieces,
so ``torch.inference_mode()`` (where composite operators reach the dispatcher undecomposed) counts
exactly like ``torch.no_grad()``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopscope
from flopscope.core.decompose import decomposition, runs_decomposed


def _both(model: nn.Module, *args: torch.Tensor) -> tuple[flopscope.Report, flopscope.Report]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)  # nothing uncounted
        with torch.no_grad():
            no_grad = flopscope.count(model, *args)
        with torch.inference_mode():
            inference = flopscope.count(model, *args)
    return no_grad, inference


def test_which_operators_run_decomposed() -> None:
    aten = torch.ops.aten
    assert runs_decomposed(aten.conv2d.default)  # no kernel of its own
    assert runs_decomposed(aten.linear.default)
    assert not runs_decomposed(aten.silu_backward.default)  # a fused CPU kernel beside it
    assert not runs_decomposed(aten.mm.default)
    assert decomposition(aten.addmm.default) is not None  # torch._decomp has one (a rule wins)
    assert decomposition(aten.add_.Tensor) is None  # writes in place: never from the table
    assert decomposition(aten.size.int) is None  # metadata queries are never decomposed


def test_linear_under_inference_mode_counts_its_pieces() -> None:
    lin = nn.Linear(8, 4)
    with torch.inference_mode():
        r = flopscope.count(lin, torch.randn(2, 8))
    # aten.linear decomposes into t + addmm: 2 x 4 x 8 = 64 MACs; FLOPs 2 * 64 + 8 bias adds = 136
    assert (r.macs, r.flops) == (64, 136)
    assert r.decomposed == {"aten.linear.default": 1}
    assert r.uncounted == {}
    # bytes are the fused operator's own: x (2x8) + weight (4x8) + bias (4) read, out (2x4) written
    stats = r.by_op()["aten.linear.default"]
    assert (stats.cost.bytes_read, stats.cost.bytes_written) == ((16 + 32 + 4) * 4, 8 * 4)


@pytest.mark.parametrize("name", ["resnet18", "vit_b_16"])
def test_torchvision_inference_mode_equals_no_grad(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.get_model(name, weights=None).eval()
    no_grad, inference = _both(model, torch.randn(1, 3, 224, 224))
    # published: resnet18 1.814 GMAC, vit_b_16 17.564 GMAC
    assert inference.macs == no_grad.macs == {"resnet18": 1_814_073_344,
                                              "vit_b_16": 17_563_828_224}[name]
    assert inference.flops == no_grad.flops
    assert {p: s.inclusive.macs for p, s in inference.by_module().items()} == {
        p: s.inclusive.macs for p, s in no_grad.by_module().items()}


def test_llama_inference_mode_equals_no_grad() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "llama", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    no_grad, inference = _both(model, ids)
    assert (inference.macs, inference.flops) == (no_grad.macs, no_grad.flops)
    assert inference.macs == 362_496  # derived by hand in tests/test_transformers.py
    assert "aten.scaled_dot_product_attention.default" in inference.decomposed


def test_a_piece_without_rule_or_decomposition_is_listed_under_its_own_name() -> None:
    rules = flopscope.default_rules()
    # linear's pieces are t and addmm; without addmm's rule (addmm has a table decomposition into
    # mm + add, which do have rules) everything is still counted: 2 x 4 x 8 = 64 MACs.
    no_addmm = flopscope.RuleSet({k: v for k, v in rules.items() if k != "aten::addmm"})
    with torch.inference_mode():
        r = flopscope.count(nn.Linear(8, 4), torch.randn(2, 8), rules=no_addmm)
    assert r.macs == 64
    assert r.uncounted == {}


def test_report_marks_decomposed_records_in_json() -> None:
    with torch.inference_mode():
        r = flopscope.count(nn.Linear(8, 4), torch.randn(2, 8))
    data = r.to_dict()
    assert [rec["op"] for rec in data["records"] if rec.get("decomposed")] == ["aten.linear.default"]
    assert flopscope.Report.from_dict(data) == r
