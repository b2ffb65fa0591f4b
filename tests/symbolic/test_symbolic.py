"""Symbolic costs (flopscope.symbolic): formulas of named sizes equal concrete counts exactly.

Default tier: a small transformer layer, tiny GPT-2 and Llama configs, resnet18 against
resolution. ``FLOPSCOPE_SLOW=1``: GPT-2 124M, a Llama-shaped config with backward, resnet50.
"""

from __future__ import annotations

import json
import os

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.cost import Cost
from flopscope.symbolic import DomainError, count_symbolic, pretty

SLOW = pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"), reason="slow tier: FLOPSCOPE_SLOW=1")
POINTS = [(1, 1), (1, 17), (2, 128), (3, 1000), (1, 4096)]


def _same(concrete: flopscope.Report, evaluated: flopscope.Report) -> None:
    """Equal totals per phase, per module, and per operator (operators that cost something: the
    calls of zero-cost views can differ where PyTorch takes a shortcut on concrete sizes)."""
    assert evaluated.total() == concrete.total()
    for phase in concrete.phases:
        assert evaluated.total(phase) == concrete.total(phase)
    assert {p: s.inclusive for p, s in evaluated.by_module().items()} == \
        {p: s.inclusive for p, s in concrete.by_module().items()}
    costly = {op: s.cost for op, s in concrete.by_op().items() if s.cost != Cost()}
    assert {op: s.cost for op, s in evaluated.by_op().items() if s.cost != Cost()} == costly


def test_transformer_layer_formula_equals_concrete_counts() -> None:
    model = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True).eval()
    rep = count_symbolic(model, torch.randn(2, 16, 64), symbolic={"batch": (0, 0), "seq_len": (0, 1)})
    b, t = rep.symbols["batch"], rep.symbols["seq_len"]
    # attention: Q K^T and P V are 2 * (64 / 4 heads) * 4 heads = 128 MACs per (b, t, t);
    # four 64x64 projections and the 64x256x2 MLP are 4 * 4096 + 2 * 16384 MACs per token
    assert sympy.expand(rep.total().macs - (128 * b * t**2 + 49152 * b * t)) == 0
    for batch, seq in [(2, 128), (3, 50)]:
        assert rep.violated(batch=batch, seq_len=seq) == []
        _same(flopscope.count(model, torch.randn(batch, seq, 64)),
              rep.evaluate(batch=batch, seq_len=seq))
    # batch 1 takes another path in nn.MultiheadAttention: outside the domain, and said so
    assert rep.violated(batch=1, seq_len=17) == ["2 <= batch"]
    with pytest.raises(DomainError, match="batch=1, seq_len=17 is outside the domain"):
        rep.evaluate(batch=1, seq_len=17)


def _hf(kind: str, batch: int, seq_len: int, **config: int) -> object:
    pytest.importorskip("transformers")
    from flopscope.sources import load_model

    return load_model(f"hf:{kind}", shape_only=True, batch=batch, seq_len=seq_len, config=config)


TINY = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=4096),
    "llama": dict(num_hidden_layers=2, hidden_size=64, intermediate_size=160,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                  max_position_embeddings=4096),
}


def _check_hf(kind: str, config: dict[str, int], points: list[tuple[int, int]],
              backward: bool = False) -> None:
    loaded = _hf(kind, 2, 16, **config)
    spec = {"batch": ("input_ids", 0), "seq_len": ("input_ids", 1)}
    rep = count_symbolic(loaded.model, loaded.inputs, backward=backward, symbolic=spec)
    assert rep.domain_text() == "valid for 2 <= batch, 2 <= seq_len"
    # batch 1 is outside that domain: its own formula, traced at batch 1 (then fixed to 1)
    one = count_symbolic(loaded.model, loaded.inputs, backward=backward, symbolic=spec,
                         hints={"batch": 1})
    assert "batch == 1" in one.domain_text()
    for batch, seq in points:
        other = _hf(kind, batch, seq, **config)
        concrete = flopscope.count(other.model, other.inputs, shape_only=True, backward=backward)
        if seq == 1:  # one token: no causal mask, another path; outside the domain, and said so
            assert "2 <= seq_len" in rep.violated(batch=batch, seq_len=seq)
            continue
        if batch == 1:
            assert rep.violated(batch=1, seq_len=seq) == ["2 <= batch"]
            _same(concrete, one.evaluate(batch=1, seq_len=seq))
        else:
            _same(concrete, rep.evaluate(batch=batch, seq_len=seq))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_tiny_decoders_formula_equals_concrete_counts(kind: str) -> None:
    _check_hf(kind, TINY[kind], [(1, 1), (1, 17), (3, 1000)])


