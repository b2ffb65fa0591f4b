"""``hf:MODEL_TYPE``, ``hf:path/to/config.json`` (or a folder holding one) and ``hf:ORG/NAME``
(a Hugging Face Hub model's config, from the local cache or downloaded: the config only, never
weights): a transformers model built from a config (``AutoModelForCausalLM`` for causal language
models, else ``AutoModel``), with token ids (or pixel values for vision models) as its input."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flopscope._text import did_you_mean, one_line
from flopscope.errors import SourceError
from flopscope.report.source import SourceInfo
from flopscope.sources._inputs import check_fits, example_tensor
from flopscope.sources._model import LoadedModel, build

__all__ = ["DEFAULT_SEQ_LEN", "check_hf_model_type", "check_hf_spec", "hf_form", "load_hf"]

DEFAULT_SEQ_LEN = 128


def load_hf(
    spec: str,
    *,
    overrides: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    shape_only: bool = False,
) -> LoadedModel:
    """A transformers model from a model type or a saved config, and its default input.

    Args:
        spec: a model type (``llama``) or the path of a ``config.json``.
        overrides: config settings to change; unknown keys are rejected with close matches.
        seq_len: length of the token ids (default :data:`DEFAULT_SEQ_LEN`).
        batch: batch size of the input (default 1).
        shape_only: build on the ``meta`` device where possible; the inputs are ``meta``
            tensors.

    Returns:
        The model (eval mode) and its keyword inputs; ``meta`` records the model type and the
        overrides.

    Raises:
        SourceError: transformers is missing, an unknown model type or setting, an unreadable
            config file, or a config the model rejects.
    """
    try:
        import transformers
        from transformers.models.auto.configuration_auto import (  # type: ignore[attr-defined]
            CONFIG_MAPPING_NAMES,
        )
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        raise SourceError("hf: sources need transformers: pip install 'flopscope[hf]'") from None
    overrides = dict(overrides or {})
    form, where = check_hf_spec(spec)
    if form != "type":
        model_type, saved = (_read_config_file(where, CONFIG_MAPPING_NAMES) if form == "file"
                             else _hub_config(where, CONFIG_MAPPING_NAMES))
        base = {**saved, **overrides}
    else:
        model_type = spec
        base = dict(overrides)
    defaults = transformers.AutoConfig.for_model(model_type)
    for key in overrides:
        if not hasattr(defaults, key):
            known = [k for k in defaults.to_dict() if not k.startswith("_")]
            raise SourceError(
                f"config override {key!r}: {type(defaults).__name__} has no such setting"
                f"{did_you_mean(key, known)}"
            )
    try:
        config = transformers.AutoConfig.for_model(model_type, **base)
    except Exception as e:
        raise SourceError(
            f"invalid config for {model_type!r}: {type(e).__name__}: {one_line(e, 200)}"
        ) from None
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModel

    def construct() -> nn.Module:
        model: nn.Module = auto.from_config(config)  # type: ignore[no-untyped-call]
        return model

    # token ids are the input of most models: refused before the model is built if they cannot fit
    check_fits((batch or 1, seq_len or DEFAULT_SEQ_LEN), torch.int64,
               what=f"token ids at batch {batch or 1} and seq_len {seq_len or DEFAULT_SEQ_LEN}")
    model = build(construct, shape_only, f"hf:{spec}", sized=True)
    model.eval()
    kwargs = _default_inputs(model, config, seq_len or DEFAULT_SEQ_LEN, batch or 1, shape_only)
    meta = SourceInfo(
        model_type=model_type,
        config={k: v for k, v in overrides.items() if isinstance(v, (int, float, str, bool))},
    )
    return LoadedModel(model, (), kwargs, name=type(model).__name__, meta=meta)


def check_hf_spec(spec: str) -> tuple[str, str]:
    """What :func:`load_hf` refuses before it reads a config or builds anything: an empty spec,
    a config file that does not exist, a model type transformers does not know (a Hub name is
    checked when its config is read).

    Args:
        spec: what follows ``hf:``.

    Returns:
        Its form and its config's place (:func:`hf_form`).

    Raises:
        SourceError: one of those.
    """
    if not spec:
        raise SourceError("hf: needs a model type or a config file, e.g. hf:llama or "
                          "hf:config.json")
    form, where = hf_form(spec)
    if form == "file" and not Path(where).is_file():
        raise SourceError(f"config file {where!r} does not exist; give the path to a config.json")
    if form == "type":
        check_hf_model_type(spec)
    return form, where


def hf_form(spec: str) -> tuple[str, str]:
    """Which form an ``hf:`` spec is, and where its config is: ``("file", path)`` for a path
    ending in ``.json``, an existing file, or a folder (its ``config.json``); ``("hub", name)``
    for another spec with a ``/`` (``meta-llama/Llama-3.1-8B``); ``("type", spec)`` otherwise.

    Args:
        spec: what follows ``hf:``.

    Returns:
        The form and the config's place.
    """
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        return "file", spec
    if path.is_dir():
        return "file", str(path / "config.json")
    if "/" in spec:
        return "hub", spec
    return "type", spec


def _hub_config(name: str, known_types: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A Hub model's config (the local cache first, then the network), as a config file's
    settings."""
    import transformers

    try:
        try:
            config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
        except OSError:  # not cached here: downloaded (the config only)
            config = transformers.AutoConfig.from_pretrained(name)
    except Exception as e:
        raise SourceError(
            f"cannot read the config of {name!r} from the Hugging Face Hub or its local cache "
            f"({type(e).__name__}: {one_line(e, 160)}): give the path to a config.json (or its "
            "folder), or a model type such as hf:llama"
        ) from None
    data = config.to_dict()
    model_type = str(data.pop("model_type", ""))
    if model_type not in known_types:
        raise SourceError(f"{name!r} has model_type {model_type!r}, which this transformers "
                          "does not know")
    for key in ("transformers_version", "_name_or_path"):
        data.pop(key, None)
    return model_type, data


