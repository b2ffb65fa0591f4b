"""Models by name: the one way a SOURCE string of the command line becomes a model and its inputs.

Forms of SOURCE:

- ``torchvision:NAME`` -- ``torchvision.models.get_model(NAME, weights=None)``; the default input
  is one image at the crop size of the model's default weights' transforms.
- ``timm:NAME`` -- ``timm.create_model(NAME, pretrained=False)``; the default input is one image
  of the model's ``pretrained_cfg["input_size"]``.
- ``hf:MODEL_TYPE`` -- a transformers model built from ``AutoConfig.for_model(MODEL_TYPE)``, and
  ``hf:path/to/config.json``; ``config`` overrides are applied to the config. The default input is
  token ids (batch 1, ``seq_len`` default 128), or pixel values for vision models.
- ``path/to/file.py:factory`` and ``package.module:factory`` -- ``factory()`` returns a model, or a
  ``(model, inputs)`` pair where ``inputs`` is a tensor, a tuple or list of positional arguments,
  a dict of keyword arguments, or a :class:`flopscope.Inputs`.

With ``shape_only=True`` models are built on the ``meta`` device where that works, so neither the
parameters nor the activations take memory: a 70B-parameter config counts on a laptop.

Every problem with a source raises :class:`SourceError` (a :class:`~flopscope.UsageError`) whose
message is one line that says what to change.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flopscope.run import Inputs
from flopscope.errors import SourceError

__all__ = [
    "PREFIXES",
    "InputSpec",
    "LoadedModel",
    "SourceError",
    "load_model",
    "make_inputs",
    "parse_config",
    "parse_input",
]

PREFIXES = ("torchvision:", "timm:", "hf:")

_FORMS = (
    "torchvision:NAME, timm:NAME, hf:MODEL_TYPE, hf:path/to/config.json, path/to/file.py:factory "
    "or package.module:factory"
)

_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


@dataclass(frozen=True)
class InputSpec:
    """One input tensor described by shape and dtype (``1x3x224x224:float16``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return "x".join(map(str, self.shape)) + ("" if dtype == "float32" else f":{dtype}")


@dataclass
class LoadedModel:
    """A model ready to count.

    Attributes:
        model: the model.
        args: positional arguments of one forward call.
        kwargs: keyword arguments of one forward call.
        name: a short human name (``resnet50``, ``LlamaForCausalLM``).
        source: the SOURCE string it came from.
        meta: JSON-ready facts about the source (inputs, published reference numbers).
    """

    model: nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> Inputs:
        """The forward arguments as one :class:`flopscope.Inputs`, ready for ``count()``."""
        return Inputs(*self.args, **self.kwargs)


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    if not close:
        lowered = name.lower()
        close = sorted(c for c in choices if lowered in c.lower())[:3]
    return f" (did you mean {', '.join(close)}?)" if close else ""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, shortened to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# -- inputs ----------------------------------------------------------------------------------------
def parse_input(text: str) -> InputSpec:
    """Parse ``1x3x224x224`` or ``1x3x224x224:float16`` into an :class:`InputSpec`.

    Args:
        text: dimensions joined by ``x``, optionally ``:dtype``.

    Returns:
        The spec.

    Raises:
        SourceError: the text is not of that form.
    """
    shape_text, _, dtype_text = text.strip().partition(":")
    if not re.fullmatch(r"\d+(x\d+)*", shape_text.lower()):
        raise SourceError(
            f"malformed --input {text!r}: write the shape as dimensions joined by 'x', optionally "
            "followed by ':dtype', e.g. --input 1x3x224x224 or --input 1x128:int64"
        )
    dtype = torch.float32
    if dtype_text:
        if dtype_text.lower() not in _DTYPES:
            raise SourceError(
                f"unknown dtype {dtype_text!r} in --input {text!r}: use one of "
                f"{', '.join(sorted(set(_DTYPES)))}{_did_you_mean(dtype_text.lower(), list(_DTYPES))}"
            )
        dtype = _DTYPES[dtype_text.lower()]
    shape = tuple(int(d) for d in shape_text.lower().split("x"))
    if any(d == 0 for d in shape):
        raise SourceError(f"malformed --input {text!r}: every dimension must be at least 1")
    return InputSpec(shape, dtype)


def make_inputs(specs: Sequence[InputSpec], *, batch: int | None = None) -> tuple[torch.Tensor, ...]:
    """Tensors for ``specs``: random floats, zeros for integer dtypes (valid indices).

    Args:
        specs: shapes and dtypes.
        batch: when given, replaces the first dimension of every input.

    Returns:
        One tensor per spec.
    """
    out = []
    for spec in specs:
        shape = spec.shape
        if batch is not None and shape:
            shape = (batch, *shape[1:])
        if spec.dtype.is_floating_point:
            out.append(torch.randn(shape, dtype=spec.dtype))
        else:
            out.append(torch.zeros(shape, dtype=spec.dtype))
    return tuple(out)


def parse_config(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` overrides; values are read as JSON (numbers, true/false, lists) when
    they parse, else kept as strings.

    Args:
        items: ``key=value`` strings.

    Returns:
        key -> value.

    Raises:
        SourceError: an item has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SourceError(
                f"malformed --config {item!r}: write key=value, e.g. --config num_hidden_layers=2"
            )
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            low = value.strip().lower()
            out[key] = {"true": True, "false": False, "none": None}.get(low, value)
    return out


# -- the dispatcher --------------------------------------------------------------------------------
def load_model(
    source: str,
    *,
    inputs: Sequence[InputSpec] | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    config: Mapping[str, Any] | None = None,
    shape_only: bool = False,
) -> LoadedModel:
    """Turn a SOURCE string into a model and the inputs of one forward call.

    This is what ``flopscope count`` (and the measurement commands) use; see the module docstring
    for the forms of ``source``.

    Args:
        source: the SOURCE string.
        inputs: explicit input shapes (``--input``); they replace the source's default inputs.
        batch: the batch size (first dimension of every input).
        seq_len: sequence length of the token ids of ``hf:`` models (default 128).
        config: overrides of an ``hf:`` config (``--config key=value``).
        shape_only: the count will not run arithmetic, so build the model on the ``meta`` device
            where possible (no memory for weights).

    Returns:
        The :class:`LoadedModel`.

    Raises:
        SourceError: the source, an input or an override is wrong; the message says what to change.
    """
    if batch is not None and batch < 1:
        raise SourceError(f"--batch must be at least 1, not {batch}")
    if seq_len is not None and seq_len < 1:
        raise SourceError(f"--seq-len must be at least 1, not {seq_len}")
    if config and not source.startswith("hf:"):
        raise SourceError("--config applies to hf: sources only; remove it or use an hf: source")
    if seq_len is not None and not source.startswith("hf:") and not inputs:
        raise SourceError(
            "--seq-len applies to hf: sources only; give other models their shapes with --input"
        )
    if source.startswith("torchvision:"):
        loaded = _torchvision(source.removeprefix("torchvision:"), shape_only)
    elif source.startswith("timm:"):
        loaded = _timm(source.removeprefix("timm:"), shape_only)
    elif source.startswith("hf:"):
        loaded = _hf(source.removeprefix("hf:"), dict(config or {}), seq_len or 128, batch,
                     shape_only)
    elif ":" in source:
        loaded = _factory(source)
    else:
        raise SourceError(f"unknown source {source!r}: use {_FORMS}")
    loaded.source = source
    if inputs:
        loaded.args, loaded.kwargs = make_inputs(inputs, batch=batch), {}
        loaded.meta["inputs"] = [str(s) for s in inputs]
    elif batch is not None and not source.startswith("hf:"):
        loaded.args = tuple(_rebatch(a, batch) for a in loaded.args)
        loaded.kwargs = {k: _rebatch(v, batch) for k, v in loaded.kwargs.items()}
    if not loaded.args and not loaded.kwargs:
        raise SourceError(
            f"{source!r} gives no example inputs: pass their shapes with --input, e.g. "
            "--input 1x3x224x224, or return (model, inputs) from the factory"
        )
    loaded.meta.setdefault("inputs", [_describe(a) for a in loaded.args]
                           + [f"{k}={_describe(v)}" for k, v in loaded.kwargs.items()])
    loaded.meta["source"] = source
    return loaded


def _rebatch(value: Any, batch: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] != batch:
        reps = (batch + value.shape[0] - 1) // value.shape[0]
        return value.repeat(reps, *([1] * (value.dim() - 1)))[:batch].contiguous()
    return value


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(InputSpec(tuple(value.shape), value.dtype))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__name__


@contextmanager
def _maybe_meta(shape_only: bool) -> Iterator[None]:
    if shape_only:
        with torch.device("meta"):
            yield
    else:
        yield


def _build(fn: Callable[[], nn.Module], shape_only: bool, what: str) -> nn.Module:
    """Build on ``meta`` when counting shapes only; fall back to a real build if that fails."""
    if shape_only:
        try:
            with _maybe_meta(True):
                return fn()
        except Exception:  # noqa: BLE001  (some constructors need real tensors; build them for real)
            pass
    try:
        return fn()
    except Exception as e:
        raise SourceError(f"building {what} failed: {type(e).__name__}: {one_line(str(e), 200)}") from e


# -- torchvision -----------------------------------------------------------------------------------
def _torchvision(name: str, shape_only: bool) -> LoadedModel:
    try:
        import torchvision.models as tvm  # type: ignore[import-untyped]
    except ImportError:
        raise SourceError(
            "torchvision: sources need torchvision: pip install 'flopscope[vision]'"
        ) from None
    names = tvm.list_models()
    if name not in names:
        raise SourceError(
            f"unknown torchvision model {name!r}{_did_you_mean(name, names)} "
            "(torchvision.models.list_models() lists them all)"
        )
    model = _build(lambda: tvm.get_model(name, weights=None), shape_only, f"torchvision:{name}")
    model.eval()
    meta: dict[str, Any] = {}
    size: list[int] = [224, 224]
    kind = "image"
    try:
        weights = tvm.get_model_weights(name).DEFAULT
        transforms = weights.transforms()
        kind = type(transforms).__name__
        crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
        if crop:
            size = list(crop) if len(crop) == 2 else [crop[0], crop[0]]
        if "_ops" in weights.meta:
            meta["reference_gmacs"] = float(weights.meta["_ops"])
    except Exception:  # noqa: BLE001  (no weights registered: keep the ImageNet default)
        pass
    built_for = getattr(model, "image_size", None)  # e.g. ViT built without weights: 224
    if isinstance(built_for, int) and [built_for, built_for] != size:
        size = [built_for, built_for]
        meta.pop("reference_gmacs", None)  # published for the weights' input size
    h, w = size
    if kind == "VideoClassification":
        args: tuple[torch.Tensor, ...] = (torch.randn(1, 3, 16, h, w),)
    elif kind == "OpticalFlow":
        args = (torch.randn(1, 3, 224, 224), torch.randn(1, 3, 224, 224))
    else:
        args = (torch.randn(1, 3, h, w),)
    return LoadedModel(model, args, name=name, meta=meta)


# -- timm ------------------------------------------------------------------------------------------
def _timm(name: str, shape_only: bool) -> LoadedModel:
    try:
        import timm
    except ImportError:
        raise SourceError("timm: sources need timm: pip install 'flopscope[vision]'") from None
    if not timm.is_model(name):
        names = timm.list_models()
        raise SourceError(
            f"unknown timm model {name!r}{_did_you_mean(name, names)} "
            "(timm.list_models() lists them all)"
        )
    model = _build(lambda: timm.create_model(name, pretrained=False), shape_only, f"timm:{name}")
    model.eval()
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = tuple(int(d) for d in cfg.get("input_size", (3, 224, 224)))
    return LoadedModel(model, (torch.randn(1, *size),), name=name)


# -- Hugging Face transformers ---------------------------------------------------------------------
def _hf(spec: str, overrides: dict[str, Any], seq_len: int, batch: int | None,
        shape_only: bool) -> LoadedModel:
    try:
        import transformers
        from transformers.models.auto.configuration_auto import (  # type: ignore[attr-defined]
            CONFIG_MAPPING_NAMES,
        )
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        raise SourceError("hf: sources need transformers: pip install 'flopscope[hf]'") from None
    if not spec:
        raise SourceError("hf: needs a model type or a config file, e.g. hf:llama or hf:config.json")
    if spec.endswith(".json") or "/" in spec or Path(spec).is_file():
        path = Path(spec)
        if not path.is_file():
            raise SourceError(f"config file {spec!r} does not exist; give the path to a config.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SourceError(f"cannot read config file {spec!r}: {one_line(str(e), 200)}") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise SourceError(
                f"{spec!r} is not a transformers config: it has no 'model_type' key"
            )
        model_type = str(data.pop("model_type"))
        if model_type not in CONFIG_MAPPING_NAMES:
            raise SourceError(
                f"unknown model_type {model_type!r} in {spec!r}"
                f"{_did_you_mean(model_type, list(CONFIG_MAPPING_NAMES))}"
            )
        data.pop("transformers_version", None)
        base = {**data, **overrides}
    else:
        model_type = spec
        if model_type not in CONFIG_MAPPING_NAMES:
            raise SourceError(
                f"unknown transformers model type {model_type!r}"
                f"{_did_you_mean(model_type, list(CONFIG_MAPPING_NAMES))}"
            )
        base = dict(overrides)
    defaults = transformers.AutoConfig.for_model(model_type)
    for key in overrides:
        if not hasattr(defaults, key):
            known = [k for k in defaults.to_dict() if not k.startswith("_")]
            raise SourceError(
                f"--config {key}: {type(defaults).__name__} has no such setting"
                f"{_did_you_mean(key, known)}"
            )
    try:
        config = transformers.AutoConfig.for_model(model_type, **base)
    except Exception as e:
        raise SourceError(
            f"invalid config for {model_type!r}: {type(e).__name__}: {one_line(str(e), 200)}"
        ) from None
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModel

    def build() -> nn.Module:
        model: nn.Module = auto.from_config(config)  # type: ignore[no-untyped-call]
        return model

    model = _build(build, shape_only, f"hf:{spec}")
    model.eval()
    n = batch or 1
    main_input = getattr(model, "main_input_name", "input_ids")
    kwargs: dict[str, Any] = {}
    if main_input == "input_ids":
        vocab = int(getattr(config, "vocab_size", 0) or 2)
        ids = torch.randint(0, max(vocab, 1), (n, seq_len))
        kwargs["input_ids"] = ids
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
    elif main_input == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else int(size[0])
        kwargs["pixel_values"] = torch.randn(n, int(getattr(config, "num_channels", 3)), size, size)
    else:
        kwargs = {}
    if "use_cache" in _forward_params(model):
        kwargs["use_cache"] = False
    if main_input not in kwargs:
        kwargs = {}
    meta = {"model_type": model_type, "config": {k: v for k, v in overrides.items()
                                                  if isinstance(v, (int, float, str, bool))}}
    return LoadedModel(model, (), kwargs, name=type(model).__name__, meta=meta)


def _forward_params(model: nn.Module) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


# -- factories -------------------------------------------------------------------------------------
def _factory(source: str) -> LoadedModel:
    target, _, attr = source.rpartition(":")
    if not target or not attr:
        raise SourceError(f"malformed source {source!r}: use {_FORMS}")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _import_file(target)
    else:
        module = _import_module(target, source)
    fn = getattr(module, attr, None)
    if fn is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        hint = _did_you_mean(attr, names) or (
            f" (it has {', '.join(sorted(names)[:8])})" if names else " (it defines no functions)"
        )
        raise SourceError(f"{target!r} has no factory {attr!r}{hint}")
    if isinstance(fn, nn.Module):
        result: Any = fn
    elif not callable(fn):
        raise SourceError(
            f"{target}:{attr} is a {type(fn).__name__}, not a factory: give a function that "
            "returns a model, or (model, inputs)"
        )
    else:
        try:
            result = fn()
        except Exception as e:
            raise SourceError(
                f"factory {target}:{attr}() raised {type(e).__name__}: {one_line(str(e), 200)}"
            ) from e
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    model = result
    if isinstance(result, tuple) and len(result) == 2:
        model, example = result
        if isinstance(example, Inputs):
            args, kwargs = tuple(example.args), dict(example.kwargs)
        elif isinstance(example, torch.Tensor):
            args = (example,)
        elif isinstance(example, (tuple, list)):
            args = tuple(example)
        elif isinstance(example, dict):
            kwargs = dict(example)
        else:
            raise SourceError(
                f"factory {target}:{attr}() returned inputs of type {type(example).__name__}: "
                "return a tensor, a tuple or list of arguments, a dict of keywords or "
                "flopscope.Inputs"
            )
    if not isinstance(model, nn.Module):
        raise SourceError(
            f"factory {target}:{attr}() returned {type(model).__name__}, not a torch.nn.Module: "
            "return a model, or (model, inputs)"
        )
    return LoadedModel(model, args, kwargs, name=type(model).__name__)


def _import_file(target: str) -> Any:
    path = Path(target)
    if not path.is_file():
        raise SourceError(f"file {target!r} does not exist; give path/to/file.py:factory")
    name = f"flopscope_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SourceError(f"cannot import {target!r}: it is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise SourceError(
            f"importing {target!r} raised {type(e).__name__}: {one_line(str(e), 200)}"
        ) from e
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def _import_module(target: str, source: str) -> Any:
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # like `python -m`: modules in the working directory import
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):
            if "." not in target:
                prefix = target + ":"
                hint = _did_you_mean(prefix, list(PREFIXES))
                raise SourceError(
                    f"unknown source prefix {prefix!r}{hint}: use {_FORMS}"
                ) from None
            raise SourceError(
                f"cannot import module {target!r} for {source!r}: no module named {e.name!r}; "
                "check the name, or give path/to/file.py:factory"
            ) from None
        raise SourceError(f"importing {target!r} raised ModuleNotFoundError: {e}") from e
    except Exception as e:
        raise SourceError(
            f"importing {target!r} raised {type(e).__name__}: {one_line(str(e), 200)}"
        ) from e