def test_tiny_llama_forward_backward() -> None:
    _check_hf("llama", TINY["llama"], [(2, 128)], backward=True)


@SLOW
@pytest.mark.parametrize(("kind", "config"), [
    ("gpt2", {}),
    ("llama", dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1376,
                   num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                   max_position_embeddings=4096)),
])
@pytest.mark.parametrize("backward", [False, True])
def test_decoders_at_the_acceptance_points(kind: str, config: dict[str, int], backward: bool) -> None:
    config = {**config, "n_positions": 4096} if kind == "gpt2" else config
    _check_hf(kind, config, POINTS, backward=backward)


def test_resnet18_against_resolution() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18()
    rep = count_symbolic(model, torch.randn(1, 3, 224, 224),
                         symbolic={"resolution": [(0, 2), (0, 3)]})
    assert any(isinstance(a, sympy.floor) for a in sympy.preorder_traversal(rep.total().macs))
    assert rep.evaluate(resolution=224).macs == 1_814_073_344  # torchvision: 1.814 GFLOPS (MACs)
    for r in (160, 161, 288):
        _same(flopscope.count(model, torch.randn(1, 3, r, r), shape_only=True),
              rep.evaluate(check=False, resolution=r))


@SLOW
def test_resnet50_against_resolution() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50()
    rep = count_symbolic(model, torch.randn(1, 3, 224, 224),
                         symbolic={"resolution": [(0, 2), (0, 3)]})
    assert rep.evaluate(resolution=224).macs == 4_089_184_256  # published 4.089 GFLOPS
    for r in (160, 288, 320):
        _same(flopscope.count(model, torch.randn(1, 3, r, r), shape_only=True),
              rep.evaluate(check=False, resolution=r))


def test_json_strings_parse_back_and_pretty_text() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    rep = count_symbolic(model, torch.randn(3, 8), symbolic={"batch": (0, 0)})
    data = json.loads(json.dumps(rep.to_dict()))
    b = sympy.Symbol("batch")
    assert sympy.sympify(data["symbolic"]["total"]["macs"]) == 192 * b  # 8*16 + 16*4 per row
    assert sympy.sympify(data["symbolic"]["modules"]["0"]["flops"]) == 272 * b  # 2*128 + bias 16
    assert set(data["symbolic"]["total"]) == {"macs", "flops", "bytes_read", "bytes_written"}
    assert pretty(6_740_000_000 * b + 2_100_000 * b**2) == "2.10e6·batch² + 6.74e9·batch"
    assert pretty(12 * b + 3) == "12·batch + 3"


def test_derived_figures_per_token_and_crossover() -> None:
    model = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True).eval()
    rep = count_symbolic(model, torch.randn(2, 16, 64), symbolic={"batch": (0, 0), "seq_len": (0, 1)})
    t = rep.symbols["seq_len"]
    flops = sympy.expand(rep.total().flops.xreplace({rep.symbols["batch"]: 1}))
    assert rep.flops_per_token() == sympy.diff(flops, t)
    quad, rest = rep.split()
    n = rep.crossover()
    assert n is not None
    at = {t: n, rep.symbols["batch"]: 1}
    assert quad.xreplace(at) >= rest.xreplace(at)
    assert quad.xreplace({**at, t: n - 1}) < rest.xreplace({**at, t: n - 1})
    assert rep.average_per_token(batch=2, seq_len=100) == float(
        rep.total().flops.xreplace({rep.symbols["batch"]: 2, t: 100})) / 200


def test_bad_specs_are_usage_errors() -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(flopscope.UsageError, match="has 2 dimensions, no dimension 5"):
        count_symbolic(model, torch.randn(2, 4), symbolic={"batch": (0, 5)})
    with pytest.raises(flopscope.UsageError, match="is not a tensor among the model's inputs"):
        count_symbolic(model, torch.randn(2, 4), symbolic={"batch": ("x", 0)})
    with pytest.raises(flopscope.UsageError, match="is not an identifier"):
        count_symbolic(model, torch.randn(2, 4), symbolic={"2b": (0, 0)})


class _NonZero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum() * 2


