"""Models by name: the one way a SOURCE string becomes a model and the inputs of one forward call,
for every subcommand of the command line and for library users.

Forms of SOURCE:

- ``torchvision:NAME`` -- ``torchvision.models.get_model(NAME, weights=None)``; the default input
  is one image at the crop size of the model's default weights' transforms.
- ``timm:NAME`` -- ``timm.create_model(NAME, pretrained=False)``; the default input is one image
  of the model's ``pretrained_cfg["input_size"]``.
- ``hf:MODEL_TYPE`` -- a transformers model built from ``AutoConfig.for_model(MODEL_TYPE)``;
  ``hf:path/to/config.json`` (or its folder); ``hf:ORG/NAME``, a Hub model's config (the local
  cache first, else downloaded; never weights); ``config`` overrides are applied to the config.
  The default input is token ids (batch 1, ``seq_len`` default 128), or pixel values for vision
  models.
- ``path/to/file.py:factory`` and ``package.module:factory`` -- ``factory()`` returns a model, or a
  ``(model, inputs)`` pair where ``inputs`` is a tensor, a tuple or list of positional arguments,
  a dict of keyword arguments, or a :class:`flopscope.Inputs`.

With ``shape_only=True`` library models are built on the ``meta`` device where that works, so
neither the parameters nor the activations take memory: a 70B-parameter config counts on a laptop.

Every problem with a source raises :class:`~flopscope.errors.SourceError` (a
:class:`~flopscope.UsageError`) whose message is one line that says what to change; messages name
``load_model``'s parameters, never command-line flags (the command line adds those).

Rooms: ``_inputs`` (the input grammar, dtypes), ``_config`` (``key=value`` overrides), ``_model``
(:class:`LoadedModel`, building on meta), one module per loader family (``_torchvision``,
``_timm``, ``_hf``, ``_factory`` with file and module import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from flopscope.errors import SourceError, UsageError
from flopscope.execution.copies import meta_input
from flopscope.execution.inputs import model_arguments
from flopscope.report.source import SourceInfo
from flopscope.sources._config import parse_config
from flopscope.sources._factory import (
    PREFIXES,
    SOURCE_FORMS,
    check_factory_source,
    load_factory,
)
from flopscope.sources._hf import DEFAULT_SEQ_LEN, check_hf_model_type, check_hf_spec, load_hf
from flopscope.sources._inputs import (
    DTYPES,
    MAX_SIZE,
    InputSpec,
    cast_floating,
    check_fits,
    describe,
    make_inputs,
    parse_dtype,
    parse_input,
    rebatch,
)
from flopscope.sources._model import LoadedModel
from flopscope.sources._timm import check_timm_name, load_timm
from flopscope.sources._torchvision import check_torchvision_name, load_torchvision

__all__ = [
    "DEFAULT_SEQ_LEN",
    "DTYPES",
    "PREFIXES",
    "SOURCE_FORMS",
    "InputSpec",
    "LoadedModel",
    "SourceError",
    "check_library_name",
    "check_source",
    "load_model",
    "named",
    "make_inputs",
    "parse_config",
    "parse_dtype",
    "parse_input",
]


def load_model(
    source: str,
    *,
    inputs: Sequence[InputSpec] | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    config: Mapping[str, Any] | None = None,
    shape_only: bool = False,
    dtype: torch.dtype | str | None = None,
    require_inputs: bool = True,
) -> LoadedModel:
    """Turn a SOURCE string into a model and the inputs of one forward call.

    This is what every ``flopscope`` subcommand uses (``count``, ``zoo``, ``measure``,
    ``validate``); see the module docstring for the forms of ``source``.

    Args:
        source: the SOURCE string.
        inputs: explicit input shapes; they replace the source's default inputs.
        batch: the batch size (first dimension of every input).
        seq_len: sequence length of the token ids of ``hf:`` models (default 128); for other
            sources only together with ``inputs``.
        config: overrides of an ``hf:`` config.
        shape_only: the count will not run arithmetic, so build the model on the ``meta`` device
            where possible (no memory for weights), and make every input a ``meta`` tensor (no
            memory for inputs, whatever their size; a factory's inputs are moved to ``meta``).
        dtype: a floating-point dtype (or its name, ``"float64"``) for the model's floating
            parameters and buffers and for every floating-point input; integer inputs (token ids)
            keep theirs. ``None`` keeps what the source built.
        require_inputs: raise when the source gives no example inputs and ``inputs`` is empty;
            with ``False`` such a model is returned without inputs, for the caller to supply.

    Returns:
        The :class:`LoadedModel`; its ``meta`` records the source and its inputs.

    Raises:
        SourceError: the source, an input, an override or the dtype is wrong, or a size does not
            fit in a tensor (checked before the model is built where the shapes are known); the
            message says what to change.
    """
    if batch is not None and batch < 1:
        raise SourceError(f"batch must be at least 1, not {batch}")
    if seq_len is not None and seq_len < 1:
        raise SourceError(f"seq_len must be at least 1, not {seq_len}")
    for name, size in (("batch", batch), ("seq_len", seq_len)):
        if size is not None and size > MAX_SIZE:
            raise SourceError(f"{name} {size:,} is beyond the largest tensor dimension, "
                              f"{MAX_SIZE:,} (2^63 - 1); use a smaller one")
    for spec in inputs or ():  # before anything is built
        check_fits((batch, *spec.shape[1:]) if batch is not None and spec.shape else spec.shape,
                   spec.dtype, what=f"input {spec}" + (f" at batch {batch:,}" if batch else ""))
    if config and not source.startswith("hf:"):
        raise SourceError(
            f"config overrides apply to hf: sources only, not {source!r}; drop them or use an "
            "hf: source"
        )
    if seq_len is not None and not source.startswith("hf:") and not inputs:
        raise SourceError(
            f"seq_len applies to hf: sources only, not {source!r}; give other models their input "
            "shapes"
        )
    cast = parse_dtype(dtype, floating=True) if dtype is not None else None
    loaded = _load(source, batch=batch, seq_len=seq_len, config=config, shape_only=shape_only)
    args, kwargs = loaded.args, loaded.kwargs
    if shape_only:  # inputs on meta from the start: never real memory, whatever their size
        args, kwargs = tree_map_only(torch.Tensor, meta_input, (args, kwargs))
    if inputs:
        args, kwargs = make_inputs(inputs, batch=batch, shape_only=shape_only), {}
    elif batch is not None and not source.startswith("hf:"):
        args = tuple(rebatch(a, batch) for a in args)
        kwargs = {k: rebatch(v, batch) for k, v in kwargs.items()}
    if require_inputs and not args and not kwargs:
        raise SourceError(
            f"{source!r} gives no example inputs: give their shapes (e.g. 1x3x224x224), or "
            "return (model, inputs) from the factory"
        )
    model = loaded.model
    if cast is not None:
        model = model.to(cast)
        args = tuple(cast_floating(a, cast) for a in args)
        kwargs = {k: cast_floating(v, cast) for k, v in kwargs.items()}
    # what ran: the inputs as made (after --batch and --dtype), never the shapes as typed
    meta = dataclasses.replace(loaded.meta, source=source, inputs=_described(args, kwargs))
    return dataclasses.replace(loaded, model=model, args=args, kwargs=kwargs, source=source,
                               meta=meta)


def named(name: str, args: Sequence[Any], kwargs: Mapping[str, Any], *,
          shape_only: bool = False, source: SourceInfo | None = None
          ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any], SourceInfo | None]:
    """What a library call (``flopscope.count``, ``profile``, ``peak_memory``) given a SOURCE
    string instead of a model runs: the model :func:`load_model` builds, its default inputs
    where the call gives none, and its source facts (the report's ``meta``) unless given.

    Args:
        name: the SOURCE string.
        args: the call's positional arguments for the model.
        kwargs: its keyword arguments for the model.
        shape_only: build on ``meta`` where possible.
        source: source facts the call was given.

    Returns:
        ``(model, args, kwargs, source)``.

    Raises:
        SourceError: what :func:`load_model` refuses.
    """
    given = bool(args or kwargs)
    loaded = load_model(name, shape_only=shape_only, require_inputs=not given)
    meta = loaded.meta
    if given:  # the label says what ran (an Inputs' contents, not "Inputs")
        meta = dataclasses.replace(meta, inputs=_described(*model_arguments(tuple(args), kwargs)))
    else:
        args, kwargs = loaded.args, loaded.kwargs
    return loaded.model, tuple(args), dict(kwargs), source or meta


def model_of(call: str, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *,
             shape_only: bool = False, source: SourceInfo | None = None
             ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any], SourceInfo | None]:
    """A library call's model (``count``, ``profile``, ``peak_memory``): a module as given, a
    SOURCE string built by :func:`named`, anything else refused.

    Args:
        call: the call's name, for the message.
        model: what the call was given as its model.
        args: the call's positional arguments for the model.
        kwargs: its keyword arguments for the model.
        shape_only: build a SOURCE on ``meta`` where possible.
        source: source facts the call was given.

    Returns:
        ``(model, args, kwargs, source)``.

    Raises:
        UsageError: ``model`` is neither a module nor a string.
        SourceError: what :func:`load_model` refuses.
    """
    if isinstance(model, str):
        return named(model, args, kwargs, shape_only=shape_only, source=source)
    if not isinstance(model, nn.Module):
        raise UsageError(f"{call}() takes an nn.Module (or a SOURCE string such as "
                         f"'torchvision:resnet50') as its first argument, not "
                         f"{type(model).__name__}")
    return model, tuple(args), dict(kwargs), source


def _described(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """The inputs of a run as its label shows them (``1x3x224x224``, ``input_ids=1x128:int64``)."""
    return tuple(describe(a) for a in args) + tuple(f"{k}={describe(v)}"
                                                     for k, v in kwargs.items())


def check_library_name(library: str, name: str) -> None:
    """Check that a model library has a model ``name``, without building it: what
    ``load_model(f"{library}:{name}")`` would refuse first.

    Args:
        library: ``"torchvision"``, ``"timm"`` or ``"hf"`` (a transformers model type).
        name: the model name.

    Raises:
        SourceError: the library is missing, or it has no such model (close names suggested).
    """
    if library == "torchvision":
        check_torchvision_name(name)
    elif library == "timm":
        check_timm_name(name)
    elif library == "hf":
        check_hf_model_type(name)
    else:
        raise SourceError(f"unknown model library {library!r}: use torchvision, timm or hf")


def check_source(source: str) -> None:
    """Check what :func:`load_model` would refuse about ``source`` before it builds or imports
    anything, so that a caller can fail in a second before long work (a hardware probe, a
    calibration): its form, a library's model name, an ``hf:`` config file's presence, a
    factory's file. What only building shows (a factory that raises, a config value the model
    rejects) is still found by :func:`load_model`.

    Args:
        source: a SOURCE string (see the module's forms).

    Raises:
        SourceError: a form that is none of the forms, an unknown model name (close names
            suggested), a missing library, config file or factory file.
    """
    for library in ("torchvision", "timm"):
        if source.startswith(f"{library}:"):
            check_library_name(library, source.removeprefix(f"{library}:"))
            return
    if source.startswith("hf:"):
        check_hf_spec(source.removeprefix("hf:"))
    elif ":" in source:
        check_factory_source(source)
    else:
        raise _unknown(source)


def _load(source: str, *, batch: int | None, seq_len: int | None,
          config: Mapping[str, Any] | None, shape_only: bool) -> LoadedModel:
    """The loader family of ``source``: library prefixes first, then ``target:factory``."""
    if source.startswith("torchvision:"):
        return load_torchvision(source.removeprefix("torchvision:"), shape_only=shape_only)
    if source.startswith("timm:"):
        return load_timm(source.removeprefix("timm:"), shape_only=shape_only)
    if source.startswith("hf:"):
        return load_hf(source.removeprefix("hf:"), overrides=config, seq_len=seq_len,
                       batch=batch, shape_only=shape_only)
    if ":" in source:
        return load_factory(source)
    raise _unknown(source)


def _unknown(source: str) -> SourceError:
    return SourceError(f"unknown source {source!r}: use {SOURCE_FORMS}")
