"""The public surface is small, sorted and complete."""

from __future__ import annotations

import inspect

import flopscope


def test_all_is_sorted_and_complete() -> None:
    assert flopscope.__all__ == sorted(flopscope.__all__)
    public = {
        name for name, obj in vars(flopscope).items()
        if not name.startswith("_") and not inspect.ismodule(obj)
    }
    assert public == set(flopscope.__all__)


def test_error_classes_subclass_builtins() -> None:
    assert issubclass(flopscope.RuleError, ValueError)
    assert issubclass(flopscope.UsageError, ValueError)
    assert issubclass(flopscope.ForwardError, RuntimeError)
    assert issubclass(flopscope.StrictModeError, RuntimeError)
    for cls in (flopscope.RuleError, flopscope.UsageError, flopscope.ForwardError,
                flopscope.StrictModeError):
        assert issubclass(cls, flopscope.FlopscopeError)