class _Selects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.select = nn.Sequential(nn.Linear(3, 3), _NonZero())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.select(x)


class _Item(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[: int((x > 0).sum().item())]


@pytest.mark.parametrize("backward", [False, True])
def test_data_dependent_size_is_a_named_unknown(backward: bool) -> None:
    # x[x > 0]: aten.index with a boolean mask has a data-dependent size u0, and summing it
    # costs u0 FLOPs: u0 stays in the costs, named with the operator that made it and its
    # module, and the report at the real u0 equals the concrete count
    # (tests/symbolic/test_symbolic_data_dependent.py has more)
    torch.manual_seed(0)
    model, x = _Selects(), torch.randn(5, 3, requires_grad=backward)
    rep = count_symbolic(model, x, symbolic={"batch": (0, 0)}, warn=False, backward=backward)
    assert rep.unknowns == {"u0": "data-dependent size made by aten.index.Tensor in module "
                                  "'select.1'"}
    assert str(rep.by_op()["aten.sum.default"].flops) == "u0"
    u0 = int((model.select[0](x) > 0).sum())
    concrete = flopscope.count(model, x, warn=False, backward=backward)
    _same(concrete, rep.evaluate(batch=5, u0=u0))


def test_data_dependent_value_in_the_models_own_code() -> None:
    # .item() makes u0; int() of it fails in the forward itself, between operators
    with pytest.raises(flopscope.ForwardError, match=(
            r"data-dependent size or value \(u0: a size or value made by "
            r"aten\._local_scalar_dense\.default\).* in module '' \(_Item\)")):
        count_symbolic(_Item(), torch.randn(5, 3), symbolic={"batch": (0, 0)}, warn=False)


def test_cli_symbolic_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from flopscope.cli import main

    argv = ["count", "hf:gpt2", "--shape-only", "--symbolic", "batch,seq_len", "--format", "json"]
    for key, value in TINY["gpt2"].items():
        argv += ["--config", f"{key}={value}"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    macs = sympy.sympify(data["symbolic"]["total"]["macs"])
    assert macs.free_symbols == {sympy.Symbol("batch"), sympy.Symbol("seq_len")}
    assert data["domain"] == ["2 <= batch", "2 <= seq_len"]


def test_cli_unknown_symbol() -> None:
    from flopscope.cli import main

    assert main(["count", "torchvision:resnet18", "--symbolic", "depth"]) == 2


class _PadToWindow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # swin-style padding to a window of 7
        return F.pad(x, (0, (7 - x.shape[-1] % 7) % 7)) * 2


def test_padding_to_a_window_is_a_formula() -> None:
    # PyTorch's C++ constant_pad_nd takes its padding as concrete integers only; the symbolic
    # count runs its Python decomposition instead, whose branch on the padding (> 0 at w = 10,
    # where 3 columns are left over) is the domain
    rep = count_symbolic(_PadToWindow(), torch.randn(2, 10), symbolic={"w": (0, 1)}, warn=False)
    w = rep.symbols["w"]
    # the product by 2 runs over the padded 2 x (w + pad) elements, pad = (7 - w % 7) % 7
    flops = rep.by_op()["aten.mul.Tensor"].flops
    assert flops.free_symbols == {w}
    assert all(flops.xreplace({w: n}) == 2 * (n + (7 - n % 7) % 7) for n in range(1, 50))
    for n in (10, 12, 22):  # padded by 4, 2, 6
        concrete = flopscope.count(_PadToWindow(), torch.randn(2, n), shape_only=True, warn=False)
        _same(concrete, rep.evaluate(w=n))
    assert rep.violated(w=14)  # 14 needs no padding: another branch, outside the domain


class _Upsample(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=2 * x.shape[-1]) * 2


def test_a_kernel_that_needs_concrete_sizes_is_named() -> None:
    # upsample_nearest1d's CompositeImplicitAutograd kernel takes output_size as concrete
    # integers only, before any operator reaches flopscope: the Python function that called it
    with pytest.raises(flopscope.ForwardError, match=(
            r"symbolic counting failed \(PyTorch's kernel called by "
            r"torch\.nn\.functional\.interpolate takes its sizes as concrete integers only.*"
            r"in module '' \(_Upsample\).*SymIntArrayRef expected to contain only concrete")):
        count_symbolic(_Upsample(), torch.randn(2, 3, 10), symbolic={"w": (0, 2)}, warn=False)
