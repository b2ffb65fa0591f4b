"""Errors raised by :mod:`flopscope.measure`."""

from __future__ import annotations

from flopscope.errors import FlopscopeError

__all__ = ["BackendUnavailableError", "MeasureError"]


class MeasureError(FlopscopeError, RuntimeError):
    """A measurement could not be made or its result could not be read."""


class BackendUnavailableError(MeasureError):
    """The requested measurement backend cannot run on this machine (the message says why)."""
