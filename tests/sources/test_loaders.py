"""load_model: one loader per SOURCE form, dtype casting, typed metadata, flag-free messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import flopscope
from flopscope.errors import SourceError
from flopscope.report import SourceInfo
from flopscope.sources import load_model, parse_input

FIXTURES = Path(__file__).resolve().parents[1] / "cli" / "fixtures"
TINY = str(FIXTURES / "tiny_models.py")


@pytest.fixture
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


# -- factories -------------------------------------------------------------------------------------
def test_file_factory_with_inputs() -> None:
    loaded = load_model(f"{TINY}:tiny")
    assert loaded.name == "Tiny" and loaded.source == f"{TINY}:tiny"
    assert isinstance(loaded.meta, SourceInfo)
    assert loaded.meta.inputs == ("1x3x8x8",) and loaded.meta.source == f"{TINY}:tiny"
    assert loaded.meta["inputs"] == ["1x3x8x8"]  # still readable as the JSON mapping


@pytest.mark.usefixtures("_fixtures_importable")
def test_module_factory_keywords_and_batch() -> None:
    loaded = load_model("tiny_models:kwargs_inputs", batch=3)
    assert loaded.args == () and loaded.kwargs["x"].shape == (3, 3, 8, 8)
    assert loaded.meta.inputs == ("x=3x3x8x8",)


def test_explicit_inputs_replace_the_factory_inputs() -> None:
    loaded = load_model(f"{TINY}:model_only", inputs=[parse_input("2x3x8x8")])
    assert loaded.args[0].shape == (2, 3, 8, 8) and loaded.meta.inputs == ("2x3x8x8",)


def test_model_without_inputs() -> None:
    with pytest.raises(SourceError, match=r"gives no example inputs") as info:
        load_model(f"{TINY}:model_only")
    assert "--" not in str(info.value)
    loaded = load_model(f"{TINY}:model_only", require_inputs=False)
    assert loaded.args == () and loaded.kwargs == {} and loaded.meta.inputs == ()


@pytest.mark.parametrize(("source", "expected"), [
    (f"{TINY}:tinny", r"has no factory 'tinny' \(did you mean tiny"),
    (f"{TINY}:raises", r"raised ValueError: the factory is broken"),
    (f"{TINY}:not_a_model", r"returned int, not a torch.nn.Module"),
    ("nope/missing.py:f", r"does not exist"),
    ("no_such_pkg.models:f", r"cannot import module 'no_such_pkg.models'"),
    ("tv:resnet18", r"unknown source prefix 'tv:'"),
    ("resnet18", r"unknown source 'resnet18'"),
])
def test_factory_errors(source: str, expected: str) -> None:
    with pytest.raises(SourceError, match=expected):
        load_model(source)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"batch": 0}, r"^batch must be at least 1, not 0$"),
    ({"seq_len": 0}, r"^seq_len must be at least 1, not 0$"),
    ({"seq_len": 8}, r"^seq_len applies to hf: sources only"),
    ({"config": {"a": 1}}, r"^config overrides apply to hf: sources only"),
    ({"dtype": "int8"}, r"must be a floating-point type"),
])
def test_parameter_errors_name_parameters_not_flags(kwargs: dict[str, object],
                                                     expected: str) -> None:
    with pytest.raises(SourceError, match=expected) as info:
        load_model(f"{TINY}:tiny", **kwargs)  # type: ignore[arg-type]
    assert "--" not in str(info.value)


# -- dtype -----------------------------------------------------------------------------------------
def test_dtype_casts_floating_parameters_buffers_and_inputs() -> None:
    loaded = load_model(f"{TINY}:tiny", dtype="float64")
    assert all(p.dtype is torch.float64 for p in loaded.model.parameters())
    buffers = dict(loaded.model.named_buffers())
    assert buffers["features.1.running_mean"].dtype is torch.float64
    assert buffers["features.1.num_batches_tracked"].dtype is torch.int64  # integers stay
    assert loaded.args[0].dtype is torch.float64
    assert loaded.meta.inputs == ("1x3x8x8:float64",)
    with torch.no_grad():
        assert loaded.model(*loaded.args).dtype is torch.float64


def test_dtype_keeps_the_counts() -> None:
    base = load_model(f"{TINY}:tiny")
    wide = load_model(f"{TINY}:tiny", dtype=torch.float64)
    a = flopscope.count(base.model, base.inputs, warn=False)
    b = flopscope.count(wide.model, wide.inputs, warn=False)
    assert (a.macs, a.flops, a.params) == (b.macs, b.flops, b.params)


# -- torchvision, timm, hf -------------------------------------------------------------------------
def test_torchvision_shape_only() -> None:
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18", shape_only=True)
    assert next(loaded.model.parameters()).device.type == "meta"
    assert loaded.meta.inputs == ("1x3x224x224",)
    assert loaded.meta.reference_gmacs == pytest.approx(1.814, abs=1e-3)
    assert not loaded.model.training


def test_torchvision_unknown_name() -> None:
    pytest.importorskip("torchvision")
    with pytest.raises(SourceError, match=r"unknown torchvision model 'resnet5O'.*resnet50"):
        load_model("torchvision:resnet5O")


def test_timm() -> None:
    pytest.importorskip("timm")
    loaded = load_model("timm:resnet18", shape_only=True, batch=2)
    assert loaded.meta.inputs == ("2x3x224x224",)
    with pytest.raises(SourceError, match=r"unknown timm model.*did you mean"):
        load_model("timm:resnet5O")


LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 100}


def test_hf_model_type_and_config_file(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    overrides = LLAMA
    loaded = load_model("hf:llama", config=overrides, seq_len=8, shape_only=True)
    assert loaded.name == "LlamaForCausalLM"
    assert loaded.meta.model_type == "llama" and loaded.meta.config["hidden_size"] == 32
    assert loaded.meta.inputs == ("input_ids=1x8:int64", "use_cache=False")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", **overrides}))
    again = load_model(f"hf:{path}", seq_len=8, batch=2, shape_only=True, dtype="float64")
    assert again.kwargs["input_ids"].shape == (2, 8)
    assert again.kwargs["input_ids"].dtype is torch.int64  # token ids are not cast


def test_hf_errors(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(SourceError, match=r"unknown transformers model type 'lamma'.*llama"):
        load_model("hf:lamma")
    with pytest.raises(SourceError, match=r"config override 'hiden_size'.*hidden_size") as info:
        load_model("hf:llama", config={"hiden_size": 8}, shape_only=True)
    assert "--" not in str(info.value)
    bad = tmp_path / "c.json"
    bad.write_text("{}")
    with pytest.raises(SourceError, match=r"has no 'model_type' key"):
        load_model(f"hf:{bad}")


# -- shape-only inputs are meta from the start, in every loader -------------------------------------
def _tensors(loaded: flopscope.sources.LoadedModel) -> list[torch.Tensor]:
    return [t for t in (*loaded.args, *loaded.kwargs.values()) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize(("source", "kwargs", "shapes"), [
    ("torchvision:resnet18", {"batch": 100_000}, [(100_000, 3, 224, 224)]),  # 60 GB if real
    ("torchvision:resnet18", {"inputs": [parse_input("100000x3x224x224")]},
     [(100_000, 3, 224, 224)]),
    ("timm:resnet18", {"batch": 100_000}, [(100_000, 3, 224, 224)]),
    ("hf:llama", {"config": LLAMA, "batch": 10**10, "seq_len": 8}, [(10**10, 8)]),  # 640 GB
    (f"{TINY}:tiny", {"batch": 10**9}, [(10**9, 3, 8, 8)]),  # a factory's real input, moved
])
def test_shape_only_inputs_are_meta(source: str, kwargs: dict[str, object],
                                    shapes: list[tuple[int, ...]]) -> None:
    library = source.split(":")[0]
    if library in ("torchvision", "timm"):
        pytest.importorskip(library)
    elif library == "hf":
        pytest.importorskip("transformers")
    loaded = load_model(source, shape_only=True, **kwargs)  # type: ignore[arg-type]
    tensors = _tensors(loaded)
    assert [tuple(t.shape) for t in tensors] == shapes
    assert all(t.is_meta for t in tensors)


def test_real_inputs_stay_real() -> None:
    loaded = load_model(f"{TINY}:tiny", batch=2)
    (x,) = loaded.args
    assert x.device.type == "cpu" and x.shape == (2, 3, 8, 8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch": 2**63}, r"batch 9,223,372,036,854,775,808 is beyond the largest tensor dimension, "
                       r"9,223,372,036,854,775,807 \(2\^63 - 1\)"),
    # 2 * 10^16 x 3 x 8 x 8 float32 = 1.536e19 bytes = 13.32 EiB (/ 2^60) > 2^63 - 1 bytes
    ({"batch": 2 * 10**16}, r"batch 20,000,000,000,000,000: 20000000000000000x3x8x8 float32 "
                            r"would take 13\.32 EiB, beyond the 8\.00 EiB \(2\^63 - 1 bytes\)"),
    ({"inputs": [parse_input("1x3x8x8")], "batch": 10**17},
     r"input 1x3x8x8 at batch 100,000,000,000,000,000: 100000000000000000x3x8x8 float32 would take"),
])
def test_sizes_that_do_not_fit_name_the_limit(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        load_model(f"{TINY}:tiny", shape_only=True, **kwargs)  # type: ignore[arg-type]


def test_weights_larger_than_this_machine_are_refused_before_they_are_built() -> None:
    """``hf:llama``'s defaults are 6.7 B parameters: 25 GiB of float32 weights, more than a
    machine of 24 GiB has: refused after a build on ``meta``, before any weight is made, naming
    the parameters and --shape-only; shape-only loads it."""
    pytest.importorskip("transformers")
    import flopscope.sources._inputs as inputs

    # 6,738,415,616 parameters x 4 bytes (and the rotary buffer's few bytes) > 24 GiB
    with pytest.MonkeyPatch.context() as m:
        m.setattr(inputs, "_physical_memory", lambda: 24 * 2**30)
        with pytest.raises(SourceError, match=r"hf:llama \(its weights: 6,738,415,616 "
                                              r"parameters\) needs 25\.\d+ GiB.*shape-only"):
            load_model("hf:llama")
    loaded = load_model("hf:llama", shape_only=True)
    assert sum(p.numel() for p in loaded.model.parameters()) == 6_738_415_616


def test_a_hub_name_reads_the_config_from_the_local_cache(tmp_path: Path) -> None:
    """``hf:ORG/NAME`` builds the model from the Hub's config as transformers caches it (here a
    cache laid out by hand, offline); a name in no cache is a one-line error saying what to
    give instead. A folder holding a config.json is a config too."""
    import os
    import subprocess
    import sys

    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "abc123"
    config.save_pretrained(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    def cli(source: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flopscope", "count", source, "--shape-only",
                               "--format", "json"], capture_output=True, text=True, env=env,
                              timeout=300)

    hub, folder = cli("hf:acme/tiny-llama"), cli(f"hf:{snapshot}")
    assert hub.returncode == 0 and folder.returncode == 0, (hub.stderr, folder.stderr)
    # per layer q, o 64 x 64, k, v 32 x 64 (2 KV heads of 16), gate, up, down 64 x 128, two
    # norms of 64: 36,992; 2 layers, embedding and head 128 x 64, the final norm of 64: 90,432
    totals = json.loads(hub.stdout)["totals"]
    assert totals["params"] == 2 * 36_992 + 2 * 8_192 + 64
    assert totals == json.loads(folder.stdout)["totals"]  # both forms build the same model
    missing = cli("hf:acme/missing")
    assert missing.returncode == 2 and "cannot read the config of 'acme/missing'" in missing.stderr
    assert missing.stderr.count("\n") == 1
