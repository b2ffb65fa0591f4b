"""The flopscope exception tree.

Every error flopscope raises on purpose derives from :class:`FlopscopeError` and, where one fits,
from a builtin too, so ``except ValueError`` in user code keeps working.
"""

from __future__ import annotations

__all__ = [
    "FlopscopeError",
    "ForwardError",
    "RuleError",
    "StrictModeError",
    "UsageError",
]


class FlopscopeError(Exception):
    """Base class of every error raised by flopscope itself."""


class UsageError(FlopscopeError, ValueError):
    """flopscope was called with arguments that cannot work (what was wrong, and what to do)."""


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
