"""The counting core: attribution, phases, options, errors, and leaving the model untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import flopscope
from flopscope import Counter, Inputs, Phase, count


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class SelfAttention(nn.Module):
    """Functional attention: the matmuls and softmax are not modules."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return attn @ v + x


def _snapshot(model: nn.Module) -> dict[str, object]:
    return {
        "dict": {name: sorted(m.__dict__) for name, m in model.named_modules()},
        "hooks": {
            name: [len(getattr(m, h)) for h in (
                "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")]
            for name, m in model.named_modules()
        },
        "training": {name: m.training for name, m in model.named_modules()},
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [p.grad for p in model.parameters()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
    }


def _global_hooks() -> list[object]:
    from torch.nn.modules import module as m

    # global hooks, and how every module is called (flopscope.core.module_calls replaces it while
    # a Counter is active)
    return [len(m._global_forward_hooks), len(m._global_forward_pre_hooks), nn.Module._call_impl]


def _assert_same(before: dict[str, object], model: nn.Module) -> None:
    after = _snapshot(model)
    assert after["dict"] == before["dict"]
    assert after["hooks"] == before["hooks"]
    assert after["training"] == before["training"]
    assert after["grads"] == before["grads"]
    assert after["requires_grad"] == before["requires_grad"]
    state_before = before["state"]
    assert isinstance(state_before, dict)
    assert list(after["state"]) == list(state_before)  # type: ignore[arg-type]
    for k, v in state_before.items():
        assert torch.equal(after["state"][k], v), k  # type: ignore[index]


def test_linear_model_exact_counts() -> None:
    model = TwoLayer().eval()
    r = count(model, torch.randn(4, 8))
    # fc1: 4*8*16 = 512 MACs; fc2: 4*16*4 = 256 MACs
    assert r.macs == 512 + 256
    by = r.by_module()
    assert by["fc1"].self_cost.macs == 512
    assert by["fc2"].self_cost.macs == 256
    # fc1 FLOPs = 2*512 + 4*16 bias adds; bn eval = 2 per element (4*16); relu 1 per element;
    # fc2 = 2*256 (no bias)
    assert by["fc1"].inclusive.flops == 2 * 512 + 64
    assert by["bn"].inclusive.flops == 2 * 64
    assert by[""].self_cost.flops == 64  # the functional relu belongs to the root
    assert r.flops == 2 * 512 + 64 + 2 * 64 + 64 + 2 * 256
    # params: fc1 8*16+16, bn 16+16, fc2 16*4
    assert r.params == 144 + 32 + 64
    assert by["bn"].params.buffers == 16 + 16 + 1
    assert r.uncounted == {}


def test_functional_attention_is_counted() -> None:
    model = SelfAttention(dim=8)
    r = count(model, torch.randn(2, 5, 8))
    # qkv: 2*5*8*24 = 1920; q@k^T: 2*5*5*8 = 400; attn@v: 2*5*5*8 = 400
    assert r.macs == 1920 + 400 + 400
    ops = r.by_op()
    assert ops["aten._softmax.default"].cost.flops == 5 * 2 * 5 * 5  # 5 per score element
    assert ops["aten.add.Tensor"].cost.flops == 2 * 5 * 8  # the residual add


def test_training_step_phases_and_backward_attribution() -> None:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with Counter(model) as c:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    r = c.report
    assert r.phases == (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)  # SGD: its own phase
    fwd, bwd = r.by_module(Phase.FORWARD), r.by_module(Phase.BACKWARD)
    assert fwd["fc1"].self_cost.macs == 512
    # fc1's input needs no grad: only grad_weight = x^T @ g, 8*16*4 = 512 MACs
    assert bwd["fc1"].self_cost.macs == 512
    # fc2: grad_input 4*4*16 = 256 and grad_weight 256
    assert bwd["fc2"].self_cost.macs == 2 * 256
    assert r.total("backward").macs == 512 + 512
    assert r.uncounted == {}


def test_two_calls_in_one_counter_double() -> None:
    model = TwoLayer().eval()
    x = torch.randn(3, 8)
    one = count(model, x)
    with Counter(model) as c:
        model(x)
        model(x)
    assert c.report.total() == one.total() * 2
    assert c.report.by_module()["fc1"].calls == 2


def test_backward_option_matches_counter_and_leaves_no_grads() -> None:
    model = TwoLayer()
    x = torch.randn(4, 8)
    before = _snapshot(model)
    r = count(model, x, backward=True)
    _assert_same(before, model)
    assert r.total("forward").macs == 768
    # fc1 grad_weight 512; fc2 grad_input 256 + grad_weight 256
    assert r.total("backward").macs == 1024


def test_model_untouched_train_mode_buffers_restored() -> None:
    model = TwoLayer().train()
    before = _snapshot(model)
    hooks = _global_hooks()
    count(model, torch.randn(4, 8), train=True)
    count(model, torch.randn(4, 8), train=False, backward=False)
    count(model, torch.randn(4, 8), shape_only=True)
    _assert_same(before, model)
    assert _global_hooks() == hooks
    assert model.bn.num_batches_tracked.item() == 0


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 3), nn.Linear(5, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.ok(x))