def check_hf_model_type(model_type: str) -> None:
    """Check that transformers knows the model type ``model_type``, without building a model.

    Args:
        model_type: a transformers model type (``llama``).

    Raises:
        SourceError: transformers is missing, or the type is unknown (close names suggested).
    """
    try:
        from transformers.models.auto.configuration_auto import (  # type: ignore[attr-defined]
            CONFIG_MAPPING_NAMES,
        )
    except ImportError:
        raise SourceError("hf: sources need transformers: pip install 'flopscope[hf]'") from None
    if model_type not in CONFIG_MAPPING_NAMES:
        raise SourceError(
            f"unknown transformers model type {model_type!r}"
            f"{did_you_mean(model_type, list(CONFIG_MAPPING_NAMES))}"
        )


def _read_config_file(spec: str, known_types: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    try:
        with open(spec, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"cannot read config file {spec!r}: {one_line(e, 200)}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SourceError(f"{spec!r} is not a transformers config: it has no 'model_type' key")
    model_type = str(data.pop("model_type"))
    if model_type not in known_types:
        raise SourceError(
            f"unknown model_type {model_type!r} in {spec!r}"
            f"{did_you_mean(model_type, list(known_types))}"
        )
    data.pop("transformers_version", None)
    return model_type, data


def _default_inputs(model: nn.Module, config: Any, seq_len: int, batch: int,
                    shape_only: bool) -> dict[str, Any]:
    """Token ids (and decoder ids for encoder-decoders), or pixel values; ``use_cache=False``;
    on ``meta`` when ``shape_only``."""
    main_input = getattr(model, "main_input_name", "input_ids")
    kwargs: dict[str, Any] = {}
    if main_input == "input_ids":
        if shape_only:
            ids = example_tensor((batch, seq_len), torch.int64, shape_only=True)
        else:
            vocab = int(getattr(config, "vocab_size", 0) or 2)
            ids = torch.randint(0, max(vocab, 1), (batch, seq_len))
        kwargs["input_ids"] = ids
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
    elif main_input == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else int(size[0])
        channels = int(getattr(config, "num_channels", 3))
        kwargs["pixel_values"] = example_tensor((batch, channels, size, size),
                                                shape_only=shape_only)
    if main_input not in kwargs:
        return {}
    if "use_cache" in _forward_params(model):
        kwargs["use_cache"] = False
    return kwargs


def _forward_params(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()
