"""Every error and warning flopscope raises on purpose, in one place.

Each error derives from :class:`FlopscopeError` and, where one fits, from a builtin too, so
``except ValueError`` in user code keeps working::

    Exception
     └── FlopscopeError
          ├── UsageError (ValueError)           bad arguments: what was wrong and what to do
          │    └── SourceError                  a SOURCE string, --input or --config is wrong
          ├── DomainError (ValueError)          a formula evaluated outside the sizes it holds for
          ├── RuleError (ValueError)            a rule is malformed, raised, or returned a non-cost
          ├── StrictModeError (RuntimeError)    strict=True and an operator had no rule
          ├── ForwardError (RuntimeError)       the model's own forward raised (module_path says where)
          └── MeasureError (RuntimeError)       a measurement could not be made or read
               └── BackendUnavailableError      the backend cannot run on this machine (says why)

    UserWarning
     └── FlopscopeWarning                       uncounted operators, opaque modules
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "DomainError",
    "FlopscopeError",
    "FlopscopeWarning",
    "ForwardError",
    "MeasureError",
    "RuleError",
    "SourceError",
    "StrictModeError",
    "UsageError",
]


class FlopscopeError(Exception):
    """Base class of every error raised by flopscope itself."""


class UsageError(FlopscopeError, ValueError):
    """flopscope was called with arguments that cannot work (what was wrong, and what to do)."""


class SourceError(UsageError):
    """A model source, an input specification or a config override is wrong; the message says
    what to change."""


class DomainError(FlopscopeError, ValueError):
    """A symbolic report was evaluated at sizes outside the domain it was derived on (a guard
    PyTorch recorded while tracing does not hold there)."""


class RuleError(FlopscopeError, ValueError):
    """A rule is malformed, registered twice, raised, or returned something that is not a cost."""


class StrictModeError(FlopscopeError, RuntimeError):
    """``strict=True`` and an operator ran that no rule covers."""


class ForwardError(FlopscopeError, RuntimeError):
    """The model's own forward raised while flopscope was counting.

    The original exception is chained as ``__cause__``; ``module_path`` names the innermost module
    that was running (``""`` is the root model, ``None`` when no module was running).
    """

    def __init__(self, message: str, *, module_path: str | None) -> None:
        super().__init__(message)
        self.module_path = module_path


class MeasureError(FlopscopeError, RuntimeError):
    """A measurement could not be made or its result could not be read."""


class BackendUnavailableError(MeasureError):
    """The requested measurement backend cannot run on this machine (the message says why)."""


class FlopscopeWarning(UserWarning):
    """Something in a count needs the user's attention (uncounted operators, opaque modules)."""