def test_forward_error_names_module_and_leaves_model_untouched() -> None:
    model = Exploding().train()
    model.inner[0].eval()
    before = _snapshot(model)
    hooks = _global_hooks()
    with pytest.raises(flopscope.ForwardError, match=r"in module 'inner\.1' \(Linear\)") as info:
        count(model, torch.randn(2, 4), train=False)
    assert info.value.module_path == "inner.1"
    assert isinstance(info.value.__cause__, RuntimeError)
    _assert_same(before, model)
    assert _global_hooks() == hooks


def test_counter_keeps_user_exception_and_notes_path() -> None:
    model = Exploding()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        with Counter(model):
            model(torch.randn(2, 4))
    assert "flopscope: raised in module 'inner.1'" in getattr(info.value, "__notes__", [])


# An operator with no rule and no decomposition (a CompositeExplicitAutograd kernel of its own).
_LIB = torch.library.Library("flopscope_strict", "FRAGMENT")  # noqa: TID251
_LIB.define("opaque(Tensor x) -> Tensor")
_LIB.impl("opaque", lambda x: x.clone(), "CompositeExplicitAutograd")


def test_strict_raises_on_uncounted_op(quiet: object) -> None:
    model = nn.Linear(4, 4)
    rules = flopscope.default_rules()
    no_relu = flopscope.RuleSet({k: rules[k] for k in rules if k != "aten::relu"})

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(model(x))

    # relu without its rule is counted by its decomposition (torch._decomp's relu), so strict
    # mode has nothing to complain about; the record says how it was counted.
    r = count(M(), torch.randn(2, 4), rules=no_relu, strict=True)
    assert r.uncounted == {}
    assert r.decomposed == {"aten.relu.default": 1}
    assert r.by_op()["aten.relu.default"].cost.flops == 8  # one compare per element: 2 x 4

    # An operator with neither a rule nor a decomposition is uncounted, and fatal under strict.
    class Opaque(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.flopscope_strict.opaque(model(x))  # type: ignore[no-any-return]

    r = count(Opaque(), torch.randn(2, 4))
    assert r.uncounted == {"flopscope_strict.opaque.default": 1}
    with pytest.raises(flopscope.StrictModeError,
                       match=r"no rule for operator flopscope_strict\.opaque\.default"):
        count(Opaque(), torch.randn(2, 4), strict=True)


def test_uncounted_warns_once() -> None:
    with pytest.warns(flopscope.FlopscopeWarning,
                      match=r"flopscope_strict\.opaque\.default \(2 calls\)") as rec:
        with Counter():
            torch.ops.flopscope_strict.opaque(torch.randn(3))
            torch.ops.flopscope_strict.opaque(torch.randn(3))
    assert len([w for w in rec if issubclass(w.category, flopscope.FlopscopeWarning)]) == 1


class TakesStrict(nn.Module):
    def forward(self, x: torch.Tensor, strict: bool = False) -> torch.Tensor:
        return x * 2 if strict else x + 1


def test_option_names_never_hide_model_keywords() -> None:
    model = TakesStrict()
    with pytest.raises(flopscope.UsageError, match=r"flopscope\.Inputs"):
        count(model, torch.randn(3), strict=True)
    r = count(model, Inputs(torch.randn(3), strict=True))
    assert list(r.by_op()) == ["aten.mul.Tensor"]
    r = count(model, Inputs(torch.randn(3), strict=False), strict=True)
    assert list(r.by_op()) == ["aten.add.Tensor"]


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(flopscope.UsageError, match="takes an nn.Module"):
        count(lambda x: x, torch.randn(2))  # type: ignore[arg-type]
    # the three library calls that take a model or a SOURCE string refuse anything else alike
    # (flopscope.sources.model_of), naming themselves
    from flopscope.estimate import peak_memory

    for call in (flopscope.count, flopscope.profile, peak_memory):
        name = call.__name__
        with pytest.raises(flopscope.UsageError,
                           match=rf"^{name}\(\) takes an nn.Module \(or a SOURCE string"):
            call(3, torch.randn(2))  # type: ignore[arg-type]
    with pytest.raises(flopscope.UsageError, match="no floating-point output"):
        with torch.no_grad():
            count(nn.Linear(2, 2), torch.randn(1, 2), backward=True)


def test_shape_only_and_meta_equal_real() -> None:
    model = SelfAttention(16)
    x = torch.randn(2, 7, 16)
    real = count(model, x, backward=True)
    fake = count(model, x, backward=True, shape_only=True)
    with torch.device("meta"):
        meta_model = SelfAttention(16)
    meta = count(meta_model, x, backward=True)
    assert fake.shape_only and meta.shape_only and not real.shape_only
    assert real.records == fake.records == meta.records


def test_shared_module_counts_calls_and_params_once() -> None:
    shared = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = shared
            self.b = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    r = count(Twice(), torch.randn(1, 4))
    assert r.params == 20  # 4*4 + 4, once
    assert r.by_module()["a"].calls == 2
    assert r.macs == 2 * 16


def test_counter_without_model_and_modules_outside_model() -> None:
    model = nn.Linear(3, 2)
    loss_fn = nn.MSELoss()
    with Counter(model) as c:
        loss_fn(model(torch.randn(5, 3)), torch.randn(5, 2))
    by = c.report.by_module()
    assert "MSELoss" in by and by["MSELoss"].calls == 1
    # mse: 3 per element + 1 for the mean
    assert by["MSELoss"].self_cost.flops == 3 * 10 + 1
    with Counter() as bare:
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert bare.report.macs == 64 and bare.report.params == 0


def test_counter_cannot_be_entered_twice() -> None:
    c = Counter()
    with c:
        with pytest.raises(flopscope.UsageError, match="already active"):
            c.__enter__()


def test_report_json_round_trip() -> None:
    r = count(TwoLayer(), torch.randn(2, 8), backward=True)
    again = flopscope.Report.from_json(r.to_json())
    assert again == r
    with pytest.raises(flopscope.UsageError, match="not a flopscope report"):
        flopscope.Report.from_json('{"schema": "other"}')


def test_deepcopy_still_works_after_count() -> None:
    model = TwoLayer()
    count(model, torch.randn(2, 8))
    copy.deepcopy(model)


class _Seen:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int]] = []
        self.resets = 0

    def on_call(self, path: str, phase: flopscope.Phase, op: str, call: object,
                cost: flopscope.Cost) -> None:
        self.calls.append((path, phase.value, op, cost.macs))

    def reset(self) -> None:
        self.resets += 1
        self.calls.clear()


