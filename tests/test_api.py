"""The public surface is small, sorted and complete."""

from __future__ import annotations

import inspect

import flopscope


def test_all_is_sorted_and_complete() -> None:
    flopscope.count  # noqa: B018  (the public names load on first use; see flopscope/__init__.py)
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


def test_importing_the_package_and_the_cli_does_not_import_torch() -> None:
    """``flopscope --help`` starts fast, and Ctrl-C while torch loads is caught by the entry point."""
    import subprocess
    import sys

    code = ("import sys, flopscope, flopscope.cli; flopscope.cli.build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

