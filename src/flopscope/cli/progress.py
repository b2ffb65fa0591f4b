"""What a long command is doing, shown on stderr while it runs: loading, counting forward and
backward, simulating rank k of n, writing.

Only in a terminal: when stderr is not a TTY (a pipe, a file, a CI log) nothing is shown, and
nothing is ever written to stdout (results, JSON and CSV stay clean). The line is a rich spinner
that disappears when the step is over (transient); warnings printed meanwhile appear above it.

:func:`flopscope.cli.main` makes one :class:`Progress` current while a subcommand runs
(:func:`shown`); subcommands call :func:`say` at each step and :func:`stop` before they write to
stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

__all__ = ["Progress", "say", "shown", "stop"]


class Progress:
    """A one-line status on a terminal console; does nothing without one.

    Args:
        console: the console to show it on (a terminal), or ``None`` to show nothing.
    """

    def __init__(self, console: Console | None) -> None:
        self.console = console if console is not None and console.is_terminal else None
        self._live: Live | None = None
        self._spinner: Spinner | None = None

    def say(self, text: str) -> None:
        """Show ``text`` as what is happening now (replacing what was shown).

        Args:
            text: a few words, e.g. ``"counting forward + backward"``.
        """
        if self.console is None:
            return
        if self._live is None:
            self._spinner = Spinner("dots", text)
            # stdout is never redirected: results must not pass through the status console
            self._live = Live(self._spinner, console=self.console, transient=True,
                              refresh_per_second=8, redirect_stdout=False, redirect_stderr=True)
            self._live.start()
        else:
            assert self._spinner is not None
            self._spinner.update(text=text)
        self._live.refresh()

    def stop(self) -> None:
        """Take the status line away (before anything is written to stdout)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._spinner = None


def _stderr_console() -> Console | None:
    """A console on stderr when stderr is a terminal, else ``None``."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is None or not isatty():
        return None
    return Console(stderr=True)


_CURRENT: list[Progress] = []


@contextmanager
def shown(console: Console | None = None) -> Iterator[Progress]:
    """Make a :class:`Progress` current while the block runs, and take its line away after
    (also when the block raises, before the error is printed).

    Args:
        console: where to show it; default: stderr, if stderr is a terminal.

    Yields:
        The progress.
    """
    progress = Progress(console if console is not None else _stderr_console())
    _CURRENT.append(progress)
    try:
        yield progress
    finally:
        _CURRENT.remove(progress)
        progress.stop()


def say(text: str) -> None:
    """Show ``text`` on the current :class:`Progress` (nothing when there is none).

    Args:
        text: what is happening now.
    """
    if _CURRENT:
        _CURRENT[-1].say(text)


def stop() -> None:
    """Take the current status line away (call before writing to stdout)."""
    if _CURRENT:
        _CURRENT[-1].stop()
