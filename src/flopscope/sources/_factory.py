"""``path/to/file.py:factory`` and ``package.module:factory``: import the file or module, call
the factory; it returns a model, or ``(model, inputs)``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from flopscope._text import did_you_mean, one_line
from flopscope.errors import SourceError
from flopscope.execution.inputs import Inputs
from flopscope.sources._model import LoadedModel

__all__ = ["PREFIXES", "SOURCE_FORMS", "check_factory_source", "import_file", "import_module",
           "load_factory"]

PREFIXES = ("torchvision:", "timm:", "hf:")
"""The library prefixes of a SOURCE (anything else with a colon is a factory)."""

SOURCE_FORMS = (
    "torchvision:NAME, timm:NAME, hf:MODEL_TYPE, hf:path/to/config.json, hf:ORG/NAME, "
    "path/to/file.py:factory or package.module:factory"
)
"""Every form of a SOURCE, for messages."""


def load_factory(source: str) -> LoadedModel:
    """Import ``target`` of ``target:factory`` (a ``.py`` file or a dotted module) and call the
    factory (an ``nn.Module`` instance is taken as is).

    Args:
        source: ``path/to/file.py:factory`` or ``package.module:factory``.

    Returns:
        The model, with the inputs the factory returned (none when it returned only a model).

    Raises:
        SourceError: the file or module cannot be imported, the factory is missing (close names
            suggested), is not callable, raises, or returns something that is not a model.
    """
    target, attr = check_factory_source(source)
    module = import_file(target) if _is_path(target) else import_module(target, source)
    fn = getattr(module, attr, None)
    if fn is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        hint = did_you_mean(attr, names) or (
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
                f"factory {target}:{attr}() raised {type(e).__name__}: {one_line(e, 200)}"
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


def check_factory_source(source: str) -> tuple[str, str]:
    """What :func:`load_factory` refuses before it imports anything: a SOURCE without a target
    or a factory name, a file that does not exist.

    Args:
        source: ``path/to/file.py:factory`` or ``package.module:factory``.

    Returns:
        ``(target, factory name)``.

    Raises:
        SourceError: one of those.
    """
    target, _, attr = source.rpartition(":")
    if not target or not attr:
        raise SourceError(f"malformed source {source!r}: use {SOURCE_FORMS}")
    if _is_path(target):
        _check_file(target)
    return target, attr


def _is_path(target: str) -> bool:
    """Whether a factory's target is a file's path, not a dotted module."""
    return target.endswith(".py") or "/" in target or "\\" in target


def _check_file(target: str) -> None:
    if not Path(target).is_file():
        raise SourceError(f"file {target!r} does not exist; give path/to/file.py:factory")


def import_file(target: str) -> ModuleType:
    """Import a Python file by path (its folder is on ``sys.path`` while it runs, so it can import
    its neighbours).

    Args:
        target: the file's path.

    Returns:
        The module (registered in ``sys.modules`` under a name derived from its path).

    Raises:
        SourceError: the file does not exist, is not Python, or raises when imported.
    """
    _check_file(target)
    path = Path(target)
    name = f"flopscope_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SourceError(f"cannot import {target!r}: it is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.parent.resolve())
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise SourceError(f"importing {target!r} raised {type(e).__name__}: {one_line(e, 200)}"
                          ) from e
    finally:
        sys.path.remove(folder)
    return module


def import_module(target: str, source: str) -> ModuleType:
    """Import a dotted module as ``python -m`` would (the working directory importable).

    Args:
        target: the module name.
        source: the whole SOURCE, for messages.

    Returns:
        The module.

    Raises:
        SourceError: the module is not found (a bare word is taken as a misspelt prefix, with
            close prefixes suggested), or it raises when imported.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):
            if "." not in target:
                prefix = target + ":"
                raise SourceError(
                    f"unknown source prefix {prefix!r}{did_you_mean(prefix, PREFIXES)}: "
                    f"use {SOURCE_FORMS}"
                ) from None
            raise SourceError(
                f"cannot import module {target!r} for {source!r}: no module named {e.name!r}; "
                "check the name, or give path/to/file.py:factory"
            ) from None
        raise SourceError(f"importing {target!r} raised ModuleNotFoundError: {e}") from e
    except Exception as e:
        raise SourceError(f"importing {target!r} raised {type(e).__name__}: {one_line(e, 200)}"
                          ) from e