def test_observers_see_every_costed_call_once() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    seen = _Seen()
    r = count(model, torch.randn(2, 4), observers=[seen])
    # one addmm of 2 x 3 x 4 = 24 MACs in module "0"; the observed costs add up to the report
    assert ("0", "forward", "aten.addmm.default", 24) in seen.calls
    assert sum(c[3] for c in seen.calls) == r.macs == 24
    assert len(seen.calls) == sum(rec.calls for rec in r.records)


def test_observers_see_a_module_rule_as_one_call() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    seen = _Seen()
    count(model, torch.randn(2, 4), rules={nn.Linear: lambda m, a, o: 100}, observers=[seen])
    assert ("0", "forward", "module_rule:Linear", 100) in seen.calls
    assert not [c for c in seen.calls if c[2] == "aten.addmm.default"]  # shadowed by the rule


def _tables_as_built_now(report: flopscope.Report, model: nn.Module) -> None:
    """The report's module types and parameter counts are those of the model as it is now
    (``params.count_params`` and ``named_modules`` walk it afresh; the Counter reuses tables made
    for the model by an earlier count while nothing they are made from has changed)."""
    from flopscope.core.params import count_params

    assert dict(report.module_params) == count_params(model)
    assert {p: t for p, (t, _) in report.modules.items()} == {
        name: type(m).__name__ for name, m in model.named_modules(remove_duplicate=False)}


def test_counts_again_see_every_change_to_the_model() -> None:
    """Module paths, types and parameter counts are worked out once per model and reused by the
    next count while the model's structure is unchanged: every kind of change made between two
    counts shows in the second one."""
    torch.manual_seed(0)
    model = TwoLayer()
    x = torch.randn(2, 8)
    # 8*16 + 16 (fc1) + 2*16 (bn) + 16*4 (fc2)
    assert count(model, x).params == 240
    changes = [
        lambda: setattr(model, "fc2", nn.Sequential(nn.Linear(16, 4))),  # a child replaced
        lambda: model.fc1.weight.requires_grad_(False),  # frozen: trainable -> frozen
        lambda: model.register_parameter("extra", nn.Parameter(torch.zeros(3))),  # a new tensor
        lambda: setattr(model.extra, "data", torch.zeros(5)),  # same tensor, another shape
        lambda: model.register_buffer("steps", torch.zeros(7)),  # a new buffer
        lambda: setattr(model, "alias", model.fc1),  # a module registered twice (shared)
        lambda: setattr(model.fc1, "bias", model.bn.bias),  # a tied parameter
        lambda: delattr(model, "alias"),  # a child removed
    ]
    for change in changes:
        change()
        _tables_as_built_now(count(model, x), model)
        _tables_as_built_now(count(model, x, shape_only=True), model)
    r = count(model, x)
    # fc1 weight 128 frozen; fc1.bias is bn.bias (16, counted once, owned by fc1, which comes
    # first); bn weight 16; fc2.0: 64 + 4; extra 5 -> 128 + 16 + 16 + 68 + 5
    assert r.params == 233
    assert r.module_params[""].frozen == 128
    assert r.module_params[""].buffers == 16 + 16 + 1 + 7  # bn mean, var, num_batches; steps


def test_remembered_tables_do_not_keep_a_model_alive() -> None:
    import gc
    import weakref

    from flopscope.core import model_index as _tracker

    model = TwoLayer()
    count(model, torch.randn(2, 8))
    count(model, torch.randn(2, 8), shape_only=True)
    gone, key = weakref.ref(model), id(model)
    assert key in _tracker._TABLES
    del model
    gc.collect()
    assert gone() is None
    assert key not in _tracker._TABLES  # its entry is dropped with it


def test_a_usual_module_calls_frame_is_a_default_frame() -> None:
    """The one-frame module call (core/usual_calls.py) makes its Frame field by field: inside a
    module's forward, the running frame equals ``Frame(module, path, phase)`` with the counts it
    has gathered so far (none before the module's first operator)."""
    import dataclasses

    from flopscope.core.frames import Frame
    from flopscope.cost import Phase

    seen: list[Frame] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(dataclasses.replace(counter._tracker.main.stack[-1]))
            return x * 2

    model = nn.Sequential(nn.Linear(3, 3), Probe())
    counter = flopscope.Counter(model, warn=False)
    with counter:
        model(torch.randn(2, 3))
    assert seen == [Frame(model[1], "1", Phase.FORWARD)]
    assert type(counter._tracker.main.stack) is list and not counter._tracker.main.stack
